"""Grading: the library's own tests run against the learner's function, and the capstone's real run.

`check` runs, in a fresh pytest process, every test of the exercise's test files that uses the
function (plus the exercise's extra tests), with the learner's function plugged in by
minigrpo.learn.plugin, which also runs the catalogued mistakes' probes (mistakes.py) on it: the
learner's code runs only there, and this process never imports torch. It prints the mistakes the
function shows, then each broken property (the test's name) with its message and Hypothesis'
smallest failing example. A failing check stops once MAX_BROKEN properties are broken and says how
many tests did not run; a passing one runs them all. The capstone then trains: a real `python -m
minigrpo.grpo --reward pizza` with every function the learner wrote plugged in.

A learner's code may never return: each test has TEST_LIMIT_S (the check then names it and stops), a
check that waits STILL_AFTER_S on one test says which, and the capstone's run has CAPSTONE_LIMIT_S.
Both run in child processes that end with the command (child.run).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import minigrpo
from minigrpo.learn import child, workspace
from minigrpo.learn.path import PATH, TRAINER, Exercise

GOAL = 0.9  # the capstone passes when ravin's exact P(pizza) reaches this
# per test, setup to teardown: 20x the slowest test with the library's bodies (2 cores)
TEST_LIMIT_S = 60
STILL_AFTER_S = 5  # a check that waits this long on one thing says what it waits for
# past TEST_LIMIT_S, a test that its own alarm did not stop has its process killed
KILL_AFTER_S = 15
CAPSTONE_LIMIT_S = 600  # the capstone's training run
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
        if not report.exists():  # pytest could not even start
            tail = (out + err).strip().splitlines()[-3:]
            return {
                **empty,
                "results": [
                    {
                        "test": "collection",
                        "outcome": "failed",
                        "message": " | ".join(tail),
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


def _property(node_id: str) -> str:
    name = node_id.split("::")[-1].split("[")[0]
    return name.removeprefix("test_").replace("_", " ")


def _short(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _source_hash(ex: Exercise, folder) -> str:
    return hashlib.sha1(workspace.function_source(ex, folder).encode()).hexdigest()[:12]


def progress_file(folder) -> Path:
    return Path(folder) / ".learn.json"


def load_progress(folder) -> dict:
    path = progress_file(folder)
    return json.loads(path.read_text()) if path.exists() else {}


def save_progress(folder, progress: dict) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    progress_file(folder).write_text(json.dumps(progress, indent=1, sort_keys=True))


def record(ex: Exercise, folder, passed: bool) -> None:
    """Remember ex's outcome for the learner's function as it is now (a change makes it 'written,
    not checked')."""
    progress = load_progress(folder)
    progress[ex.name] = {
        **progress.get(ex.name, {}),
        "status": "passing" if passed else "failing",
        "hash": _source_hash(ex, folder),
    }
    save_progress(folder, progress)


def graded_status(ex: Exercise, folder, run: bool = True) -> str:
    """'not started', 'stub written', 'does not load', 'failing', 'passing', or 'written, not
    checked' (changed since the last check). run=False reads the learner's file without running it
    (no torch import here)."""
    state = workspace.status(ex, folder) if run else workspace.read(ex, folder)[0]
    if state != "written":
        return {"stub": "stub written"}.get(state, state)
    last = load_progress(folder).get(ex.name, {})
    return (
        last.get("status", "written, not checked")
        if last.get("hash") == _source_hash(ex, folder)
        else "written, not checked"
    )


def next_step(folder, run: bool = True) -> str | None:
    """What the learner does next: for the first exercise not passing, the command (and what to do
    before it); None when every exercise passes."""
    for ex in PATH:
        state = graded_status(ex, folder, run)
        if state == "not started":
            return workspace.command(f"start {ex.number}", folder)
        if state == "stub written":
            return (
                f"write exercise {ex.number} {ex.name} in {workspace.learner_file(ex, folder)}, "
                "then: "
                f"{workspace.command(f'check {ex.number}', folder)}"
            )
        if state != "passing":
            verb = "" if state.startswith("does ") else "is "  # 'failing', 'does not load', ...
            return (
                f"{workspace.command(f'check {ex.number}', folder)}    (exercise {ex.number} "
                f"{verb}{state})"
            )
    return None


def the_end(folder) -> str:
    """The path's last word, once every exercise passes."""
    return (
        f"every exercise passes: {workspace.command('check --all', folder)} trains the model "
        "with your pieces "
        f"(the capstone's run); then read {TRAINER}, the whole trainer in one file, your pieces "
        "assembled"
    )


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
        f"{n_run - len(failed)} of {n_run} "
        f"tests pass{more}"
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
            f"  the check stopped after {len(by_property)} broken properties: {not_run} more "
            "tests did not run "
            "(fix these, then check again)"
        )
    if not passed:
        log(f"  hint: {workspace.command(f'hint {ex.number}', folder)}")
    elif say_next:
        step = next_step(folder, run=False)
        log(f"  passing. Next: {step}" if step else f"  passing. {the_end(folder)}")
    return passed


