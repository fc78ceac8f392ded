"""A lockstep population's stale sampler (--sample-stale N: each step samples from the weights of N
steps before, rl/rollout.Sampler's): the stacked weights recorded once for all members, and each
member's Sampler whose state (its checkpoint's) is its own slices of them."""

from __future__ import annotations

import copy

import torch

from minigrpo.population.stacked import Stack
from minigrpo.rl.rollout import Sampler


class StaleWeights:
    """rl/rollout.Sampler's stale policy (--sample-stale N) for P members at once: the stacked
    weights at the start of each of the last N + 1 steps, the oldest sampled from (the first N
    steps: the oldest there is).

        stale = StaleWeights(n)
        sampling = stale.pick(stack)     # once a step, before sampling: records the weights -> the
                                         # weights to sample
        stale.keep(members)              # only these members (their indices) from now on
        algo.sampler = stale.member(algo.sampler, p)   # member p's Sampler: its state_dict is its
                                                       # own slices
    """

    def __init__(self, n: int):
        self.n, self.snapshots = n, []

    @torch.no_grad()
    def pick(self, stack: Stack) -> Stack:
        self.snapshots = (self.snapshots + [{k: w.detach().clone() for k, w in stack.w.items()}])[
            -(self.n + 1) :
        ]
        oldest = copy.copy(stack)
        oldest.w = self.snapshots[0]
        return oldest

    def keep(self, members: list[int]) -> None:
        index = (
            torch.tensor(members, device=next(iter(self.snapshots[0].values())).device)
            if self.snapshots
            else None
        )
        self.snapshots = [
            {k: w.index_select(0, index) for k, w in s.items()} for s in self.snapshots
        ]

    def member(self, sampler: Sampler, p: int) -> Sampler:
        return MemberSampler(sampler, self, p)


class MemberSampler(Sampler):
    """A member's Sampler in a population with a stale sampler: its settings, and as its state (its
    checkpoint's, rl/rollout.Sampler.state_dict's format) copies of its own slices of the
    population's recorded weights."""

    def __init__(self, like: Sampler, stale: StaleWeights, p: int):
        super().__init__(like.temperature, like.top_p, like.stale)
        self.population, self.p = stale, p

    def state_dict(self) -> dict:
        return {
            "states": [
                {k: w[self.p].clone() for k, w in s.items()} for s in self.population.snapshots
            ]
        }
