"""A lockstep population's stale sampler (--sample-stale N: each step samples from the weights of N
steps before): rl/rollout.Sampler's record over the stacked weights, once for all members, and each
member's Sampler whose state (its checkpoint's) is its own slices of them.

    stale = StaleWeights(n)
    sampling = stale.pick(stack)     # once a step, before sampling: records the weights -> the
                                     # weights to sample (a Stack)
    stale.keep(members)              # only these members (their indices) from now on
    algo.sampler = stale.member(algo.sampler, p)   # member p's Sampler: its state_dict is its own
                                                   # slices
"""

from __future__ import annotations

import copy

import torch

from minigrpo.population.stacked import Stack
from minigrpo.rl.rollout import Sampler


class StaleWeights(Sampler):
    """rl/rollout.Sampler's stale policy for P members at once: its states the stacked weights."""

    def __init__(self, n: int):
        super().__init__(stale=n)

    @torch.no_grad()
    def pick(self, stack: Stack) -> Stack:
        oldest = copy.copy(stack)
        oldest.w = self.record(stack.w)
        return oldest

    def keep(self, members: list[int]) -> None:
        if self.states:
            index = torch.tensor(members, device=next(iter(self.states[0].values())).device)
            self.states = [{k: w.index_select(0, index) for k, w in s.items()} for s in self.states]

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
            "states": [{k: w[self.p].clone() for k, w in s.items()} for s in self.population.states]
        }
