"""Many runs in a few long-lived worker processes: compare's pool.

A run as its own `python -m minigrpo.grpo` process pays Python's start, torch's import, its exit and
its metrics.png around a few seconds of steps: a large share of a sweep (docs/performance.md). Here
`jobs` worker processes (one per core, one thread each) import once and run their share of the runs
one after another IN PROCESS, each through the very `main(argv)` its command line would run
(`run_in_process`). The commands' mains come from the caller ({module name: main}, compare's
MAINS): the tools sit below the commands (tests/test_layers.py), so nothing here imports one, by
name or otherwise. Nothing of a run outlives it: every random generator it draws from is seeded
from its own --seed when it starts (rl.Run: torch's global generator and one per purpose), and its
model, π_ref, anchor and optimiser are its own (loading them again costs a run little: not worth a
cache), so a pooled run writes the same metrics.jsonl as the separate process `python -m <module>
<argv>` (tests/test_compare.py checks it). One thing is shared by design: a reward given as
`package.module:function` is imported once per worker, so a reward that keeps state in its module
sees the earlier runs' calls (a `file.py:function` is loaded afresh for every run).

Ctrl-C reaches the workers too (the terminal signals the whole process group): a run in flight
finishes its step, writes its checkpoint and ends as interrupted, as a separate process would; no
further run starts, and `run_pool` raises KeyboardInterrupt once the runs in flight have ended and
been reported (a second Ctrl-C: at once). A worker that dies (killed, out of memory) fails its run
only; a fresh worker takes its place.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import shutil
import signal
import threading
import traceback
from contextlib import redirect_stderr, redirect_stdout
from multiprocessing.connection import wait
from pathlib import Path

from minigrpo.tools.stamps import STAMP, stamp_of
from minigrpo.util.outputs import release_out
from minigrpo.util.parent import signal_on_parent_death


def run_in_process(main, argv: list[str]) -> str | None:
    """Run a command's `main(argv)` here (what `python -m <its module> <argv>` runs), its output
    captured; -> None if it succeeded, else the last line its process would have printed (its
    error)."""
    out, err = io.StringIO(), io.StringIO()
    # a run stops on Ctrl-C as a process does
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            return run_main(main, argv, out, err)
    finally:
        signal.signal(signal.SIGINT, previous)


def run_main(main, argv: list[str], out: io.StringIO, err: io.StringIO) -> str | None:
    """A command's main(argv), whose output goes to out and err -> None if it succeeded, else its
    error line."""
    try:
        main(argv)
        return None
    except SystemExit as e:
        if e.code in (None, 0):
            return None
        lines = (err.getvalue() or out.getvalue()).strip().splitlines()
        return lines[-1] if lines else f"exit code {e.code}"
    except KeyboardInterrupt:  # before main's own handler took over
        return "interrupted"
    except Exception as e:  # what an uncaught exception's traceback ends with
        return traceback.format_exception_only(e)[-1].strip()


def brief(error: str, most: int = 200) -> str:
    """An error's first line, cut to `most` characters, for a terminal (CUDA's out-of-memory line
    runs past 1,000)."""
    line = error.splitlines()[0] if error.strip() else error
    return line if len(line) <= most else line[: most - 1] + "…"


def run_one(task, mains: dict, runner=run_in_process) -> str | None:
    """One run, in a worker of the pool: its folder made afresh (a run of another command, or an
    unfinished one, is replaced), the command stamped, then its module's main (`mains`: {module
    name: main}) run in process (`runner(main, argv)`); -> its error, or None."""
    _, _, cmd, folder = task  # cmd is [python, "-m", module, ...]
    if cmd[2] not in mains:
        raise ValueError(f"{cmd[2]} is none of the commands given: {', '.join(mains)}")
    try:
        start_folder(task)
    except OSError as e:  # its folder cannot be made afresh: its error, the worker goes on
        return f"{type(e).__name__}: {e}"
    return end_folder(task, runner(mains[cmd[2]], cmd[3:]))


def start_folder(task, lockstep: bool = False) -> None:
    """A run's folder made afresh (a run of another command, or an unfinished one, is replaced), its
    command stamped (and that it runs as a lockstep member: stamps.stamp_of)."""
    _, _, cmd, folder = task
    if folder.exists():
        try:
            shutil.rmtree(folder)
        except OSError as e:  # a file in it it may not remove: the error names the folder
            raise OSError(
                e.errno, f"cannot remove {str(folder)!r} to make the run afresh ({e.strerror or e})"
            ) from None
    folder.mkdir(parents=True)
    (folder / STAMP).write_text(json.dumps(stamp_of(cmd, lockstep)))


def end_folder(task, error: str | None) -> str | None:
    """After a run: its folder's lock released (this worker goes on to other runs); it counts as
    done only with its summary, which a failed run's folder loses -> its error, or None."""
    folder = task[3]
    release_out(folder)
    if error is None and not (folder / "summary.json").exists():
        error = "the run ended without writing its summary.json"
    if error:
        (folder / "summary.json").unlink(missing_ok=True)
    return error


def gpu_note(processes: int, gpu: bool) -> str:
    """What compare's first line says where several of its processes share one GPU: through CUDA's
    Multi-Process Service, where a control daemon serves (one the user started, docs/running.md:
    its pipe where CUDA looks, $CUDA_MPS_PIPE_DIRECTORY or /tmp/nvidia-mps), else in turns; nothing
    where one process, or the CPU's cores, run them. Nothing here starts a daemon."""
    if not gpu or processes < 2:
        return ""
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")) / "control"
    if pipe.exists():
        return " (sharing the GPU through CUDA MPS)"
    return " (on one GPU they take turns; CUDA MPS overlaps them: docs/running.md)"


