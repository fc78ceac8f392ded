"""A pytest plugin (pytest -p minigrpo.learn.plugin) that grades a learner's function with the
library's own tests: before any test module is imported it plugs the learner's functions in
(workspace.install), so `from minigrpo.objectives.advantages import group_advantages` in a test file
gets the learner's; it then writes each test's outcome, assertion message and Hypothesis' smallest
failing example to a JSON report, with the messages of the catalogued mistakes (mistakes.py) the
function shows, or why the learner's file did not load.

Hypothesis runs every example the tests ask for, without its `explain` phase (which re-runs a
failing test many times only to annotate the example) and with one failure per property, its
smallest (check_profile). Once MINIGRPO_LEARN_MAX_BROKEN properties (test functions) have failed,
the session stops before the first test of any other property. A test that runs past its time limit
(setup, call and teardown together) fails with "<test> ran past N s" and ends the session: the
remaining tests would most likely loop as well.

Environment: MINIGRPO_LEARN_DIR (the workspace), MINIGRPO_LEARN_ONLY (comma-separated function
names), MINIGRPO_LEARN_REPORT (where the JSON goes), MINIGRPO_LEARN_LIMIT (seconds per test; none
when absent), MINIGRPO_LEARN_RUNNING (a file that holds the node id of the test running now),
MINIGRPO_LEARN_MAX_BROKEN.
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from hypothesis import Phase, settings

from minigrpo.learn.child import RanPastLimit, die_with_parent, ran_past, time_limit

PROFILE = "minigrpo-learn"
SHRINK_S = 0.5  # how long Hypothesis shrinks one failure during a check (its own limit: 300 s)
_results: list[dict] = []
_broken: list[str] = []  # the properties (test functions) that failed, in order
_report = {"collected": 0, "load_error": None}
_deadline: float | None = None  # time.monotonic() by which the running test must end
_session = None


def check_profile() -> settings:
    """The Hypothesis settings of a check: every phase but `explain`, one failure (the smallest) per
    property."""
    settings.register_profile(
        PROFILE, phases=[p for p in Phase if p != Phase.explain], report_multiple_bugs=False
    )
    return settings.get_profile(PROFILE)


def use_check_settings() -> None:
    """The check's profile as Hypothesis' default, and its limit on shrinking: a learner waits for
    the answer."""
    from hypothesis.internal.conjecture import engine

    check_profile()
    settings.load_profile(PROFILE)
    engine.MAX_SHRINKING_SECONDS = SHRINK_S  # read each time a shrink starts; no setting offers it


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Before conftest.py builds its settings objects (they copy the default profile's values)."""
    use_check_settings()


def _only() -> set[str] | None:
    only = os.environ.get("MINIGRPO_LEARN_ONLY")
    return set(only.split(",")) if only else None


def _graded() -> list:
    """The exercises whose learner's functions this session grades."""
    from minigrpo.learn.path import PATH

    return [ex for ex in PATH if _only() is None or ex.name in _only()]


def pytest_configure(config):
    from minigrpo.learn.workspace import LearnerError, install, learner_function

    die_with_parent()
    folder = os.environ.get("MINIGRPO_LEARN_DIR")
    if folder:
        # a file that does not load leaves the library's function in place: say so
        install(folder, _only())
        for ex in _graded():
            try:
                learner_function(ex, folder)
            except LearnerError as e:
                _report["load_error"] = _report["load_error"] or str(e)


def pytest_collection_modifyitems(session, config, items):
    if _report["load_error"]:  # nothing of the learner's to grade
        config.hook.pytest_deselected(items=list(items))
        items[:] = []


def pytest_collection_finish(session):
    _report["collected"] = len(session.items)


def _limit() -> float:
    return float(os.environ.get("MINIGRPO_LEARN_LIMIT", 0))


def pytest_sessionstart(session):
    global _session
    _session = session


