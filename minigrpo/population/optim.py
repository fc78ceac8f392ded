"""What a population adds to its optimiser: members leave. P members' optimiser is lm/optim.AdamW
over their stacked weights (P, ...), a step count and a learning rate per member (a member whose
step is skipped, --skip-equal-groups, keeps its weights, moments and count); the gradient clip is
lm/optim.clip_grad_norm(..., per_slice=True) (a member's checkpoint: checkpoint.member_trained).

    opt = AdamW(params, lr, t=torch.zeros(P, dtype=torch.long))
    keep([stack], opt, members)     # only these members from now on (the others have ended)
    norms = clip_and_step(opt, loss, grad_clip)  # every member's rl/run_state.Run.clip_and_step
"""

from __future__ import annotations

import torch

from minigrpo.lm.optim import AdamW, clip_grad_norm
from minigrpo.population.stacked import Stack, select


@torch.no_grad()
def keep(stacks: list[Stack], opt: AdamW, members: list[int]) -> None:
    """Drop every member not in `members` (in this order) from the stacked weights (the stacks whose
    parameters the optimiser holds, in its order) and the optimiser's state."""
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
    """rl/run_state.Run.clip_and_step of every member: one backward of the members' losses (P,)
    summed (each reaches only its own slices of the weights), each member's gradient clipped on its
    own, one AdamW step (of the members `active`, (P,) bool; None: all) -> (P,) gradient norms (a
    member whose norm is not finite ends with its single run's error: lockstep.py)."""
    opt.zero_grad()
    loss.sum().backward()
    norm = clip_grad_norm(opt.params, grad_clip if grad_clip > 0 else float("inf"), per_slice=True)
    opt.step(active)
    return norm
