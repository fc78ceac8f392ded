"""compare's population engine: many runs at once in one process, in lockstep where they can be,
else as threads.

    run_population(items, done)           # the pool's items (tools/pool.py): (algo, seed, command,
                                          # folder)
    run_populations(items, jobs, done)    # the items shared out over `jobs` worker processes, a
                                          # population each

In lockstep (population/lockstep.py): runs of minigrpo.grpo or minigrpo.ppo that differ only in
their seeds (and folders), learning rates, rewards, β's and people (GRPO's, and in their recipes:
compare's presets of one μ), whose configuration lockstep supports, train as one computation, each
run a slice of every tensor. The others: as threads, below.

Each run is its command's own `main(argv)` (tools/pool.run_one: the folder made afresh and stamped,
the summary required), in a thread of its own whose run joins the batch (rl/loop.BATCH, member.py).
What a run prints goes to a buffer of its thread, so its error line is reported as the pool reports
it. done(item, error) is called in the calling thread as each run ends.

Where it is meant to pay: a GPU, whose batch is nearly free up to thousands of rows while one small
model's step is launch-bound; what does not batch is each member's own work between batches, one
member after another (docs/performance.md). On a CPU of few cores the arithmetic is the same and the
pool is the default (compare --engine).

Ctrl-C: every member finishes its step, writes its checkpoint and ends as interrupted (a run's own
Ctrl-C), then KeyboardInterrupt is raised here; a second Ctrl-C raises it at once. Departure:
threads share what a process holds once (torch's global generator, Python's `random`): a reward that
draws from them draws a stream the members share.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import io
import multiprocessing
import queue
import signal
import sys
import threading
from dataclasses import asdict

from minigrpo.population.lockstep import KINDS, OWN, QUIET, RECIPES, train_lockstep, unsupported
from minigrpo.population.member import Batcher
from minigrpo.rl.loop import BATCH
from minigrpo.rl.report import INTERRUPTED, STOP_ALL
from minigrpo.tools.pool import (
    STOPPING,
    STOPPING_LINE,
    end_folder,
    run_main,
    run_one,
    run_pool,
    start_folder,
)
from minigrpo.util.cli import UsageError

# the most runs of a population of threads: past it a population runs no faster per run on a GPU,
THREADS_MOST = 16
# and each thread holds memory of its own (docs/performance.md, "Small choices")


def _one_malloc_arena() -> None:
    """glibc gives each new thread a malloc arena of its own, which a population's threads fill and
    fragment: one arena for all holds less resident memory, in the same time (docs/performance.md,
    "Small choices"). M_ARENA_MAX is mallopt's -8; elsewhere than glibc nothing happens."""
    try:
        ctypes.CDLL(None).mallopt(-8, 1)
    except (OSError, AttributeError):
        pass


class _ThreadOutput(io.TextIOBase):
    """sys.stdout or sys.stderr, written to the calling thread's own buffer where it has one."""

    def __init__(self, real):
        self.real, self.buffers = real, {}

    def write(self, s: str) -> int:
        return self.buffers.get(threading.get_ident(), self.real).write(s)

    def flush(self) -> None:
        self.buffers.get(threading.get_ident(), self.real).flush()


# flags, each
PER_MEMBER = {module: tuple("--" + k.replace("_", "-") for k in own) for module, own in OWN.items()}
# with a value, in which a lockstep population's members may differ (lockstep.OWN)


def lockstep_key(item, mixed: bool = True) -> tuple | None:
    """What a run must share with the others of a lockstep population: its trainer and every setting
    but those each member may have of its own (lockstep.OWN: --seed, --out, --lr, --reward, --beta,
    --person; GRPO's recipe, lockstep.RECIPES; mixed=False: its recipe too, but β) (None: its
    trainer has no lockstep, or lockstep does not support its flags, or they are bad)."""
    cmd = item[2]  # [python, "-m", module, flags...]
    if cmd[2] not in KINDS:  # the trainers a lockstep population runs
        return None
    flags, skip, own = [], False, PER_MEMBER[cmd[2]]
    for arg in cmd[3:]:
        if not skip and arg not in own:
            flags.append(arg)
        skip = not skip and arg in own
    cfg = _in_lockstep(cmd[2], tuple(flags))
    if cfg is None:
        return None
    apart = (*OWN[cmd[2]], *QUIET, *(RECIPES[cmd[2]] if mixed else ()))
    return cmd[2], repr([(k, v) for k, v in asdict(cfg).items() if k not in apart])


@functools.lru_cache(maxsize=None)
def _in_lockstep(module: str, flags: tuple):
    """These flags' configuration if lockstep runs it, else None (read once per configuration, not
    once per seed)."""
    try:
        trainer = importlib.import_module(module)
        cfg = trainer.parse(list(flags))
        return cfg if unsupported(trainer, [cfg]) is None else None
    except UsageError:
        return None


def run_lockstep(items: list, done) -> bool:
    """The items as one lockstep population, done(item, error) for each at the end -> False (nothing
    run) where they cannot go in lockstep: another trainer or configuration, a flag lockstep does
    not support, a bad flag."""
    key = lockstep_key(items[0])
    if key is None or any(lockstep_key(item) != key for item in items):
        return False
    trainer = importlib.import_module(key[0])
    try:
        cfgs = [trainer.parse(item[2][3:]) for item in items]
    # a bad value of a member's own (its --lr, say): each run says it, as a thread
    except UsageError:
        return False
    if unsupported(trainer, cfgs) is not None:
        return False
    for item in items:
        start_folder(item)
    try:
        results = train_lockstep(trainer, cfgs, [lambda *a: None] * len(items))
    except Exception as e:  # noqa: BLE001
        # the population's own failure, e.g. the GPU's memory: each run says it
        results = [f"{type(e).__name__}: {e}"] * len(items)
    for item, result in zip(items, results):
        done(item, end_folder(item, result if isinstance(result, str) else None))
    if any(isinstance(r, str) and r.startswith(INTERRUPTED) for r in results):
        raise KeyboardInterrupt
    return True


