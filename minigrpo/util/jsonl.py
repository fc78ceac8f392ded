"""Run records as files: one JSON object per line (metrics.jsonl), strict JSON (no NaN), read back."""

from __future__ import annotations

import json
import math
from pathlib import Path


class JsonlLogger:
    """Appends one JSON object per call to `path`, flushed at once (a crash loses nothing written)."""

    def __init__(self, path, truncate_after_step: int | None = None):
        self.path = Path(path)
        if truncate_after_step is not None and self.path.exists():  # resume: drop rows past the checkpoint
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


def strict_json(row: dict) -> dict:
    """NaN and ±inf are not JSON: write them as null, so every line parses with a strict parser."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def read_json(path) -> dict:
    return json.loads(Path(path).read_text())


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
