"""Grading: the library's own tests run against the learner's function, and the capstone's real run.

`check` runs, in a fresh pytest process, every test of the exercise's test files that uses the
function (plus the exercise's extra tests), with the learner's function plugged in (runner.py). It
prints the mistakes the function shows, then each broken property (the test's name) with its
message and Hypothesis' smallest failing example. A failing check stops once MAX_BROKEN properties
are broken and says how many tests did not run; a passing one runs them all; either is recorded in
the learner's progress (progress.py). The capstone then trains (capstone_run.py): a real `python -m
minigrpo.grpo --reward pizza` with every function the learner wrote plugged in.

The learn command (__main__.py) and the tests read all of it from here.
"""

from __future__ import annotations

from minigrpo.learn import workspace
from minigrpo.learn.capstone_run import GOAL, capstone, pretrained_model
from minigrpo.learn.path import Exercise
from minigrpo.learn.progress import (
    graded_status,
    load_progress,
    next_step,
    record,
    save_progress,
    the_end,
)
from minigrpo.learn.runner import repo_root, run_tests, test_counts, test_ids

__all__ = [
    "GOAL",
    "capstone",
    "check",
    "graded_status",
    "load_progress",
    "next_step",
    "pretrained_model",
    "record",
    "repo_root",
    "run_tests",
    "save_progress",
    "test_counts",
    "test_ids",
    "the_end",
]


def _property(node_id: str) -> str:
    name = node_id.split("::")[-1].split("[")[0]
    return name.removeprefix("test_").replace("_", " ")


def _short(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check(ex: Exercise, folder, log=print, say_next: bool = True) -> bool:
    """Grade one exercise; print the mistakes it looks like and what broke. -> passed."""
    state, error = workspace.read(ex, folder)
    if state != "written":
        log(
            f"exercise {ex.number} {ex.name}: "
            + {
                "not started": f"not started; {workspace.command(f'start {ex.number}', folder)}",
                "stub": "still the stub: replace its raise NotImplementedError in "
                f"{workspace.learner_file(ex, folder)}",
                "does not load": f"your file does not load: {error}",
            }[state]
        )
        return False
    report = run_tests(ex, folder, log=log)
    if report["load_error"]:
        log(f"exercise {ex.number} {ex.name}: your file does not load: {report['load_error']}")
        return False
    results = report["results"]
    failed = [r for r in results if r["outcome"] == "failed"]
    n_run = sum(r["outcome"] != "skipped" for r in results)
    passed = not failed and n_run > 0
    record(ex, folder, passed)
    not_run = max(report["collected"] - len(results), 0) if failed else 0
    more = f"; {not_run} more did not run" if not_run else ""
    log(
        f"exercise {ex.number} {ex.name} ({workspace.learner_file(ex, folder)}): "
        f"{n_run - len(failed)} of {n_run} tests pass{more}"
    )
    for message in report["mistakes"]:
        log(f"  looks like a known mistake: {message}")
    by_property = {}  # a parametrised test fails once per case: show its first case, count the rest
    for r in failed:
        by_property.setdefault(_property(r["test"]), []).append(r)
    for prop, cases in by_property.items():
        r = cases[0]
        log(
            f"  x {prop}"
            + (f" ({len(cases)} cases)" if len(cases) > 1 else "")
            + f"\n      {_short(r['message'])}"
        )
        if r["example"]:
            log(f"      smallest failing example: {_short(r['example'])}")
    if any(r.get("timeout") for r in results):
        log("  the check stopped at the test that ran out of time: the tests after it did not run")
    elif not_run:
        log(
            f"  the check stopped after {len(by_property)} broken properties: {not_run} more tests "
            "did not run (fix these, then check again)"
        )
    if not passed:
        log(f"  hint: {workspace.command(f'hint {ex.number}', folder)}")
    elif say_next:
        step = next_step(folder, run=False)
        log(f"  passing. Next: {step}" if step else f"  passing. {the_end(folder)}")
    return passed