def run_population(
    items: list, done, batcher: Batcher | None = None, lockstep: bool = True
) -> None:
    """Every item's run at once, done(item, error) as each ends: in lockstep where they can
    (run_lockstep; not with lockstep=False), else run_one(item) in a thread each, their models' work
    one batch. `batcher`: one of the caller's (bench reads the time it spent serving), else a new
    one."""
    if not items or (lockstep and run_lockstep(items, done)):
        return
    batcher, ended = batcher or Batcher(), queue.Queue()
    out, err = _ThreadOutput(sys.stdout), _ThreadOutput(sys.stderr)

    everyone_in = threading.Barrier(len(items))

    def member(key: int, item) -> None:
        me = threading.get_ident()
        out.buffers[me], err.buffers[me] = io.StringIO(), io.StringIO()
        BATCH.set(batcher)
        batcher.enter(key)  # every member from the start: no batch goes before each member is in
        everyone_in.wait()
        try:
            error = run_one(
                item, lambda module, argv: run_main(module, argv, out.buffers[me], err.buffers[me])
            )
        except BaseException as e:  # noqa: BLE001
            # the run's folder step failed: its error, the sweep goes on
            error = f"{type(e).__name__}: {e}"
        finally:
            batcher.leave()
        ended.put((item, error))

    _one_malloc_arena()
    STOP_ALL.clear()
    sys.stdout, sys.stderr = out, err
    left = len(items)
    try:
        threads = [threading.Thread(target=batcher.serve_forever, daemon=True)] + [
            threading.Thread(target=member, args=(k, item), daemon=True)
            for k, item in enumerate(items)
        ]
        for t in threads:
            t.start()
        try:
            while left:
                done(*ended.get())
                left -= 1
        # every member finishes its step, writes its checkpoint and ends as interrupted
        except KeyboardInterrupt:
            STOP_ALL.set()
            # in a pool's worker (run_populations) the pool says it
            if multiprocessing.parent_process() is None:
                print(f"\n{STOPPING_LINE}", file=out.real, flush=True)
            while left:  # a second Ctrl-C raises from here at once
                done(*ended.get())
                left -= 1
            raise
    finally:
        batcher.close()
        sys.stdout, sys.stderr = out.real, err.real


def shares_of(items: list, jobs: int, most: int = 0, mixed: bool = True) -> list[list]:
    """The populations `items` make, each of at most `most` runs (0: no limit). Runs that may go in
    lockstep (lockstep_key; `mixed`: GRPO's recipes together) are grouped by configuration: a group,
    or its nearly equal parts in order (so compare's presets of one GRPO group, over more seeds than
    `most`, go a preset to a part). The others: as many populations as the `jobs` those leave (at
    least one), or more where one would hold over `most` (and THREADS_MOST), dealt in turn (items 0,
    S, 2S, ... to the first), so each gets the same mix of algorithms."""
    groups: dict[tuple, list] = {}
    for item in items:
        groups.setdefault(lockstep_key(item, mixed) or (), []).append(item)
    rest, shares = groups.pop((), []), []
    for group in groups.values():
        n = -(-len(group) // most) if most > 0 else 1
        shares += [group[len(group) * j // n : len(group) * (j + 1) // n] for j in range(n)]
    if rest:
        most = min(most, THREADS_MOST) if most > 0 else THREADS_MOST
        n = max(1, min(jobs - len(shares), len(rest)), -(-len(rest) // most))
        shares += [rest[j::n] for j in range(n)]
    return shares


def run_populations(items: list, jobs: int, done, most: int = 0, mixed: bool = True) -> None:
    """run_population over the shares of the items (shares_of: at most `most` runs each, `mixed` as
    there), each in a worker process of tools/pool.run_pool, `jobs` at a time (jobs = 1: here, one
    after another). Why processes: what does not batch, each member's own Python between batches,
    runs one member after another in a process (one interpreter lock), so it is shared out over the
    cores. Why a limit: each member costs GPU memory, and past a few members a population runs no
    faster per run (docs/performance.md). done(item, error) is called here as each share ends, for
    each of its runs (their progress lines come together)."""
    shares = shares_of(items, jobs, most, mixed)
    if jobs <= 1 or len(shares) == 1:
        for share in shares:
            run_population(share, done)
        return
    run_pool(
        population_share,
        shares,
        min(jobs, len(shares)),
        lambda share, results: _report(share, results, done),
    )


def _report(share: list, results, done) -> None:
    if isinstance(results, str):  # the worker died: every run of its share failed with its error
        results = [(item, results) for item in share]
    for item, error in results:
        done(item, error)


def population_share(items: list) -> list:
    """A pool worker's share: one population -> [(item, error)] of its runs. Ctrl-C (the terminal
    signals the whole process group; the parent's alone sets the pool's stop event) ends every
    member at the end of its step, as in one process."""
    results = []
    # the pool's workers start with it ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    # a Ctrl-C that reached the parent only (kill -INT <pid>) stops the members too
    for stop in STOPPING:
        threading.Thread(target=lambda: stop.wait() and STOP_ALL.set(), daemon=True).start()
    try:
        run_population(items, lambda item, error: results.append((item, error)))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, previous)
    return results
