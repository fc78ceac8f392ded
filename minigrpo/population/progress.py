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


class Progress:
    def __init__(self, runs: list, every: float | None = None, clock=time.monotonic):
        # each compare folder's algorithm (tools/algorithms.run_of); another folder: its name
        names = list(dict.fromkeys((run_of(r.out.name) or (r.out.name,))[0] for r in runs))
        more = ", …" * (len(names) > 3)
        self.label = f"{len(runs)} run{'s' * (len(runs) != 1)} of {', '.join(names[:3])}{more}"
        self.every, self.clock = EVERY_S if every is None else every, clock
        self.started = self.last = clock()

    def tick(self, runs: list) -> None:
        now = self.clock()
        if not runs or now - self.last < self.every:
            return
        self.last = now
        rates = [(r.last_eval or {}).get("target_rate") for r in runs]
        rates = [rate for rate in rates if rate is not None]
        quality = ""
        if rates:
            spread = f"({min(rates):.3f}–{max(rates):.3f})"
            quality = f"; exact target rate {statistics.median(rates):.3f} {spread}"
        print(
            f"  {self.label}: step {max(r.step for r in runs)}/{runs[0].cfg.steps} after "
            f"{now - self.started:.0f} s, {len(runs)} going{quality}",
            flush=True,
        )
