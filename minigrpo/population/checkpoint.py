"""A lockstep member's checkpoint from its population's stacked tensors copied to the host once for
all members.

    share_copies(stack, ref, opt, runs, critics)  # each MemberRun's run.copies: nothing copied yet
    run.slot = p                              # its checkpoint's weights: its slices of the copies
                                              # (HostCopies)
    MemberOptimizer(opt, run)                 # and so is its optimiser's state (the stacked
                                              # AdamW's, optim.py)
    MemberAlgorithm(algo, update, run)        # and its algorithm's (PPO's learned critic)

A single run's checkpoint copies each of its tensors to the host
(rl/checkpoints.RunCheckpoints.save); P members' checkpoints, each on its own, would copy P times as
many, and on a GPU each copy waits for the kernels queued before it (on a GPU shared with other
processes, theirs too). Here the first member that saves in a step copies every stacked tensor once,
and each member's checkpoint takes copies of its own slices: the same values, the same file. The
anchor, which the members share, is copied once for all (rl/preserve.Anchor.host_state).
"""

from __future__ import annotations

import torch

from minigrpo.rl.loop import Run


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


class MemberRun(Run):
    """A lockstep member's rl/loop.Run: its checkpoint's weights (the policy's, π_ref's) are its
    slices of the population's host copies of the step."""

    copies: HostCopies | None = None  # set by the population each step
    slot: int = 0  # the member's place in the stacks (it changes as members leave)

    def host_weights(self) -> tuple[dict, dict]:
        return tuple(
            self.copies.member(group, self.slot, dict(model.named_parameters()))
            for group, model in (("policy", self.policy), ("ref", self.ref))
        )

    def renew_ref(self) -> None:
        """Nothing: the population renews its stacked π_ref, once for all (lockstep.py); the
        member's own GPTs give its checkpoint only their layout."""


class MemberAlgorithm:
    """A member's algorithm object for its checkpoint (rl/loop.Run.save reads its state_dict): what
    the population trains of it (PPO's learned critic) is its slices of the run's host copies of the
    step, as its weights are."""

    def __init__(self, algo, update, run: MemberRun):
        self.algo, self.update, self.run = algo, update, run

    def state_dict(self) -> dict:
        return self.update.host_state(self.algo, self.run.copies, self.run.slot)


class MemberOptimizer:
    """A member's view of the stacked AdamW (lm/optim.AdamW, t and lr per member), for its
    checkpoint (rl/loop.Run.save): lm/optim.AdamW.state_dict's format, its moments its slices of the
    run's host copies of the step."""

    def __init__(self, opt, run: MemberRun):
        self.opt, self.run = opt, run

    def state_dict(self) -> dict:
        copies, p = self.run.copies, self.run.slot
        lr = self.opt.param_groups[0]["lr"]  # a number, or each member's (P,)
        return {
            "t": int(self.opt.t[p]),
            "m": copies.member("m", p),
            "v": copies.member("v", p),
            "lr": float(lr[p]) if torch.is_tensor(lr) else lr,
        }


def share_copies(stack, ref, opt, runs: list[MemberRun], critics=None) -> None:
    """Give the members' runs the host copies of their population's stacked policy, π_ref, AdamW
    moments and learned critics (PPO's; None: none) as they are now (made on the first checkpoint
    that asks)."""
    groups = {"policy": stack.w, "ref": ref.w, "m": opt.m, "v": opt.v}
    copies = HostCopies(groups if critics is None else {**groups, "critic": critics.w})
    for run in runs:
        run.copies = copies
