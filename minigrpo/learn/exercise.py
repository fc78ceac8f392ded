"""What an exercise of the learn path is: the function it asks for (its module and name in
minigrpo), what it teaches, the tests that grade it (the library's own tests: every test of
`tests_from` whose body uses the function's name, plus the `extra_tests` that reach it through a
model or a run), the imports its stub offers (each with what it is for; never a helper that does
part of the exercise), what it grades in the words its stub's docstring or its first hint uses
(Graded), and its hints, shown one at a time. The exercises themselves are objective_exercises.py
and model_exercises.py, in the path's order in path.py.
"""

from __future__ import annotations

from dataclasses import dataclass

TORCH = ("import torch", "tensors and their operations")


@dataclass(frozen=True)
class Graded:
    """A property the check grades: the words that state it (in the stub's docstring or the first
    hint) and the graded tests that check it (space-separated parts of their names; a whole test
    file by its path)."""

    words: str
    tests: str


@dataclass(frozen=True)
class Exercise:
    number: int
    name: str  # the function's name in its module
    # minigrpo.<module>, e.g. objectives.kl; the learner's file is <workspace>/<last part>.py
    module: str
    lesson: str  # one line: what writing it teaches
    tests_from: tuple[str, ...]  # test files whose tests that use `name` grade it
    hints: tuple[str, ...]  # the first states what the check grades beyond the docstring
    graded: tuple[Graded, ...]
    imports: tuple[tuple[str, str], ...] = (TORCH,)  # the stub's (import line, what it is for)
    extra_tests: tuple[str, ...] = ()  # pytest node ids that reach the function indirectly
    minutes: int = 10  # about how long it takes

    @property
    def file_stem(self) -> str:
        return self.module.rsplit(".", 1)[-1]
