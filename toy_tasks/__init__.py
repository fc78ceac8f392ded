"""Toy tasks with known ground truth. Each task module declares:

    NAME, BLOCK_SIZE, ALPHABET            identity, longest sequence, characters it uses
    make_corpus(n_lines, seed)            pretraining lines drawn from the declared distribution
    entropy_floor()                       the best loss any model can reach, nats per predicted token
    pretrain_report(model, tok)           exact quality figures after pretraining, with `ok` for the bar
    format_report(report)                 the same as a printable table
"""

from __future__ import annotations

import importlib

TASKS = {"food": "toy_tasks.food", "arithmetic": "toy_tasks.arithmetic"}


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