def pretrained_model(root: Path) -> Path:
    """The checkpoint the capstone starts from by default: `python -m minigrpo.pretrain`'s, in the
    repository."""
    return root / "runs" / "pretrain" / "model.pt"


def capstone(
    folder, log=print, extra_args: tuple[str, ...] = (), init=None
) -> tuple[bool, float | None]:
    """Train with every function the learner wrote plugged in, from `init` (default: the
    repository's runs/pretrain/model.pt) -> (P(pizza) >= GOAL, the final P(pizza)); (False, None)
    and "pretrain first" when there is no pretrained model to start from."""
    root = repo_root()
    init = Path(init).resolve() if init is not None else pretrained_model(root)
    if not init.is_file():
        log(
            f"capstone: no pretrained model at {init}: pretrain first: python -m minigrpo.pretrain "
            f"(in {root}), then run the capstone again"
        )
        return False, None
    out = Path(folder).resolve() / "capstone"
    plugged = [ex for ex in PATH if workspace.status(ex, folder) == "written"]
    log(
        "capstone: python -m minigrpo.grpo --reward pizza with your "
        f"{', '.join(e.name for e in plugged)}"
    )
    argv = ["--reward", "pizza", "--init", str(init), "--out", str(out), "--overwrite", *extra_args]
    code = (
        "import sys; from minigrpo.learn.child import die_with_parent; die_with_parent(); "
        "from minigrpo.learn.workspace import install; install(sys.argv[1]); "
        "from minigrpo.grpo import main; main(sys.argv[2:])"
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    returncode, stdout, stderr = child.run(
        [sys.executable, "-c", code, str(Path(folder).resolve()), *argv],
        watch=lambda elapsed: elapsed > CAPSTONE_LIMIT_S,
        cwd=root,
        env=env,
    )
    lines = (stdout + stderr).strip().splitlines()
    for line in lines[-4:]:
        log("  " + line)
    summary = out / "summary.json"
    rate = (
        json.loads(summary.read_text()).get("target_rate")
        if summary.exists() and returncode is not None
        else None
    )
    ok = returncode == 0 and rate is not None and rate >= GOAL
    if ok:
        log(
            f"capstone passed: your GRPO took ravin's exact P(pizza) to {rate:.3f} (>= {GOAL}); "
            f"the metrics: {out / 'metrics.png'}"
        )
        lines = len((root / TRAINER).read_text().splitlines()) if (root / TRAINER).exists() else 0
        log(
            f"  now read {TRAINER}: the whole trainer in one file ({lines} lines), with your "
            "pieces assembled: "
            "the group advantages, grpo_loss from the clipped surrogate, the KL and the "
            "aggregation, and the step"
        )
        return True, rate
    if returncode is None:
        log(
            f"capstone: the run ran past {CAPSTONE_LIMIT_S} s: does one of your functions loop "
            "forever?"
        )
    else:
        log(
            f"capstone: the run did not learn: ravin's exact P(pizza) ended at "
            f"{'n/a' if rate is None else f'{rate:.3f}'} (needs >= {GOAL}); the metrics: "
            f"{out / 'metrics.png'}"
        )
    broken = [
        ex
        for ex in plugged
        if any(r["outcome"] == "failed" for r in run_tests(ex, folder)["results"])
    ]
    for ex in broken:
        log(
            f"  revisit exercise {ex.number} {ex.name}: it fails its own tests "
            f"({workspace.command(f'check {ex.number}', folder)})"
        )
    if not broken:
        log(
            "  every piece you wrote passes its tests: look at how grpo_loss puts them together "
            "(exercise 12)"
        )
    return False, rate
