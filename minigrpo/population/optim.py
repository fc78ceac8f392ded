"""What a population adds to its optimiser: members leave. P members' optimiser is lm/optim.AdamW
over their stacked weights (P, ...), a step count and a learning rate per member (a member whose
step is skipped, --skip-equal-groups, keeps its weights, moments and count); the gradient clip is
lm/optim.clip_grad_norm(..., per_slice=True) (a member's checkpoint: checkpoint.MemberOptimizer).

    opt = AdamW(params, lr, t=torch.zeros(P, dtype=torch.long))
    keep([stack], opt, members)     # only these members from now on (the others have ended)
"""

from __future__ import annotations

import torch

from minigrpo.lm.optim import AdamW
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
