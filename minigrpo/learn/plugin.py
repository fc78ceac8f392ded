"""A pytest plugin (pytest -p minigrpo.learn.plugin) that grades a learner's function with the library's
own tests: before any test module is imported it plugs the learner's functions in (workspace.install),
so `from minigrpo.objectives.advantages import group_advantages` in a test file gets the learner's; it then writes
each test's outcome, assertion message and Hypothesis' smallest failing example to a JSON report.

Environment: MINIGRPO_LEARN_DIR (the workspace), MINIGRPO_LEARN_ONLY (comma-separated function names),
MINIGRPO_LEARN_REPORT (where the JSON goes).
"""

from __future__ import annotations

import json
import os
import re

_results: list[dict] = []


def pytest_configure(config):
    from minigrpo.learn.workspace import install

    folder = os.environ.get("MINIGRPO_LEARN_DIR")
    if folder:
        only = os.environ.get("MINIGRPO_LEARN_ONLY")
        install(folder, set(only.split(",")) if only else None)


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
    return text.split("\nassert ")[0].strip()  # the author's message, not pytest's rewritten expression


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = "passed" if report.passed else ("skipped" if report.skipped else "failed")
        entry = {"test": report.nodeid, "outcome": outcome}
        if report.failed:
            entry.update(message=_message(report), example=falsifying_example(report.longreprtext))
        _results.append(entry)


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("MINIGRPO_LEARN_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(_results, f)
