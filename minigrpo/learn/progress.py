"""The learner's progress through the path: each exercise's last check (passing or failing) for
the function as it was then, kept in <workspace>/.learn.json (an edit since makes it 'written, not
checked'), each exercise's status, and what the learner does next.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from minigrpo.learn import workspace
from minigrpo.learn.path import PATH, TRAINER, Exercise


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
                f"then: {workspace.command(f'check {ex.number}', folder)}"
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
        f"(the capstone's run); then read {TRAINER}, GRPO in one file: your pieces make its step"
    )
