"""Draw RL runs' metrics.png on request.

    python -m minigrpo.metrics runs/compare-pizza/grpo-s0 ...

(an RL run draws its own at the end unless --no-plot, as compare's runs do)."""

from __future__ import annotations

import errno
import sys
from pathlib import Path

from minigrpo.util.jsonl import read_json


def main(argv=None):
    """Draw the metrics.png of each RL run folder named on the command line."""
    from minigrpo import dpo, grpo, ppo
    from minigrpo.rl.report import draw_figure
    from minigrpo.util.cli import UsageError, main_guard

    panels = {"grpo": grpo.PANELS, "ppo": ppo.PANELS, "dpo": dpo.PANELS}  # each algorithm's metrics.png

    @main_guard
    def draw(folders):
        if not folders or any(f.startswith("-") for f in folders):
            raise UsageError("usage: python -m minigrpo.metrics RUN_FOLDER [RUN_FOLDER ...] (an RL run's --out)")
        for folder in map(Path, folders):
            config = folder / "config.json"
            if not config.is_file() or not (folder / "metrics.jsonl").is_file() or "algo" not in read_json(config):
                raise UsageError(f"{str(folder)!r} holds no RL run (config.json and metrics.jsonl)")
            algo = read_json(config)["algo"]
            if algo not in panels:
                raise UsageError(f"{str(folder)!r} holds a {algo!r} run; this minigrpo draws {', '.join(panels)}")
            try:
                print(f"wrote {draw_figure(folder, panels[algo])}")
            except OSError as e:  # a read-only folder, ...; a full disk is main_guard's
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise
                raise UsageError(f"cannot write {str(folder / 'metrics.png')!r}: {e.strerror or e}") from None
    draw(list(argv or []))


if __name__ == "__main__":
    main(sys.argv[1:])
