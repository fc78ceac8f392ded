"""A sampling profiler over threads: where each of the other threads is, every few milliseconds.

    with ThreadSampler() as s:
        run_population(...)              # its members are threads
    s.top(10)                            # [(share, "minigrpo/grpo.py:update"), ...]
    ThreadSampler(roots=["minigrpo/rl/loop.py:run"]).phases   # what run() was calling:
                                                              # {"...:evaluate": n, ...}

Why not cProfile: it sees the thread that enabled it only, and from Python 3.12 it holds
sys.monitoring, which one tool per process may hold. A sample takes every thread's innermost frame
(sys._current_frames): a thread blocked in a wait (Condition.wait, a lock's acquire, join) is
counted as waiting; for the others each function of this project on its stack counts once (its
cumulative share), and the innermost one also as its own time. A thread waiting for the interpreter
lock is counted where it stands, so shares are of the threads' time, not of the wall time.

Periodic, its base: a thread that does something every few seconds while `with` runs (bench's GPU
readings too).
"""

from __future__ import annotations

import collections
import sys
import threading
import time

# a thread parked here is waiting, not working
WAITS = {"wait", "acquire", "_wait_for_tstate_lock", "join"}


def function_name(code) -> str:
    """'minigrpo/<file>.py:<function>' of a code object of this project (or toy_tasks/), else ''."""
    path = code.co_filename.replace("\\", "/")
    for root in ("minigrpo/", "toy_tasks/"):
        if f"/{root}" in path:
            return root + path.split(f"/{root}", 1)[1] + ":" + code.co_name
    return ""


def project_stack(frame) -> list[str]:
    """The functions of this project on a stack from `frame` outwards, innermost first
    (function_name)."""
    names = []
    while frame is not None:
        names.append(function_name(frame.f_code))
        frame = frame.f_back
    return [name for name in names if name]


class Periodic:
    """A daemon thread that calls `tick()` every `every` seconds while `with` runs, until it returns
    False; `start`: when the `with` began (time.perf_counter)."""

    def __init__(self, every: float):
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.start = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every) and self.tick() is not False:
            pass

    def tick(self) -> bool | None:
        raise NotImplementedError


class ThreadSampler(Periodic):
    def __init__(self, every: float = 0.002, roots: tuple = ()):
        super().__init__(every)
        self.roots = set(roots)
        # "root → what it was calling" -> samples
        self.phases: collections.Counter = collections.Counter()
        # function -> samples with it on the stack
        self.cumulative: collections.Counter = collections.Counter()
        # function -> samples with it innermost (of ours)
        self.own: collections.Counter = collections.Counter()
        self.samples = self.waiting = 0

    def tick(self) -> None:
        me = threading.get_ident()  # the sampling thread: every other thread is sampled
        for ident, frame in sys._current_frames().items():
            if ident != me:
                self._sample(frame)

    def _sample(self, frame) -> None:
        self.samples += 1
        if frame.f_code.co_name in WAITS:
            self.waiting += 1
            return
        names = project_stack(frame)
        self.cumulative.update(set(names))
        if names:
            self.own[names[0]] += 1
        if self.roots:  # the innermost root, and what it was calling (the function just inside it)
            k = next((k for k, name in enumerate(names) if name in self.roots), None)
            self.phases[
                "(outside every root)"
                if k is None
                else f"{names[k]} (its own code)"
                if k == 0
                else f"{names[k]} → {names[k - 1].rsplit(':', 1)[1]}"
            ] += 1

    def working(self) -> int:
        return self.samples - self.waiting

    def top(self, n: int, own: bool = False) -> list[tuple[float, str]]:
        """The n functions with the largest share of the working samples: cumulative, or their own
        time."""
        counts = self.own if own else self.cumulative
        return [(c / max(self.working(), 1), name) for name, c in counts.most_common(n)]
