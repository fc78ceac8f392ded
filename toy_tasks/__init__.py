"""Toy tasks with known ground truth (the contract, with return keys: toy_tasks/contract.py). Each
task module declares:

    NAME, BLOCK_SIZE, ALPHABET            identity, longest sequence, characters it uses
    make_corpus(n_lines, seed)            pretraining lines drawn from the declared distribution
    entropy_floor()                       the best loss any model can reach, nats per predicted
                                          token
    pretrain_report(model, tok)           exact quality figures after pretraining, with `ok` for the
                                          bar
    format_report(report)                 the same as a printable table
    PRETRAIN_DEFAULTS, RL_DEFAULTS        flags whose defaults differ for this task (explicit flags
                                          win)
and, for RL, rl_prompts, anchor_prompts, support, REWARDS, REWARD_HELP, rl_baseline, rl_evaluate,
format_rl_eval.
"""

from __future__ import annotations

import importlib
import math

TASKS = {"food": "toy_tasks.food", "arithmetic": "toy_tasks.arithmetic", "sums": "toy_tasks.sums"}


def largest_remainder(total: int, weights: list[float]) -> list[int]:
    """Integer counts summing to `total`, proportional to `weights` (Hamilton's method; ties by
    index)."""
    raw = [total * w / sum(weights) for w in weights]
    counts = [math.floor(x) for x in raw]
    by_remainder = sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def apportion(n: int, weights: list[float]) -> list[int]:
    """Choices for n successive lines: each goes to the choice furthest below its share w_k / W of
    the lines so far (ties to the lower index), so every prefix's counts stay within one line of
    their shares."""
    total, counts, out = sum(weights), [0] * len(weights), []
    for t in range(1, n + 1):
        k = max(range(len(weights)), key=lambda i: t * weights[i] - total * counts[i])
        counts[k] += 1
        out.append(k)
    return out


def default_pretrain_dir(task: str) -> str:
    """runs/pretrain for the food task (the first commands of the README), runs/pretrain-<task>
    otherwise."""
    return "runs/pretrain" if task == "food" else f"runs/pretrain-{task}"


def task_defaults(argv, kind: str) -> dict:
    """The defaults that the task named by --task in `argv` sets for a CLI of `kind` ('PRETRAIN' or
    'RL'), plus the task's output or init path; {} for an unknown task (the CLI reports it)."""
    import argparse

    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--task", default="food")
    name = pre.parse_known_args(argv)[0].task
    try:
        task = get_task(name)
    except ValueError:
        return {}
    path = default_pretrain_dir(name)
    where = {"out": path} if kind == "PRETRAIN" else {"init": f"{path}/model.pt"}
    return {**getattr(task, f"{kind}_DEFAULTS"), **where}


def get_task(name: str):
    """The task module called `name`; ValueError naming the known tasks otherwise."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r} (available: {', '.join(sorted(TASKS))})")
    try:
        return importlib.import_module(TASKS[name])
    except ModuleNotFoundError as e:
        if e.name == TASKS[name]:
            raise ValueError(f"task {name!r} is not implemented yet") from None
        raise
