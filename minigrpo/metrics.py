"""Draw RL runs' metrics.png on request, and sum each run up in a few lines.

    python -m minigrpo.metrics runs/compare-pizza/grpo-s0 ...

(an RL run draws its own at the end unless --no-plot, as compare's runs do). The summary: the steps
taken, why the run stopped, its final exact target rate, its drift and malformed mass at the end and
at their worst, and whether it stayed within the quality bars (tools/bars.py), naming each bar it
missed."""

from __future__ import annotations

import argparse
import errno
import sys
import textwrap
from pathlib import Path

from minigrpo.util.jsonl import read_json


def summary(folder: Path, rows: list[dict]) -> str:
    """A few lines on the run in `folder`: its metrics.jsonl `rows` and its summary.json (absent:
    the run was interrupted, or is running)."""
    from minigrpo.tools.bars import misses
    from minigrpo.util.cli import UsageError

    ended, why = folder / "summary.json", None
    try:
        why = read_json(ended).get("stop_reason") if ended.is_file() else None
        state = "no summary.json (interrupted, or running)"
    except UsageError as e:  # a damaged summary: said, and the metrics still drawn
        state = str(e)
    steps = rows[-1].get("step", 0) if rows else 0
    head = f"{folder}: {steps} steps; " + (f"stopped: {why}" if why else state)
    last = next((r for r in reversed(rows) if r.get("target_rate") is not None), None)
    if last is None:
        return f"{head}\n  no exact evaluation logged"
    figures = [f"final target {last['target_rate']:.3f}"]
    # a task without other people logs no drift
    for name, digits in (("worst_drift", 3), ("malformed", 4)):
        if last.get(name) is not None and last.get(f"peak_{name}") is not None:
            figures.append(
                f"{name.split('_')[-1]} {last[name]:.{digits}f} (peak "
                f"{last[f'peak_{name}']:.{digits}f})"
            )
    lines = [head, "  " + " | ".join(figures)]
    if last.get("malformed") is not None and last.get("peak_malformed") is not None:
        missed = misses(last)
        lines.append(
            "  " + ("outside the bars: " + "; ".join(missed) if missed else "within every bar")
        )
    return "\n".join(
        textwrap.fill(
            line, 120, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False
        )
        for line in lines
    )


class _Parser(argparse.ArgumentParser):
    # argparse would print its usage and exit 2; main_guard prints one line
    def error(self, message):
        from minigrpo.util.cli import UsageError

        raise UsageError(message)


def main(argv=None):
    """Draw the metrics.png of each RL run folder named on the command line, after its summary."""
    from minigrpo import dpo, grpo, ppo
    from minigrpo.rl.report import draw_figure
    from minigrpo.util.cli import UsageError, main_guard
    from minigrpo.util.jsonl import read_jsonl

    # each algorithm's metrics.png
    panels = {"grpo": grpo.PANELS, "ppo": ppo.PANELS, "dpo": dpo.PANELS}
    parser = _Parser(prog="python -m minigrpo.metrics", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "folders",
        nargs="+",
        metavar="RUN_FOLDER",
        help="an RL run's --out (config.json, metrics.jsonl): writes its metrics.png there",
    )

    @main_guard
    def draw(argv):
        for folder in map(Path, parser.parse_args(argv).folders):
            config = folder / "config.json"
            if (
                not config.is_file()
                or not (folder / "metrics.jsonl").is_file()
                or "algo" not in read_json(config)
            ):
                raise UsageError(f"{str(folder)!r} holds no RL run (config.json and metrics.jsonl)")
            algo = read_json(config)["algo"]
            if algo not in panels:
                raise UsageError(
                    f"{str(folder)!r} holds a {algo!r} run; this minigrpo draws {', '.join(panels)}"
                )
            print(summary(folder, read_jsonl(folder / "metrics.jsonl")))
            try:
                print(f"wrote {draw_figure(folder, panels[algo])}")
            except OSError as e:  # a read-only folder, ...; a full disk is main_guard's
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise
                raise UsageError(
                    f"cannot write {str(folder / 'metrics.png')!r}: {e.strerror or e}"
                ) from None

    draw(list(argv or []))


if __name__ == "__main__":
    main(sys.argv[1:])
