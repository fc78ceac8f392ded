"""A per-step trust region: no RL step may move the policy further than δ, measured exactly.

Why: a run is judged at every step, not only at its end, and plain GRPO steps now and then jump (a
target's probability collapsing for a step, mass moving onto malformed lines; docs/experiments.md):
the run recovers a few steps later, but the model was broken in between.
These jumps come from Adam meeting a rare large gradient after many small ones (a failure in an
otherwise all-success batch), which no loss term sees coming.

What: after the algorithm's update of a step (all μ inner updates), measure the exact sequence-level
KL between the policy before and after the step on two probe sets a real trainer has too:

    KL_rollout = mean over the step's sampled completions y of Σ_t KL(π_old(·|y_<t) ‖ π_new(·|y_<t))
    KL_anchor  = the same on the anchor sequences of each off-target prompt (rl/preserve.py), the
               largest
                 over the prompts (every other person, not their average, must stay put)

(sampled from π_old, the first is an unbiased estimate of KL(π_old ‖ π_new) over whole completions
of the target prompt; by Pinsker, no event's probability, malformed mass included, moves by more
than sqrt(KL/2)). If either exceeds its limit δ, the step is halved, θ = θ_old + ½(θ_new − θ_old),
and measured again (backtracking line search, as in TRPO, Schulman et al. 2015, §6), at most
`max_halvings` times; a step still too large is rejected (θ = θ_old). The optimiser's state keeps
the update it computed. It uses no ground truth: only the policy's own distributions.
"""

from __future__ import annotations

import torch

from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.lm.sampling import Generation
from minigrpo.objectives.kl import exact


@torch.no_grad()
def _logits(policy, gen: Generation) -> torch.Tensor:
    _, logits = generation_logprobs(policy, gen, return_logits=True)
    return logits


@torch.no_grad()
def sequence_kl(
    old_logits: torch.Tensor,
    new_logits: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor | None = None,
    group: torch.Tensor | None = None,
) -> float:
    """Σ_t exact KL(old ‖ new) over each row's valid completion positions, the weighted mean over
    the rows of each group (group (N,) long, e.g. one per off-target person; None: one group;
    weights (N,), None: equal), and the largest group mean returned: (N, T, V) x2, (N, T) ->
    float."""
    # (N,)
    kl = torch.where(mask, exact(old_logits, new_logits), torch.zeros((), device=mask.device)).sum(
        1
    )
    w = torch.ones_like(kl) if weights is None else weights.to(kl.dtype)
    g = torch.zeros(kl.shape, dtype=torch.long, device=kl.device) if group is None else group
    n = int(g.max()) + 1
    num = torch.zeros(n, dtype=kl.dtype, device=kl.device).index_add_(0, g, kl * w)
    den = torch.zeros(n, dtype=kl.dtype, device=kl.device).index_add_(0, g, w)
    return (num / den.clamp(min=1e-30)).max().item()


class StepGuard:
    """Snapshot before a step (`StepGuard(policy, probes)`), then `enforce(policy)` after it.

    probes: [(name, generation, limit, weights, group)]: each limit the largest allowed
    sequence-level KL in nats, checked on the worst group of rows (the anchor: one group per person;
    `sequence_kl`)."""

    def __init__(
        self,
        policy,
        probes: list[tuple],
        max_halvings: int = 5,
        previous: "StepGuard | None" = None,
    ):
        self.params = [p.detach().clone() for p in policy.parameters()]
        self.probes = [
            (name, gen, limit, _snapshot(previous, policy, name, gen), (w, g))
            for name, gen, limit, w, g in probes
        ]
        self.max_halvings = max_halvings
        # after enforce: (the weights' versions, {probe name: (its generation, its logits)})
        self.final = None

    def _kls(self, policy) -> dict[str, float]:
        self.last = {name: _logits(policy, gen) for name, gen, _, _, _ in self.probes}
        return {
            name: sequence_kl(old, self.last[name], gen.completion_mask, *wg)
            for name, gen, _, old, wg in self.probes
        }

    @torch.no_grad()
    def enforce(self, policy) -> dict:
        """Shrink (or reject) the step just taken until every probe's KL is within its limit.
        -> {'tr_scale': share of the step kept (1 = all, 0 = rejected), 'tr_kl_<probe>': KL
        kept}."""
        params = list(policy.parameters())
        new = [p.detach().clone() for p in params]
        scale, kls = 1.0, self._kls(policy)
        for _ in range(self.max_halvings):
            if all(kls[name] <= limit for name, _, limit, _, _ in self.probes):
                break
            scale /= 2
            for p, old, upd in zip(params, self.params, new):
                p.copy_(old + scale * (upd - old))
            kls = self._kls(policy)
        else:
            if not all(kls[name] <= limit for name, _, limit, _, _ in self.probes):
                for p, old in zip(params, self.params):
                    p.copy_(old)
                scale, kls = 0.0, {name: 0.0 for name in kls}
                self.last = {name: old for name, _, _, old, _ in self.probes}
        self.final = (
            _versions(policy),
            {name: (gen, self.last[name]) for name, gen, _, _, _ in self.probes},
        )
        return {"tr_scale": scale, **{f"tr_kl_{name}": v for name, v in kls.items()}}


def _versions(policy) -> tuple[int, ...]:
    """The in-place version counter of every weight: any change to the weights (an optimiser step, a
    copy_) bumps one."""
    return tuple(p._version for p in policy.parameters())


def _snapshot(previous: StepGuard | None, policy, name: str, gen: Generation) -> torch.Tensor:
    """The policy's logits on a probe now: the previous step's final logits of the same rows if the
    weights have not changed since, else one forward. The anchor probe is the same rows every step,
    so its snapshot is the last step's final measurement (bit for bit: the same forward of the same
    weights): one no-grad forward of the anchor rows saved per step."""
    logits = carried(previous, _versions(policy), name, gen)
    return _logits(policy, gen) if logits is None else logits


def carried(previous, stamp: tuple, name: str, rows) -> torch.Tensor | None:
    """A trust region's final logits of probe `name` (its `final`: (the weights' stamp, {name:
    (rows, logits)})) if they were measured on these very rows at weights whose stamp is `stamp`,
    else None."""
    if previous is not None and previous.final is not None and previous.final[0] == stamp:
        old_rows, logits = previous.final[1].get(name, (None, None))
        if old_rows is rows:
            return logits
    return None
