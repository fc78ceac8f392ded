"""The optimiser of P members whose weights are stacked (P, ...): lm/optim.AdamW itself (its arithmetic is
elementwise, so on stacked tensors it is each member's own AdamW, step for step), the gradient clip per member, and
what a member's checkpoint holds of it.

    norms = clip_grad_norms(opt.params, max_norm)   # (P,) each member's norm before its clip
    MemberOptimizer(opt, p).state_dict()            # member p's AdamW state, as its single run saves it
    keep(stack, opt, members)                       # only these members from now on (the others have ended)
"""

from __future__ import annotations

import torch

from minigrpo.lm.optim import AdamW
from minigrpo.population.stacked import Stack


@torch.no_grad()
def clip_grad_norms(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """lm/optim.clip_grad_norm for each member: its gradients' L2 norm as one vector, g ← g·min(1, max_norm /
    (‖g‖ + 1e-6)) -> (P,) the norms before the clip (NaN where a member's gradient holds one: its own only)."""
    grads = [p.grad for p in params if p.grad is not None]
    P = grads[0].size(0)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.reshape(P, -1), dim=1) for g in grads]),
                                    dim=0)
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)  # a NaN stays NaN, as in the single clip
    for g in grads:
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))
    return norm


class MemberOptimizer:
    """Member p's view of the stacked AdamW, for its checkpoint (rl/loop.Run.save): lm/optim.AdamW.state_dict's
    format, holding copies of its own slices only."""

    def __init__(self, opt: AdamW, p: int):
        self.opt, self.p = opt, p

    def state_dict(self) -> dict:
        o, p = self.opt, self.p
        return {"t": o.t, "m": [m[p].cpu().clone() for m in o.m], "v": [v[p].cpu().clone() for v in o.v],
                "lr": o.param_groups[0]["lr"]}


@torch.no_grad()
def keep(stack: Stack, opt: AdamW, members: list[int]) -> None:
    """Drop every member not in `members` (in this order) from the stacked weights and the optimiser's state."""
    index = torch.tensor(members, device=opt.params[0].device)
    stack.w = {name: w.detach().index_select(0, index).requires_grad_() for name, w in stack.w.items()}
    opt.params = stack.parameters()
    opt.m = [m.index_select(0, index) for m in opt.m]
    opt.v = [v.index_select(0, index) for v in opt.v]
