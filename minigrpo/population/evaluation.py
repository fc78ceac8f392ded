"""A lockstep population's exact evaluations: each member's single-run figures, every member's from
one forward of their weights stacked.

    evaluation = SharedForward()
    evaluation.adopt(models)      # the members' own GPTs (at the start, and whenever members leave)
    evaluation.fresh(stack)       # after each update: each member's GPT takes its weights from the
                                  # stack
    evaluate_members(members)     # one rl_evaluate_many of the members' stacked weights for each
                                  # reward (and β, person)

A member's own GPT is kept current (fresh) for the forwards that are its own: a task without
rl_evaluate_many (rl_evaluate member by member), an evaluation retried alone, ReMax's greedy draw.
The task's rl_evaluate_many receives the members' weights stacked (lm/model.Weights), which
lm/logprobs.completion_logprobs_many scores in one forward. The figures are the single run's to
float rounding (tests/test_evaluation.py).
"""

from __future__ import annotations

import torch

from minigrpo.lm.model import GPT
from minigrpo.population.stacked import Stack


class SharedForward:
    """The members' own GPTs, given their weights from the population's stack after each update."""

    def __init__(self):
        self.models: list[GPT] = []

    def adopt(self, models: list[GPT]) -> None:
        """The members' GPTs, in the order of the stack's members."""
        self.models = list(models)

    def fresh(self, stack: Stack) -> None:
        """Member p's weights from the stack into its own GPT, for every member, in one call."""
        stack.copy_to(self.models)


def alike(cfg) -> tuple:
    """What of a member's own settings its exact evaluation reads: its reward, β (the frontier's
    figures) and person (whose target and whose drift)."""
    return cfg.reward, getattr(cfg, "beta", None), cfg.person


def evaluate_members(members: list) -> dict:
    """The exact evaluations of lockstep's members (each with its .run, whose policy is current:
    SharedForward), as one for each reward (and β, person: alike) where the task can (its
    rl_evaluate_many, of the group's weights stacked) -> {id(member): its evaluation}."""
    groups: dict[tuple, list] = {}
    for m in members:
        groups.setdefault(alike(m.run.cfg), []).append(m)
    out = {}
    for group in groups.values():
        r = group[0].run
        # optional (toy_tasks/contract.py): else each model's own
        many = getattr(r.task, "rl_evaluate_many", None)
        try:
            if many:
                with torch.no_grad():  # a copy: the task's forward is no_grad
                    weights = Stack([m.run.policy for m in group])
                evs = many(weights, r.tok, r.baseline, r.cfg, r.rewards)
            else:
                evs = [m.run.exact_evaluation() for m in group]
        # one member's figures cannot be made: each member evaluates itself (and it fails alone)
        except ValueError:
            continue
        out.update((id(m), ev) for m, ev in zip(group, evs))
    return out
