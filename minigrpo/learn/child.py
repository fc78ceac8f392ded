"""Running a learner's code safely: a time limit on it, and child processes that end with the
command.

`run` starts a child (the grading pytest, the capstone's training run) that cannot outlive the
command: the command's SIGTERM and SIGHUP become a SystemExit while it waits, its Ctrl-C a
KeyboardInterrupt, and on every way out the child is terminated, then killed. The child leads a
process group of its own (a session: the terminal's Ctrl-C reaches the command, which ends it), so
the processes a learner's code started in it (`subprocess.Popen`, `multiprocessing`) end with it:
the group is killed once the child has ended. Where the command itself is killed (SIGKILL), the
child, having called `die_with_parent` first, is killed by Linux (PR_SET_PDEATHSIG); what it started
is then left (a process that leaves the group with its own session, too). `time_limit` stops a
learner's code in this process that has run too long, with `RanPastLimit`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from typing import Callable

from minigrpo.util.parent import signal_on_parent_death

PARENT_ENV = "MINIGRPO_LEARN_PARENT"  # the pid of the command, in its child's environment
POLL_S = 0.5  # how often `run` asks `watch` whether to go on


class RanPastLimit(BaseException):
    """A learner's code ran past its time limit. A BaseException, so that neither a learner's
    `except Exception` nor Hypothesis (which shrinks on Exception) holds it up."""


def ran_past(test: str, limit: float) -> str:
    """The line that tells a learner which test ran out of time."""
    return f"{test} ran past {limit:g} s: does your function loop forever?"


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def time_limit(seconds: float, message: str):
    """Raise RanPastLimit(message) in the block when it runs past `seconds` (SIGALRM: the main
    thread only; elsewhere, without SIGALRM, or with seconds <= 0, no limit). Code stuck in one C
    call is stopped when it returns."""
    if seconds <= 0 or not _main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        raise RanPastLimit(message)

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if old is None else old)


def die_with_parent() -> None:
    """In a child started by `run`: be killed when the command that started it dies, however it dies
    (Linux); exit now if it has died already."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not signal_on_parent_death(signal.SIGKILL):
        return
    # the command died before the prctl: nobody waits for this child
    if os.getppid() != int(parent):
        os._exit(1)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


@contextmanager
def _signals_end_the_wait():
    """SIGTERM and SIGHUP raise SystemExit in the block (so that the caller's `finally` runs)."""
    names = [
        s
        for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None))
        if s is not None
    ]
    old = {s: signal.signal(s, _raise_exit) for s in names} if _main_thread() else {}
    try:
        yield
    finally:
        for s, handler in old.items():
            if handler is not None:
                signal.signal(s, handler)


def stop(proc: subprocess.Popen, grace_s: float = 3.0, group: bool = False) -> None:
    """End proc: SIGTERM, then SIGKILL if it has not ended after grace_s; with `group` (proc leads a
    process group of its own: `run`'s children), then SIGKILL to what is left of that group, the
    processes proc started and left behind."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if group:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the group is gone: nothing was left
            pass


def run(
    cmd: list[str], watch: Callable[[float], bool] | None = None, env: dict | None = None, **popen
) -> tuple[int | None, str, str]:
    """Run cmd to its end, its output captured; `watch(seconds since the start)` is called every
    POLL_S seconds and stops the child when it returns True. -> (exit code, None when watch stopped
    it; stdout; stderr)."""
    env = {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}
    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
        _signals_end_the_wait(),
    ):
        start = time.monotonic()
        own_group = hasattr(os, "killpg")  # POSIX
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=err,
            env=env,
            text=True,
            start_new_session=own_group,
            **popen,
        )
        try:
            code = None
            while code is None:
                try:
                    code = proc.wait(timeout=POLL_S)
                except subprocess.TimeoutExpired:
                    if watch is not None and watch(time.monotonic() - start):
                        break
        finally:
            stop(proc, group=own_group)
        out.seek(0)
        err.seek(0)
        return code, out.read(), err.read()
