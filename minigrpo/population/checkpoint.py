"""A lockstep member's checkpoint from its population's stacked tensors copied to the host once for
all members.

    copies = host_copies(stack, ref, opt, critics)  # each step's; nothing copied yet
    trained = member_trained(copies, p, member, update, opt)  # member p's Run.trained: its
                                  # slices of the copies (its weights, moments, PPO's critic)

A single run's checkpoint copies each of its tensors to the host
(rl/checkpoints.RunCheckpoints.save); P members' checkpoints, each on its own, would copy P times as
many, and on a GPU each copy waits for the kernels queued before it (on a GPU shared with other
processes, theirs too). Here the first member that saves in a step copies every stacked tensor once,
and each member's checkpoint takes copies of its own slices: the same values, the same file. The
anchor, which the members share, is copied once for all (rl/preserve.Anchor.host_state).
"""

from __future__ import annotations

import torch

from minigrpo.lm.optim import adamw_state


class HostCopies:
    """Stacked tensors (P, ...) by group (a dict of named tensors, or a list), copied to the host on
    the first `member` call; made anew each step (the copies are of that step's tensors)."""

    def __init__(self, stacked: dict):
        self.stacked, self.host = stacked, None

    def member(self, group: str, p: int, layout: dict | None = None) -> dict | list:
        """Member p's tensors of one group, each its own copy (a slice alone would save the whole
        stack's storage); `layout`: tensors by name whose strides the copies take (a GPT's weights:
        lm/model.py keeps some transposed), so that a member's file is its single run's byte for
        byte."""
        if self.host is None:
            self.host = {
                g: _apply(ts, lambda k, t: t.detach().cpu()) for g, ts in self.stacked.items()
            }
        if layout is None:
            return _apply(self.host[group], lambda k, t: t[p].clone())
        return _apply(
            self.host[group],
            lambda k, t: torch.empty_strided(
                layout[k].shape, layout[k].stride(), dtype=t.dtype
            ).copy_(t[p]),
        )


def _apply(tensors: dict | list, f) -> dict | list:
    """f(name or index, tensor) over a dict's or a list's tensors -> the same kind."""
    if isinstance(tensors, dict):
        return {k: f(k, t) for k, t in tensors.items()}
    return [f(k, t) for k, t in enumerate(tensors)]


def member_trained(copies: HostCopies, p: int, member, update, opt) -> dict:
    """Member p's trained state for its checkpoint, as rl/checkpoints.RunCheckpoints.trained makes
    a single run's: its slices of the copies (its policy's and π_ref's in the layout of its own
    GPTs), its algorithm's state (update.host_state: PPO's learned critic from the copies too), and
    the stacked AdamW's (lm/optim.AdamW, a count and a rate per member) state for its slices."""
    run, layout = member.run, lambda model: dict(model.named_parameters())
    lr = opt.param_groups[0]["lr"]  # a number, or each member's (P,)
    return {
        "policy": copies.member("policy", p, layout(run.policy)),
        "ref": copies.member("ref", p, layout(run.ref)),
        "algo": update.host_state(member.algo, copies, p),
        "optimizer": adamw_state(
            int(opt.t[p]),
            float(lr[p]) if torch.is_tensor(lr) else lr,
            copies.member("m", p),
            copies.member("v", p),
        ),
    }


def host_copies(stack, ref, opt, critics=None) -> HostCopies:
    """The host copies of a population's stacked policy, π_ref, AdamW moments and learned critics
    (PPO's; None: none) as they are now (made on the first checkpoint that asks)."""
    groups = {"policy": stack.w, "ref": ref.w, "m": opt.m, "v": opt.v}
    return HostCopies(groups if critics is None else {**groups, "critic": critics.w})
