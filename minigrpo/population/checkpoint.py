"""A lockstep member's checkpoint (rl/checkpoints.RunCheckpoints.trained's contents) from its
population's stacked tensors, copied to the host once for all members (a GPU's copy waits for the
kernels queued before it): each member's file is its single run's, byte for byte.

    copies = host_copies(stack, ref, opt, critics)            # each step's; nothing copied yet
    trained = member_trained(copies, p, member, update, opt)  # member p's Run.trained
"""

from __future__ import annotations

import torch

from minigrpo.lm.optim import adamw_state
from minigrpo.rl.checkpoints import Trained


class HostCopies:
    """Stacked tensors (P, ...) by group and name, copied to the host on first use."""

    def __init__(self, stacked: dict[str, dict]):
        self.stacked, self.host = stacked, None

    def member(self, group: str, p: int, layout: dict | None = None) -> dict:
        """Member p's tensors of one group, each its own copy in the strides of `layout`'s tensor
        of its name (lm/model.py keeps some transposed; None: its slice's)."""
        if self.host is None:
            self.host = {
                g: {k: t.detach().cpu() for k, t in ts.items()} for g, ts in self.stacked.items()
            }
        mine = {k: t[p] for k, t in self.host[group].items()}
        like = mine if layout is None else layout
        return {
            k: torch.empty_strided(like[k].shape, like[k].stride(), dtype=t.dtype).copy_(t)
            for k, t in mine.items()
        }


def member_trained(copies: HostCopies, p: int, member, update, opt) -> Trained:
    """Member p's Run.trained: its slices of the copies in its own GPTs' layout, its algorithm's
    state (update.host_state), its AdamW state (lm/optim.adamw_state)."""
    run, layout = member.run, lambda model: dict(model.named_parameters())
    lr = opt.param_groups[0]["lr"]  # a number, or each member's (P,)
    return Trained(
        copies.member("policy", p, layout(run.policy)),
        copies.member("ref", p, layout(run.ref)),
        update.host_state(member.algo, copies, p),
        adamw_state(
            int(opt.t[p]),
            float(lr[p]) if torch.is_tensor(lr) else lr,
            list(copies.member("m", p).values()),
            list(copies.member("v", p).values()),
        ),
    )


def host_copies(stack, ref, opt, critics=None) -> HostCopies:
    """The host copies of the stacked policy, π_ref, AdamW moments and PPO's learned critics."""
    groups = {
        "policy": stack.w,
        "ref": ref.w,
        "m": dict(enumerate(opt.m)),
        "v": dict(enumerate(opt.v)),
    }
    return HostCopies(groups if critics is None else {**groups, "critic": critics.w})