def _stop_with_parent() -> None:
    """Linux: when this worker's parent dies (killed, out of memory), its run in flight gets one
    Ctrl-C, so it ends at its step with its checkpoint instead of running on alone. The parent-death
    signal (util/parent.py) is SIGUSR1, turned into one SIGINT: it can come more than once, and a
    second Ctrl-C would stop the run at once, without its checkpoint. Elsewhere than Linux the
    worker ends when it next reads the closed pipe."""

    def once(signum, frame):
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        handler = signal.getsignal(signal.SIGINT)  # ignored between two runs
        if callable(handler):
            handler(signal.SIGINT, frame)

    signal.signal(signal.SIGUSR1, once)
    if (
        signal_on_parent_death(signal.SIGUSR1)
        and os.getppid() != multiprocessing.parent_process().pid
    ):
        # the parent died before the request: nobody will send it
        os.kill(os.getpid(), signal.SIGUSR1)


STOPPING_LINE = "Ctrl-C: every run stops at the end of its step (Ctrl-C again to stop at once)"
# in a worker process: the pool's stop event, set on the parent's Ctrl-C (what fn may watch)
STOPPING = []


class StopFlag:
    """The pool's stop event, set once by the parent and seen by every worker: the read end of a
    pipe whose write end the parent alone holds; `set` closes that end, and a reader then sees the
    pipe's end (as it does when the parent dies). No semaphore: a multiprocessing Event's are named
    under 'spawn' and left to the resource tracker when the parent is killed (kill -9), which then
    warns of "leaked semaphore objects" on the terminal."""

    def __init__(self, ctx):
        self._reader, self._writer = ctx.Pipe(duplex=False)

    def __getstate__(self) -> dict:  # a worker gets the read end only
        return {"_reader": self._reader, "_writer": None}

    def set(self) -> None:
        """In the parent: every worker's `is_set` is True from now on."""
        self._writer.close()

    def is_set(self) -> bool:
        return self._reader.poll()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set (or the parent's end) or `timeout` seconds -> whether it is set."""
        return self._reader.poll(timeout)


def _worker(conn, fn, stop) -> None:
    """A worker's life: fn(item) for each item the parent sends, until the parent closes the pipe
    (or resets it: a second Ctrl-C ends the parent before it reads a result sent). It starts with
    Ctrl-C ignored (inherited, see _Worker: an import cut short would print a traceback), which
    `run_in_process` turns back on for the length of a run; after a Ctrl-C (`stop`), no new item
    starts."""
    STOPPING.append(stop)
    _stop_with_parent()
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):
            return
        result = None if stop.is_set() else fn(item)
        try:
            conn.send(result)
        except OSError:  # the parent is gone (_stop_with_parent): nobody to report to
            return


class _Worker:
    def __init__(self, ctx, fn, stop):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, fn, stop), daemon=True)
        main = threading.current_thread() is threading.main_thread()
        # the new process inherits it
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            self.proc.start()
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)
        child.close()
        self.item = None  # what it is working on


def run_pool(fn, items: list, jobs: int, done) -> None:
    """fn(item) for every item in `jobs` worker processes (started fresh with 'spawn': each imports
    what fn needs once; fn and the items are pickled, so fn is a module-level function), calling
    done(item, result) here as each finishes; what done returns (a list of items) is done too. A
    worker that dies gives its item the result "the worker process died (exit code N)". A worker
    with nothing left to do exits while the others still run, so what it holds (a GPU's memory and
    context) goes early."""
    ctx = multiprocessing.get_context("spawn")  # never fork a parent that holds torch's threads
    todo, workers, stop = list(items), [], StopFlag(ctx)
    try:
        workers = [_Worker(ctx, fn, stop) for _ in range(min(jobs, len(todo)))]
        while todo or any(w.item is not None for w in workers):
            for i, w in enumerate(workers):
                if w.item is None and todo:
                    # it died between two runs, or was let go before `done` gave more work
                    if w.conn.closed or not w.proc.is_alive():
                        workers[i] = w = _Worker(ctx, fn, stop)
                    w.item = todo.pop(0)
                    w.conn.send(w.item)
            busy = [w for w in workers if w.item is not None]
            wait([w.conn for w in busy] + [w.proc.sentinel for w in busy])
            for w in busy:
                if w.conn.poll() or not w.proc.is_alive():
                    try:
                        result = w.conn.recv()
                    # it died in this run: the run failed; the next item gets a fresh worker
                    except EOFError:
                        w.proc.join()
                        result = f"the worker process died (exit code {w.proc.exitcode})"
                    item, w.item = w.item, None
                    todo.extend(done(item, result) or ())  # more work it asks for, if any
                    # nothing left for it: it exits now, its memory (a GPU's too) freed for the rest
                    if not todo:
                        w.conn.close()
    except KeyboardInterrupt:  # the runs in flight got the Ctrl-C too: let them checkpoint and end
        stop.set()
        print(f"\n{STOPPING_LINE}", flush=True)
        for w in workers:
            if w.item is not None:
                try:
                    # an interrupted run's error says where it left its checkpoint
                    result = w.conn.recv()
                except (EOFError, OSError):
                    result = None
                item, w.item = w.item, None
                if result is not None:
                    done(item, result)
        raise
    finally:
        # every idle worker told first, so they end side by side (a GPU's context takes a while)
        for w in workers:
            w.conn.close()
        # an idle worker exits at once; one still in a run (an error, a 2nd Ctrl-C) is stopped
        for w in workers:
            w.proc.join(timeout=10 if w.item is None else 0)
            if w.proc.is_alive():
                w.proc.terminate()
                w.proc.join()
