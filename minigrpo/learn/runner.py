"""Running an exercise's graded tests: the library's own tests (every test of the exercise's test
files that uses the function, plus its extra tests), in a fresh pytest process with the learner's
function plugged in by minigrpo.learn.plugin, which also runs the catalogued mistakes' probes
(mistakes.py) on it: the learner's code runs only there, and this process never imports torch. A
failing run stops once MAX_BROKEN properties are broken; a passing one runs them all.

A learner's code may never return: each test has TEST_LIMIT_S (the check then names it and stops),
a check that waits STILL_AFTER_S on one test says which, and a test its own alarm did not stop has
its process killed KILL_AFTER_S later; pytest runs in a child process that ends with the command
(child.run). grade.py reports what the run found.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import tempfile
from pathlib import Path

import minigrpo
from minigrpo.learn import child
from minigrpo.learn.path import PATH, Exercise

# per test, setup to teardown: 20x the slowest test with the library's bodies (2 cores)
TEST_LIMIT_S = 60
STILL_AFTER_S = 5  # a check that waits this long on one thing says what it waits for
# past TEST_LIMIT_S, a test that its own alarm did not stop has its process killed
KILL_AFTER_S = 15
# broken properties a failing check shows; it stops before the tests of any other property
MAX_BROKEN = 2


def repo_root() -> Path:
    root = Path(minigrpo.__file__).resolve().parent.parent
    if not (root / "tests" / "conftest.py").exists():
        raise FileNotFoundError(
            f"grading needs the repository's tests/ folder next to {root / 'minigrpo'}: "
            "install from a clone with pip install -e ."
        )
    return root


def test_ids(ex: Exercise, root: Path) -> list[str]:
    """Node ids of the tests that grade ex: those of ex.tests_from whose body names the function, +
    extras."""
    whole_files = {t for t in ex.extra_tests if "::" not in t}
    ids = []
    for rel in ex.tests_from:
        if rel in whole_files:
            continue
        functions = {
            n.name: n
            for n in ast.parse((root / rel).read_text()).body
            if isinstance(n, ast.FunctionDef)
        }
        uses = {
            name: {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}  # k1(...)
            | {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}  # kl.k1(...)
            |
            # KL_ESTIMATORS["k1"]
            {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)}
            for name, node in functions.items()
        }
        for _ in functions:  # a test that calls a helper of its file uses what the helper uses
            for name in uses:
                uses[name] = uses[name].union(*(uses[h] for h in uses[name] & functions.keys()))
        ids += [
            f"{rel}::{name}"
            for name in functions
            if name.startswith("test_") and ex.name in uses[name]
        ]
    return ids + [t for t in ex.extra_tests if t not in ids]


class _Waiting:
    """Watches a check's pytest (child.run's `watch`): says once what it waits for when one test (or
    pytest's start) takes STILL_AFTER_S, and stops it when one test is still running KILL_AFTER_S
    past its limit."""

    def __init__(self, ex: Exercise, running: Path, log):
        self.ex, self.running, self.log = ex, running, log
        self.test, self.since, self.said = "", 0.0, False

    def __call__(self, elapsed: float) -> bool:
        test = self.running.read_text() if self.running.exists() else ""
        if test != self.test:
            self.test, self.since, self.said = test, elapsed, False
        waited = elapsed - self.since
        if waited >= STILL_AFTER_S and not self.said:
            what = (
                test.split("::")[-1] if test else "pytest to start (Python, torch, the test files)"
            )
            self.log(f"  still checking {self.ex.name}: waiting for {what} ({waited:.0f} s) ...")
            sys.stdout.flush()
            self.said = True
        return waited > TEST_LIMIT_S + KILL_AFTER_S


def run_tests(ex: Exercise, folder, only: set[str] | None = None, log=print) -> dict:
    """Run ex's tests with the learner's functions (those in `only`, default ex's) plugged in -> the
    plugin's report: results (each test's outcome), mistakes (the messages of those the function
    shows), collected (the tests selected), load_error (the learner's file could not be loaded:
    nothing ran)."""
    root = repo_root()
    with tempfile.TemporaryDirectory() as tmp:
        report, running = Path(tmp) / "report.json", Path(tmp) / "running"
        env = {
            **os.environ,
            "MINIGRPO_LEARN_DIR": str(Path(folder).resolve()),
            "OMP_NUM_THREADS": "1",
            "MINIGRPO_LEARN_ONLY": ",".join(sorted(only or {ex.name})),
            "MINIGRPO_LEARN_REPORT": str(report),
            "MINIGRPO_LEARN_LIMIT": str(TEST_LIMIT_S),
            "MINIGRPO_LEARN_RUNNING": str(running),
            "MINIGRPO_LEARN_MAX_BROKEN": str(MAX_BROKEN),
            # the check's own plugin only: none that is merely installed
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONDONTWRITEBYTECODE": "1",  # nothing written next to the library's sources
            "HYPOTHESIS_STORAGE_DIRECTORY": str(Path(folder).resolve() / ".hypothesis"),
        }
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "minigrpo.learn.plugin",
            "-p",
            "no:cacheprovider",
            "-q",
            "--no-header",
            "--tb=native",
            "-m",
            "not slow",
            *test_ids(ex, root),
        ]
        waiting = _Waiting(ex, running, log)
        code, out, err = child.run(cmd, watch=waiting, cwd=root, env=env)
        empty = {"results": [], "mistakes": [], "collected": 0, "load_error": None}
        # a loop that the test's own alarm could not stop (inside one C call, a bare except)
        if code is None:
            test = waiting.test or "collection"
            message = (
                child.ran_past(test.split("::")[-1], TEST_LIMIT_S)
                if waiting.test
                else f"pytest ran past {TEST_LIMIT_S} s before its first test: does a file of "
                "yours loop on import?"
            )
            return {
                **empty,
                "results": [
                    {
                        "test": test,
                        "outcome": "failed",
                        "message": message,
                        "example": "",
                        "timeout": True,
                    }
                ],
            }
        if not report.exists():  # pytest ended before its report: it could not start, or died
            tail = (out + err).strip().splitlines()[-3:]
            last = running.read_text() if running.exists() else ""  # the test it was in
            died = (
                f"the check's pytest ended with exit code {code} in this test, before its report: "
                "does your code call os._exit or end the process?"
                if last
                else None
            )
            return {
                **empty,
                "results": [
                    {
                        "test": last or "collection",
                        "outcome": "failed",
                        "message": " | ".join([died] if died else tail),
                        "example": "",
                    }
                ],
            }
        return {**empty, **json.loads(report.read_text())}


def test_counts() -> dict[str, int]:
    """How many tests `check` runs for each exercise: pytest's collection of test_ids, slow tests
    left out."""
    root = repo_root()
    ids = {ex.name: test_ids(ex, root) for ex in PATH}
    every = sorted({t for tests in ids.values() for t in tests})
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--collect-only",
        "-o",
        "addopts=",
        "-q",
        "-p",
        "no:cacheprovider",
        # addopts' own -q would make it -qq: counts per file, not node ids
        "-m",
        "not slow",
        *every,
    ]
    code, out, err = child.run(
        cmd,
        cwd=root,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    if code != 0:
        raise RuntimeError(
            f"collecting the path's tests failed ({code}): {(out + err).strip()[-500:]}"
        )
    collected = [line.strip() for line in out.splitlines() if "::" in line]
    inside = lambda node, t: node == t or node.startswith((t + "[", t + "::"))  # noqa: E731
    return {
        name: sum(any(inside(node, t) for t in tests) for node in collected)
        for name, tests in ids.items()
    }
