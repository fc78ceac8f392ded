"""The per-step trust region of rl/trust_region.py for P members at once: each member's step halved
until its own probes' KL is within the limits (or rejected), the members' scales a (P,) tensor.

    guard = Guard(stack, probes, previous)  # before the update: the weights and each probe's logits
    stats = guard.enforce(stack)            # after it -> {"tr_scale": (P,), "tr_kl_<probe>": (P,)}

probes: [(name, rows (population/rows.Rows), limit, weights (N,) or None, group (N,) long or None)],
the single run's probes with each member's rows (weights and group (P, N) where each member's rows
are its own: --person). Per member it computes what StepGuard computes: the same halvings, the same
rejection after `max_halvings`, the KLs of rl/trust_region.sequence_kl (the group means here a
product with the groups' one-hot matrix; the same sums in another order). As StepGuard, a probe
whose rows are the previous step's (the anchor's: the same Rows each step) takes that step's final
logits if the weights have not changed since.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minigrpo.objectives.kl import exact
from minigrpo.population.stacked import Stack
from minigrpo.rl.trust_region import carried


@torch.no_grad()
def sequence_kls(
    old_logits, new_logits, mask, weights=None, group=None, onehot=None
) -> torch.Tensor:
    """rl/trust_region.sequence_kl of each member: (P, N, T, V) x2, (P, N, T) bool, weights (N,),
    group (N,) (or (P, N) each: each member's own rows) -> (P,) the largest group's weighted mean
    over its rows of Σ_t KL(old ‖ new). onehot: F.one_hot(group) (N or P × N, groups) if made
    already (its width, group.max() + 1, is a read of the device that waits for the queued
    kernels)."""
    kl = torch.where(mask, exact(old_logits, new_logits), 0.0).sum(-1)  # (P, N)
    w = (
        torch.ones(kl.size(1), dtype=kl.dtype, device=kl.device)
        if weights is None
        else weights.to(kl.dtype)
    )
    if onehot is None:
        onehot = kl.new_ones(kl.size(1), 1) if group is None else F.one_hot(group)
    onehot = onehot.to(kl.dtype)
    if w.dim() == 2:  # each member's own rows, weights and groups: (P, 1, N) @ (P, N, groups)
        return (
            ((kl * w)[:, None] @ onehot)[:, 0] / (w[:, None] @ onehot)[:, 0].clamp(min=1e-30)
        ).amax(-1)
    return ((kl * w) @ onehot / (w @ onehot).clamp(min=1e-30)).amax(-1)


class Guard:
    def __init__(
        self,
        stack: Stack,
        probes: list[tuple],
        previous: "Guard | None" = None,
        max_halvings: int = 5,
    ):
        self.old = _flat(stack.parameters())  # the weights before the update
        self.probes = [
            (
                name,
                rows,
                limit,
                _snapshot(previous, stack, name, rows),
                (w, g, _one_hot(previous, name, g)),
            )
            for name, rows, limit, w, g in probes
        ]
        self.max_halvings = max_halvings
        self.last: dict = {}  # each probe's logits at the weights last measured
        # after enforce: (the weights' stamp, {probe name: (its rows, each member's logits)})
        self.final = None

    @staticmethod
    @torch.no_grad()
    def _logits(stack: Stack, rows) -> torch.Tensor:
        return rows.logprobs(stack)[1]

    def _kls(self, stack: Stack) -> tuple[dict, torch.Tensor]:
        """-> ({probe: (P,) KL}, (P,) bool: every probe within its limit)."""
        self.last = {name: self._logits(stack, rows) for name, rows, _, _, _ in self.probes}
        kls = {
            name: sequence_kls(old, self.last[name], rows.completion_mask, *wg)
            for name, rows, _, old, wg in self.probes
        }
        within = torch.stack([kls[name] <= limit for name, _, limit, _, _ in self.probes]).all(0)
        return kls, within

    @torch.no_grad()
    def enforce(self, stack: Stack) -> dict[str, torch.Tensor]:
        params = stack.parameters()
        new = now = _flat(params)  # the update's weights, and the weights now
        kls, ok = self._kls(stack)
        scale = torch.ones(ok.shape, device=ok.device)
        for _ in range(self.max_halvings):
            if bool(ok.all()):
                break
            # the members within their limits keep their step
            scale = torch.where(ok, scale, scale / 2)
            now = torch.where(ok[:, None], now, self.old + scale[:, None] * (new - self.old))
            _write(params, now)
            again, within = self._kls(stack)
            kls = {name: torch.where(ok, kls[name], again[name]) for name in kls}
            ok = ok | within
        if not bool(ok.all()):  # still too large after every halving: the step is rejected
            _write(params, torch.where(ok[:, None], now, self.old))
            scale = torch.where(ok, scale, 0.0)
            kls = {name: torch.where(ok, v, 0.0) for name, v in kls.items()}
            self.last = {
                name: torch.where(ok.view(-1, 1, 1, 1), self.last[name], old)
                for name, _, _, old, _ in self.probes
            }
        self.final = (
            _stamp(stack),
            {name: (rows, self.last[name]) for name, rows, _, _, _ in self.probes},
        )
        return {"tr_scale": scale, **{f"tr_kl_{name}": v for name, v in kls.items()}}


def _flat(params: list[torch.Tensor]) -> torch.Tensor:
    """The members' weights (P, ...) each as one row (P, n): arithmetic on all of them in one call,
    not one a tensor."""
    return torch.cat([p.detach().reshape(p.size(0), -1) for p in params], 1)


def _write(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy the rows (P, n) of _flat back into the weights."""
    for p, x in zip(params, flat.split([p[0].numel() for p in params], 1)):
        p.copy_(x.view(p.shape))


def _stamp(stack: Stack) -> tuple:
    """Which tensors hold the weights and their in-place versions: any step, copy or change of
    members changes it."""
    return tuple((id(w), w._version) for w in stack.parameters())


def _one_hot(previous: Guard | None, name: str, group: torch.Tensor | None) -> torch.Tensor | None:
    """Probe `name`'s F.one_hot(group) (N, groups): the previous step's where its group was this
    tensor (the anchor probe's: the same each step), so made once; None for one group."""
    if group is None:
        return None
    for n, _, _, _, (_, g, onehot) in previous.probes if previous is not None else []:
        if n == name and g is group:
            return onehot
    return F.one_hot(group)


def _snapshot(previous: Guard | None, stack: Stack, name: str, rows) -> torch.Tensor:
    """Every member's logits on a probe now: the previous step's final logits of the same rows if
    the weights have not changed since (rl/trust_region._snapshot: bit for bit the same forward),
    else one forward."""
    logits = carried(previous, _stamp(stack), name, rows)
    return Guard._logits(stack, rows) if logits is None else logits
