"""The path: the exercises in the order a learner should walk them, each one function of the
library.

The exercises are objective_exercises.py (1-9: the objectives) and model_exercises.py (10-12: the
model's log-probs and attention, then the capstone); what an exercise holds (its function, lesson,
graded tests, stub imports, graded words and hints): exercise.py.
"""

from __future__ import annotations

from minigrpo.learn.exercise import Exercise
from minigrpo.learn.model_exercises import MODEL_EXERCISES
from minigrpo.learn.objective_exercises import OBJECTIVE_EXERCISES

__all__ = ["BY_NAME", "CAPSTONE", "PATH", "TRAINER", "Exercise", "find"]  # Exercise: exercise.py's

PATH = (*OBJECTIVE_EXERCISES, *MODEL_EXERCISES)
CAPSTONE = PATH[-1]
BY_NAME = {e.name: e for e in PATH}
TRAINER = "minigrpo/grpo_one_file.py"  # GRPO in one file: the capstone's pieces, assembled


def find(key: str) -> Exercise:
    """An exercise by its number ('3') or its function's name ('clipped_surrogate'); ValueError
    otherwise."""
    if key.isdigit() and 1 <= int(key) <= len(PATH):
        return PATH[int(key) - 1]
    if key in BY_NAME:
        return BY_NAME[key]
    raise ValueError(
        f"no exercise {key!r}: give a number 1-{len(PATH)} or one of {', '.join(BY_NAME)}"
    )
