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
                 largest over the prompts (every other person, not their average, must stay put)

(sampled from π_old, the first is an unbiased estimate of KL(π_old ‖ π_new) over whole completions
of the target prompt; by Pinsker, no event's probability, malformed mass included, moves by more
than sqrt(KL/2)). If either exceeds its limit δ, the step is halved, θ = θ_old + ½(θ_new − θ_old),
and measured again (backtracking line search, as in TRPO, Schulman et al. 2015, §6), at most
`max_halvings` times; a step still too large is rejected (θ = θ_old). The optimiser's state keeps
the update it computed. It uses no ground truth: only the policy's own distributions.

Written once for one model or P models' stacked weights (model.Weights with a leading dim): every
tensor may carry leading member dims (the probe logits' dims before (N, T, V)); each member is
halved until its own probes allow it, and a member within its limits keeps its step while the others
go on halving. On the CPU each member's figures are its single run's to the bit.
"""

from __future__ import annotations

import math

import torch

from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.lm.sampling import Generation
from minigrpo.objectives.kl import exact


def step_probes(cfg, rollout, anchor_rows=None) -> list:
    """What a step's trust region measures, as StepGuard takes it [(name, rows, δ, weights, group)]:
    the step's rollout (a Generation, or P runs' stacked rows) within --trust-region, and the anchor
    rows within --trust-region-anchor (anchor_rows() -> (rows, weights, group); None: no anchor);
    a limit of 0 is not measured."""
    out = [("rollout", rollout, cfg.trust_region, None, None)] if cfg.trust_region > 0 else []
    if anchor_rows is not None and cfg.trust_region_anchor > 0:
        rows, weights, group = anchor_rows()
        out.append(("anchor", rows, cfg.trust_region_anchor, weights, group))
    return out


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
    groups: int | None = None,
) -> torch.Tensor:
    """Σ_t exact KL(old ‖ new) over each row's valid completion positions, the weighted mean over
    the rows of each group (group (..., N) long, e.g. one per off-target person; None: one group;
    weights (..., N), None: equal), and the largest group mean: (..., N, T, V) x2, (..., N, T) ->
    (...), each leading index (a member) on its own. groups: the number of groups, if known
    (group.max() + 1 by default: a read of the device); a member with fewer has empty groups of
    mean 0. The group sums are one index_add_ over the members' groups side by side: on the CPU,
    each member's sums in its single run's order."""
    zero = torch.zeros((), device=mask.device)
    kl = torch.where(mask, exact(old_logits, new_logits), zero).sum(-1)  # (..., N)
    lead = kl.shape[:-1]
    w = torch.ones_like(kl) if weights is None else weights.to(kl.dtype).expand_as(kl)
    g = torch.zeros(kl.shape, dtype=torch.long, device=kl.device) if group is None else group
    n = groups if groups is not None else 1 if group is None else int(group.max()) + 1
    # member m's group j: slot m·n + j
    g = (g + n * torch.arange(math.prod(lead), device=kl.device).view(*lead, 1)).flatten()
    num = torch.zeros(math.prod(lead) * n, dtype=kl.dtype, device=kl.device)
    num = num.index_add_(0, g, (kl * w).flatten())
    den = torch.zeros_like(num).index_add_(0, g, w.flatten())
    return (num / den.clamp(min=1e-30)).view(*lead, n).amax(-1)


class StepGuard:
    """Snapshot before a step (`StepGuard(policy, probes)`), then `enforce(policy)` after it.

    policy: anything with `parameters()`, a GPT or stacked weights (P, ...). probes: [(name, rows,
    limit, weights, group)]: each limit the largest allowed sequence-level KL in nats, checked on
    the worst group of rows (the anchor: one group per person; `sequence_kl`). forward(policy,
    rows) -> the probe's logits (..., N, T, V) of a Generation (P stacked runs': (P, N, ...) rows,
    weights and group then (P, N) where each run's rows are its own)."""

    def __init__(
        self,
        policy,
        probes: list[tuple],
        max_halvings: int = 5,
        previous: "StepGuard | None" = None,
        forward=_logits,
    ):
        self.forward, self.max_halvings = forward, max_halvings
        self.probes = [
            (name, rows, limit, _snapshot(previous, policy, name, rows, forward), (w, g))
            for name, rows, limit, w, g in probes
        ]
        self.lead = self.probes[0][3].shape[:-3]  # the members' dims: () for one model
        self.old = _flat(policy.parameters(), self.lead)  # the weights before the update
        self.groups = {name: _groups(previous, name, g) for name, _, _, _, (_, g) in self.probes}
        self.last: dict = {}  # each probe's logits at the weights last measured
        # after enforce: (the weights' stamp, {probe name: (its rows, its logits)})
        self.final = None

    def _kls(self, policy) -> tuple[dict, torch.Tensor]:
        """-> ({probe: (...) KL}, (...) bool: every probe within its limit)."""
        self.last = {name: self.forward(policy, rows) for name, rows, _, _, _ in self.probes}
        kls = {
            name: sequence_kl(old, self.last[name], rows.completion_mask, *wg, self.groups[name][1])
            for name, rows, _, old, wg in self.probes
        }
        # compared in float64, as the numbers they are
        ok = [kls[name].double() <= limit for name, _, limit, _, _ in self.probes]
        return kls, torch.stack(ok).all(0)

    @torch.no_grad()
    def enforce(self, policy) -> dict[str, torch.Tensor]:
        """Shrink (or reject) the step just taken until every probe's KL is within its limit.
        -> {'tr_scale': share of the step kept (1 = all, 0 = rejected), 'tr_kl_<probe>': KL kept},
        each (...) (a 0-dim tensor for one model)."""
        params = list(policy.parameters())
        new = now = _flat(params, self.lead)  # the update's weights, and the weights now
        kls, ok = self._kls(policy)
        scale = torch.ones(ok.shape, device=ok.device)
        for _ in range(self.max_halvings):
            if bool(ok.all()):
                break
            # the members within their limits keep their step
            scale = torch.where(ok, scale, scale / 2)
            now = torch.where(ok[..., None], now, self.old + scale[..., None] * (new - self.old))
            _write(params, now, self.lead)
            again, within = self._kls(policy)
            kls = {name: torch.where(ok, kls[name], again[name]) for name in kls}
            ok = ok | within
        if not bool(ok.all()):  # still too large after every halving: the step is rejected
            _write(params, torch.where(ok[..., None], now, self.old), self.lead)
            scale = torch.where(ok, scale, 0.0)
            kls = {name: torch.where(ok, v, 0.0) for name, v in kls.items()}
            self.last = {
                name: torch.where(ok[..., None, None, None], self.last[name], old)
                for name, _, _, old, _ in self.probes
            }
        self.final = (
            _stamp(policy),
            {name: (rows, self.last[name]) for name, rows, _, _, _ in self.probes},
        )
        return {"tr_scale": scale, **{f"tr_kl_{name}": v for name, v in kls.items()}}


