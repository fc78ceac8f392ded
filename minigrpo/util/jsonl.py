"""Run records as files: one JSON object per line (metrics.jsonl) and JSON files, strict JSON
(non-finite numbers as null), read back so that a line torn by a crash or a full disk costs that
line only."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from minigrpo.util.cli import UsageError


class JsonlLogger:
    """Appends one JSON object per call to `path`, each line in one write, flushed at once (a crash
    loses nothing written). On resume (truncate_after_step), the rows past the checkpoint and a torn
    last line are dropped."""

    def __init__(self, path, truncate_after_step: int | None = None):
        self.path = Path(path)
        # resume: drop rows past the checkpoint
        if truncate_after_step is not None and self.path.exists():
            rows = [r for r in read_jsonl(self.path) if r.get("step", 0) <= truncate_after_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        elif truncate_after_step is None:
            self.path.write_text("")
        self._f = open(self.path, "a")

    def log(self, row: dict) -> None:
        self._f.write(json.dumps(strict_json(row), allow_nan=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def strict_json(obj):
    """NaN and ±inf are not JSON: the same object with every non-finite float (in dicts and lists,
    at any depth) as None, so that what we write parses with a strict parser."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def read_json(path) -> dict:
    """A JSON file holding one object; a UsageError (one line) naming the file otherwise."""
    try:
        obj = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is not readable JSON ({type(e).__name__})") from None
    if not isinstance(obj, dict):
        raise UsageError(f"{path} holds a JSON {type(obj).__name__}, not an object")
    return obj


def read_jsonl(path) -> list[dict]:
    """The rows of a JSONL file. A torn LAST line (a write cut short by a crash or a full disk) is
    skipped with one warning on stderr; a bad line anywhere else is a UsageError (one line) naming
    it."""
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not text: not a run's JSONL file") from None
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    rows = []
    for i, line in lines:
        try:
            rows.append(json.loads(line))
            if not isinstance(rows[-1], dict):
                raise UsageError(f"{path}: line {i} is not a JSON object ({line[:40]!r})")
        except json.JSONDecodeError:
            if i != lines[-1][0]:
                raise UsageError(f"{path}: line {i} is not JSON ({line[:40]!r}...)") from None
            print(
                f"warning: {path}: its last line is torn (a write cut short); skipped it",
                file=sys.stderr,
            )
    return rows