def _property(nodeid: str) -> str:
    return nodeid.split("::")[-1].split("[")[0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Stop before the first test of a new property once MINIGRPO_LEARN_MAX_BROKEN properties have
    failed."""
    most = int(os.environ.get("MINIGRPO_LEARN_MAX_BROKEN", 0))
    if most and len(_broken) >= most and _property(item.nodeid) not in _broken:
        item.session.shouldstop = f"{len(_broken)} broken properties"
        return True  # this test does not run; the session ends here
    return None


def _say_running(what: str) -> None:
    running = os.environ.get("MINIGRPO_LEARN_RUNNING")
    if running:  # written whole, then renamed: the command never reads half a node id
        with open(running + ".tmp", "w") as f:
            f.write(what)
        os.replace(running + ".tmp", running)


def pytest_runtest_logstart(nodeid, location):
    global _deadline
    _deadline = time.monotonic() + _limit() if _limit() > 0 else None
    _say_running(nodeid)


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
    """Hypothesis' 'Falsifying example: test(arg=..., ...)' from a failure's text, on one line (''
    if none); newer Hypothesis versions head it 'Failing test case:'."""
    lines = [re.sub(r"^E\s?", "", line).strip() for line in text.splitlines()]
    for i, line in enumerate(lines):
        if line.startswith(("Falsifying example:", "Failing test case:")):
            call = []
            for part in lines[i + 1 :]:
                # Hypothesis' comments ("# or any other ...")
                call.append(re.sub(r"\s*#.*$", "", part))
                if part == ")":
                    break
            text = (
                re.sub(r"\s+", " ", " ".join(call))
                .replace("( ", "(")
                .replace(", )", ")")
                .replace(",)", ")")
            )
            return text.removesuffix(")")
    return ""


def called_sys_exit(code) -> str:
    """What a check says of a learner's code that raised SystemExit (`sys.exit(code)`, `exit()`),
    which would otherwise end the check's pytest, or read as a failed assertion."""
    return (
        f"your code called sys.exit({'' if code is None else repr(code)}): a graded function "
        "returns its result and never ends the process"
    )


def _message(report) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    # pytest's text of it: 'SystemExit: 3', 'SystemExit: bye', 'SystemExit' (Hypothesis adds lines)
    exited = re.fullmatch(r"SystemExit(?:: (.*))?", text.split("\n")[0])
    if exited:
        code = exited.group(1)
        return called_sys_exit(int(code) if code and code.lstrip("-").isdigit() else code)
    # the line that names the test and its limit, alone
    text = re.sub(r"^[\w.]*RanPastLimit: ", "", text)
    # the author's message, not pytest's rewritten expression
    return text.split("\nassert ")[0].strip()


def pytest_runtest_logreport(report):
    global _deadline
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = "passed" if report.passed else ("skipped" if report.skipped else "failed")
        entry = {"test": report.nodeid, "outcome": outcome}
        if report.failed:
            entry.update(
                message=_message(report),
                example=falsifying_example(report.longreprtext),
                timeout="RanPastLimit: " in report.longreprtext,
            )
            if _property(report.nodeid) not in _broken:
                _broken.append(_property(report.nodeid))
            # the next tests would most likely loop too; its teardown runs to its end
            if entry["timeout"]:
                _deadline = None
                _session.shouldstop = "a test ran past its time limit"
        _results.append(entry)


def _mistakes() -> list[str]:
    """The messages of the catalogued mistakes the learner's functions show; none after a test ran
    out of time (the function may not return), and none past the time limit of one test."""
    from minigrpo.learn import mistakes, workspace

    folder = os.environ.get("MINIGRPO_LEARN_DIR")
    if not folder or _report["load_error"] or any(r.get("timeout") for r in _results):
        return []
    probes = "the probes of the catalogued mistakes"
    _say_running(probes)
    found = []
    try:
        with time_limit(_limit(), "the probes ran past their limit"):
            for ex in _graded():
                fn = workspace.learner_function(ex, folder)
                found += (
                    [m.message for m in mistakes.diagnose(ex.name, fn)] if fn is not None else []
                )
    except RanPastLimit:
        pass
    except SystemExit as e:  # it would end pytest before its report: a failure of its own
        _results.append(
            {
                "test": probes,
                "outcome": "failed",
                "message": f"{called_sys_exit(e.code)} (in {probes})",
                "example": "",
            }
        )
    return found


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("MINIGRPO_LEARN_REPORT")
    if path:
        report = {"results": _results, "mistakes": _mistakes(), **_report}
        with open(path, "w") as f:
            json.dump(report, f)
