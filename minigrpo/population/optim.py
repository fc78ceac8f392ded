"""The optimiser of P members whose weights are stacked (P, ...): lm/optim.AdamW's arithmetic on the
stacked tensors, so each member's own AdamW step for step, with a step count per member (a member
whose step is skipped, --skip-equal-groups, keeps its weights, moments and count); the gradient clip
per member (what a member's checkpoint holds of it: population/checkpoint.MemberOptimizer).

    opt = MembersAdamW(stack.parameters(), lr)
    opt.set_rates(rates)                            # each member's learning rate this step (one
                                                    # number if alike)
    norms = clip_grad_norms(opt.params, max_norm)   # (P,) each member's norm before its clip
    opt.step(active)                                # active (P,) bool: the members that take this
                                                    # step
    keep([stack], opt, members)                     # only these members from now on (the others
                                                    # have ended)
"""

from __future__ import annotations

import torch

from minigrpo.lm.optim import AdamW
from minigrpo.population.stacked import Stack


@torch.no_grad()
def clip_grad_norms(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """lm/optim.clip_grad_norm for each member: its gradients' L2 norm as one vector, g ← g·min(1,
    max_norm / (‖g‖ + 1e-6)) -> (P,) the norms before the clip (NaN where a member's gradient holds
    one: its own only)."""
    grads = [p.grad for p in params if p.grad is not None]
    P = grads[0].size(0)
    norm = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g.reshape(P, -1), dim=1) for g in grads]), dim=0
    )
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)  # a NaN stays NaN, as in the single clip
    for g in grads:
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))
    return norm


class MembersAdamW(AdamW):
    """lm/optim.AdamW over stacked tensors, t a step count per member."""

    def __init__(self, params, lr: float, **kw):
        super().__init__(params, lr, **kw)
        # on the CPU: bias corrections in float64
        self.t = torch.zeros(self.params[0].size(0), dtype=torch.long)

    def set_rates(self, rates: list[float]) -> None:
        """Each member's learning rate this step: one number where they are alike (AdamW's own step
        can then take it), else a (P,) float64 tensor (the step below, member by member)."""
        self.param_groups[0]["lr"] = (
            rates[0] if len(set(rates)) == 1 else torch.tensor(rates, dtype=torch.float64)
        )

    def rate(self, p: int) -> float:
        """Member p's learning rate this step (its checkpoint's)."""
        lr = self.param_groups[0]["lr"]
        return float(lr[p]) if torch.is_tensor(lr) else lr

    @torch.no_grad()
    def step(self, active: torch.Tensor | None = None) -> None:
        """AdamW's step for the members in `active` (P,) bool (None: all); the others keep weights
        and state."""
        on = torch.ones_like(self.t, dtype=torch.bool) if active is None else active.cpu()
        alike = not torch.is_tensor(self.param_groups[0]["lr"])  # one learning rate for all
        # one count too: AdamW's own step
        if alike and bool(on.all()) and bool((self.t == self.t[0]).all()):
            # (its foreach calls: a few for all tensors, none per tensor)
            counts, self.t = self.t, int(self.t[0])
            try:
                super().step()
            finally:
                self.t = counts + 1
            return
        lr, (b1, b2) = self.param_groups[0]["lr"], self.betas
        self.t += on.long()
        t = self.t.double().clamp(min=1)
        device, P = self.params[0].device, self.t.numel()
        # float64 as the single step's, then its float32 rounding
        bias2 = (1 - b2**t).float().to(device)
        rate = (lr / (1 - b1**t)).float().to(device)  # lr / (1 − β1^t)
        shrink = 1 - lr * self.weight_decay  # θ ← θ − lr·λ·θ: a number, or each member's
        shrink = shrink if alike else shrink.float().to(device)
        go = on.to(device)
        for p, m, v in zip(self.params, self.m, self.v):
            if p.grad is None:
                continue
            shape = (P,) + (1,) * (p.dim() - 1)
            keep = go.view(shape)
            g = p.grad
            m.copy_(torch.where(keep, m * b1 + g * (1 - b1), m))  # m ← β1·m + (1−β1)·g
            # v ← β2·v + (1−β2)·g², addcmul's order
            v.copy_(torch.where(keep, v * b2 + g * (1 - b2) * g, v))
            if self.weight_decay:
                p.copy_(torch.where(keep, p * (shrink if alike else shrink.view(shape)), p))
            denom = (v / bias2.view(shape)).sqrt_().add_(self.eps)
            p.copy_(torch.where(keep, p - rate.view(shape) * (m / denom), p))


@torch.no_grad()
def keep(stacks: list[Stack], opt: MembersAdamW, members: list[int]) -> None:
    """Drop every member not in `members` (in this order) from the stacked weights (the stacks whose
    parameters the optimiser holds, in its order) and the optimiser's state."""
    index = torch.tensor(members, device=opt.params[0].device)
    opt.t = opt.t[torch.tensor(members)]
    for stack in stacks:
        stack.w = {
            name: w.detach().index_select(0, index).requires_grad_() for name, w in stack.w.items()
        }
    opt.params = [w for stack in stacks for w in stack.parameters()]
    opt.m = [m.index_select(0, index) for m in opt.m]
    opt.v = [v.index_select(0, index) for v in opt.v]
