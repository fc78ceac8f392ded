"""A line every EVERY_S seconds on a lockstep population's steps (compare says a run's line only as
it ends, and a population's runs end together): its runs, the step, the seconds, and the exact
target rate of the runs still going, median (min–max).

    progress = Progress(runs)   # rl/loop.Run's, once they have begun
    progress.tick(runs)         # after each step, with the runs still going
"""

from __future__ import annotations

import statistics
import time

from minigrpo.tools.algorithms import run_of

EVERY_S = 10.0


def _name(run) -> str:
    """The algorithm of a compare run's folder (tools/algorithms.run_of); another folder: its
    name."""
    return (run_of(run.out.name) or (run.out.name,))[0]


class Progress:
    def __init__(self, runs: list, every: float | None = None, clock=time.monotonic):
        names = list(dict.fromkeys(_name(r) for r in runs))
        self.label = (
            f"{len(runs)} run{'s' * (len(runs) != 1)} of "
            f"{', '.join(names[:3])}{', …' * (len(names) > 3)}"
        )
        self.every, self.clock = EVERY_S if every is None else every, clock
        self.started = self.last = clock()

    def tick(self, runs: list) -> None:
        now = self.clock()
        if not runs or now - self.last < self.every:
            return
        self.last = now
        rates = [
            r.last_eval["target_rate"]
            for r in runs
            if (r.last_eval or {}).get("target_rate") is not None
        ]
        quality = (
            f"; exact target rate {statistics.median(rates):.3f} "
            f"({min(rates):.3f}–{max(rates):.3f})"
            if rates
            else ""
        )
        print(
            f"  {self.label}: step {max(r.step for r in runs)}/{runs[0].cfg.steps} after "
            f"{now - self.started:.0f} s, {len(runs)} going{quality}",
            flush=True,
        )
