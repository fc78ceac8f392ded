"""A lockstep population's exact evaluations, each member's single-run figures to float rounding
(tests/test_evaluation.py): one forward of their weights stacked where the task has
rl_evaluate_many (toy_tasks/contract.py), else each member's own GPT (lockstep keeps it current).
"""

from __future__ import annotations

import torch

from minigrpo.population.stacked import Stack


def alike(cfg) -> tuple:
    """What of a member's own settings its exact evaluation reads: its reward, β (the frontier's
    figures) and person (whose target and whose drift)."""
    return cfg.reward, getattr(cfg, "beta", None), cfg.person


def evaluate_members(members: list) -> dict:
    """Lockstep's members' (each with its .run) exact evaluations, one computation per reward, β
    and person (alike) -> {id(member): its evaluation}; a group whose figures cannot be made
    together is left out (each member then evaluates itself, and fails alone)."""
    groups: dict[tuple, list] = {}
    for m in members:
        groups.setdefault(alike(m.run.cfg), []).append(m)
    out = {}
    for group in groups.values():
        r, many = group[0].run, getattr(group[0].run.task, "rl_evaluate_many", None)
        try:
            if many:
                with torch.no_grad():  # a copy: the task's forward is no_grad
                    weights = Stack([m.run.policy for m in group])
                evs = many(weights, r.tok, r.baseline, r.cfg, r.rewards)
            else:
                evs = [m.run.exact_evaluation() for m in group]
        except ValueError:
            continue
        out.update((id(m), ev) for m, ev in zip(group, evs))
    return out
