"""A pytest plugin (pytest -p minigrpo.learn.plugin) that grades a learner's function with the library's
own tests: before any test module is imported it plugs the learner's functions in (workspace.install),
so `from minigrpo.objectives.advantages import group_advantages` in a test file gets the learner's; it then writes
each test's outcome, assertion message and Hypothesis' smallest failing example to a JSON report.

A test that runs past its time limit (setup, call and teardown together) fails with "<test> ran past N s" and
ends the session: the remaining tests would most likely loop as well.

Environment: MINIGRPO_LEARN_DIR (the workspace), MINIGRPO_LEARN_ONLY (comma-separated function names),
MINIGRPO_LEARN_REPORT (where the JSON goes), MINIGRPO_LEARN_LIMIT (seconds per test; none when absent),
MINIGRPO_LEARN_RUNNING (a file that holds the node id of the test running now).
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from minigrpo.learn.child import die_with_parent, ran_past, time_limit

_results: list[dict] = []
_deadline: float | None = None  # time.monotonic() by which the running test must end
_session = None


def pytest_configure(config):
    from minigrpo.learn.workspace import install

    die_with_parent()
    folder = os.environ.get("MINIGRPO_LEARN_DIR")
    if folder:
        only = os.environ.get("MINIGRPO_LEARN_ONLY")
        install(folder, set(only.split(",")) if only else None)


def _limit() -> float:
    return float(os.environ.get("MINIGRPO_LEARN_LIMIT", 0))


def pytest_sessionstart(session):
    global _session
    _session = session


def pytest_runtest_logstart(nodeid, location):
    global _deadline
    _deadline = time.monotonic() + _limit() if _limit() > 0 else None
    running = os.environ.get("MINIGRPO_LEARN_RUNNING")
    if running:  # written whole, then renamed: the command never reads half a node id
        with open(running + ".tmp", "w") as f:
            f.write(nodeid)
        os.replace(running + ".tmp", running)


def _limited(item):
    """A test phase under what is left of its test's time limit."""
    left = 0.0 if _deadline is None else max(_deadline - time.monotonic(), 0.001)
    with time_limit(left, ran_past(item.name, _limit())):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _limited(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _limited(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield from _limited(item)


def falsifying_example(text: str) -> str:
    """Hypothesis' 'Falsifying example: test(arg=..., ...)' from a failure's text, on one line ('' if none)."""
    lines = [re.sub(r"^E\s?", "", line).strip() for line in text.splitlines()]
    for i, line in enumerate(lines):
        if line.startswith("Falsifying example:"):
            call = []
            for part in lines[i + 1:]:
                call.append(re.sub(r"\s*#.*$", "", part))  # Hypothesis' comments ("# or any other ...")
                if part == ")":
                    break
            text = re.sub(r"\s+", " ", " ".join(call)).replace("( ", "(").replace(", )", ")").replace(",)", ")")
            return text.removesuffix(")")
    return ""


def _message(report) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    text = re.sub(r"^[\w.]*RanPastLimit: ", "", text)  # the line that names the test and its limit, alone
    return text.split("\nassert ")[0].strip()  # the author's message, not pytest's rewritten expression


def pytest_runtest_logreport(report):
    global _deadline
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = "passed" if report.passed else ("skipped" if report.skipped else "failed")
        entry = {"test": report.nodeid, "outcome": outcome}
        if report.failed:
            entry.update(message=_message(report), example=falsifying_example(report.longreprtext),
                         timeout="RanPastLimit: " in report.longreprtext)
            if entry["timeout"]:  # the next tests would most likely loop too; its teardown runs to its end
                _deadline = None
                _session.shouldstop = "a test ran past its time limit"
        _results.append(entry)


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("MINIGRPO_LEARN_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(_results, f)
