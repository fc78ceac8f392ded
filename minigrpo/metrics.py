"""Metrics: one JSON object per line (metrics.jsonl) and a grid of plots (PNG).

    python -m minigrpo.metrics runs/compare-pizza/grpo-s0 ...   # draw RL runs' metrics.png on request

(an RL run draws its own at the end unless --no-plot, as compare's runs do). matplotlib is imported here
only, and lazily, so no algorithm module pulls in a plotting library.
"""

from __future__ import annotations

import json
import math
import sys
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


def combine_stats(per_update: list[dict]) -> dict:
    """One step's statistics from its inner updates': the mean of each key, except maxima (`*_max`),
    which stay maxima."""
    keys = dict.fromkeys(k for d in per_update for k in d)
    values = {k: [d[k] for d in per_update if k in d] for k in keys}
    return {k: max(v) if k.endswith("_max") else sum(v) / len(v) for k, v in values.items()}


def strict_json(row: dict) -> dict:
    """NaN and ±inf are not JSON: write them as null, so every line parses with a strict parser."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def read_json(path) -> dict:
    return json.loads(Path(path).read_text())


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_panels(rows: list[dict], panels: list[tuple[str, list[str]]], path, x: str = "step",
                ncols: int = 3, title: str | None = None) -> None:
    """One subplot per (title, [keys]) panel, all sharing the x axis; rows missing a key are skipped.

    Drawn for speed (a default GRPO run's 14 panels: 0.55 s instead of 1.2 s with matplotlib's import, one CPU
    thread): a bare Figure on the Agg canvas (pyplot is never imported), margins fixed in inches instead of
    tight_layout (which draws every tick label once more to measure it), titles at a fixed height (matplotlib
    otherwise measures each axis' tick labels to place them)."""
    from matplotlib.figure import Figure

    panels = [(t, keys) for t, keys in panels if any(k in r for r in rows for k in keys)]
    if not panels:
        return
    nrows = math.ceil(len(panels) / ncols)
    width, height = 4.2 * ncols, 2.8 * nrows + (0.4 if title else 0)
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=0.6 / width, right=1 - 0.15 / width, bottom=0.5 / height,
                        top=1 - (0.75 if title else 0.35) / height, wspace=0.25, hspace=0.3)
    axes = fig.subplots(nrows, ncols, sharex=True, squeeze=False)
    for ax, (panel_title, keys) in zip(axes.flat, panels):
        for key in keys:
            pts = [(r[x], r[key]) for r in rows if key in r and r[key] is not None and x in r]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=key, lw=1.2, marker="." if len(pts) < 30 else None)
        ax.set_title(panel_title, fontsize=9, y=1.0, pad=4)
        ax.locator_params(nbins=5)  # matplotlib's default (up to 10) builds twice the tick objects
        ax.grid(alpha=0.3)
        if len(keys) > 1 and ax.lines:
            ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel(x)
    if title:
        fig.suptitle(title, y=1 - 0.1 / height, va="top")
    fig.savefig(path, dpi=90)


def main(argv=None):
    """Draw the metrics.png of each RL run folder named on the command line."""
    from minigrpo.util.cli import UsageError, main_guard
    from minigrpo.rl.report import draw_figure

    @main_guard
    def draw(folders):
        if not folders or any(f.startswith("-") for f in folders):
            raise UsageError("usage: python -m minigrpo.metrics RUN_FOLDER [RUN_FOLDER ...] (an RL run's --out)")
        for folder in map(Path, folders):
            config = folder / "config.json"
            if not config.is_file() or not (folder / "metrics.jsonl").is_file() or "algo" not in read_json(config):
                raise UsageError(f"{str(folder)!r} holds no RL run (config.json and metrics.jsonl)")
            print(f"wrote {draw_figure(folder)}")
    draw(list(argv or []))


if __name__ == "__main__":
    main(sys.argv[1:])
