"""A line now and then on a lockstep population's steps, for the terminal of the command that runs
it.

    progress = Progress(runs)   # the population's runs (rl/loop.Run), once they have begun
    progress.tick(runs)         # after each step, with the runs still going: a line every EVERY_S
                                # seconds

compare says a run's line only as it ends, and a population's runs end together: a GPU's population
of 128 runs would otherwise say nothing for most of a minute, and a CPU's for longer. The line names
the population's runs, the step, the seconds, and the exact target rate of the runs still going,
median (min–max): quality as it goes.
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
