"""P members' optimiser (lm/optim.AdamW over their stacked weights, a count and a rate per member):
members leaving, and every member's rl/run_state.Run.clip_and_step at once.
"""

from __future__ import annotations

import torch

from minigrpo.lm.optim import AdamW, clip_grad_norm
from minigrpo.population.stacked import Stack, select


@torch.no_grad()
def keep(stacks: list[Stack], opt: AdamW, members: list[int]) -> None:
    """Only `members` (in this order) from now on, in the stacks (the optimiser's parameters, in its
    order) and the optimiser's state."""
    index = torch.tensor(members, device=opt.params[0].device)
    opt.t = opt.t[torch.tensor(members)]
    lr = opt.param_groups[0]["lr"]
    if torch.is_tensor(lr):
        opt.param_groups[0]["lr"] = lr[torch.tensor(members)]
    for stack in stacks:
        stack.w = {name: select(w.detach(), index).requires_grad_() for name, w in stack.w.items()}
    opt.params = [w for stack in stacks for w in stack.parameters()]
    opt.m = [select(m, index) for m in opt.m]
    opt.v = [select(v, index) for v in opt.v]


def clip_and_step(
    opt: AdamW, loss: torch.Tensor, grad_clip: float, active: torch.Tensor | None = None
) -> torch.Tensor:
    """rl/run_state.Run.clip_and_step of every member: one backward of the losses (P,) summed, each
    member's gradient clipped on its own, one AdamW step of the members `active` ((P,) bool; None:
    all) -> (P,) gradient norms."""
    opt.zero_grad()
    loss.sum().backward()
    norm = clip_grad_norm(opt.params, grad_clip if grad_clip > 0 else float("inf"), per_slice=True)
    opt.step(active)
    return norm