def _flat(params, lead: tuple) -> torch.Tensor:
    """The weights as one row per member (..., n): arithmetic on all of them in one call."""
    return torch.cat([p.detach().reshape(*lead, -1) for p in params], -1)


def _write(params: list[torch.Tensor], flat: torch.Tensor, lead: tuple) -> None:
    """Copy the rows (..., n) of _flat back into the weights."""
    sizes = [p.shape[len(lead) :].numel() for p in params]
    for p, x in zip(params, flat.split(sizes, -1)):
        p.copy_(x.view(p.shape))


def _stamp(policy) -> tuple:
    """Which tensors hold the weights and their in-place versions: any change to the weights (an
    optimiser step, a copy_, slices of stacked weights dropped) changes it."""
    return tuple((id(p), p._version) for p in policy.parameters())


def _groups(previous: StepGuard | None, name: str, group: torch.Tensor | None) -> tuple:
    """Probe `name`'s (group, its number of groups): the previous step's where its group was this
    very tensor (the anchor probe's: the same each step), so read from the device once."""
    if group is None:
        return None, 1
    if previous is not None and previous.groups.get(name, (None,))[0] is group:
        return previous.groups[name]
    return group, int(group.max()) + 1


@torch.no_grad()
def _snapshot(previous: StepGuard | None, policy, name: str, rows, forward) -> torch.Tensor:
    """The policy's logits on a probe now: the previous step's final logits of the same rows if the
    weights have not changed since, else one forward. The anchor probe is the same rows every step,
    so its snapshot is the last step's final measurement (bit for bit: the same forward of the same
    weights): one no-grad forward of the anchor rows saved per step."""
    if previous is not None and previous.final is not None and previous.final[0] == _stamp(policy):
        old_rows, logits = previous.final[1].get(name, (None, None))
        if old_rows is rows:
            return logits
    return forward(policy, rows)
