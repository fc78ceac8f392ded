"""CUDA's Multi-Process Service (MPS) for the processes of one command: compare's population
processes on one GPU.

Without MPS, processes on one GPU take turns (time slicing): each has the GPU for a slice, its
kernels alone. A population's step is many small kernels, so the GPU waits for each process's host
between them; under MPS the processes' kernels run side by side (the figures: docs/performance.md,
"On a GPU").

    with own_mps(processes) as why:    # why: None where they share the GPU through MPS, else why
                                       # not (a line)
        run_pool(...)                  # the processes started inside are its clients
    with sharing_gpu(processes, gpu, "auto") as note:   # compare's: the same, and what its first
                                                        # line says of it

The control daemon is this command's own (NVIDIA's way for one job): its pipes and logs in a new
temporary folder, which only the processes started inside are pointed at ($CUDA_MPS_PIPE_DIRECTORY
in their environment), so no other process of the machine goes through it. A small CUDA client
(`PROBE`, the driver through ctypes, no torch) connects first: it starts the MPS server, and where
the server cannot serve (compute mode, rights, another user's server) the daemon is stopped and the
processes take turns, where they would otherwise all fail at their first CUDA call. A watchdog stops
the daemon should this process die without its `finally` (killed); on leaving, it is told to quit.
Where the machine's own MPS already serves (`serving`), nothing is started. None of this on Windows
or macOS.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
CLIENTS_MOST = 48  # an MPS server's client processes on one GPU, Volta and later (16 before)
# a CUDA client: the driver's first call, then a context
PROBE = [
    sys.executable,
    "-c",
    "import ctypes, sys\n"
    "cuda, ctx, dev = ctypes.CDLL('libcuda.so.1'), ctypes.c_void_p(), ctypes.c_int()\n"
    "for code in (cuda.cuInit(0), cuda.cuDeviceGet(ctypes.byref(dev), 0),\n"
    "             cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)):\n"
    "    if code: sys.exit(f'CUDA error {code}')\n",
]
# sh -c: $1.. after $0
WATCHDOG = 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; echo quit | "$2"; rm -rf "$3"'


def serving(environ=None) -> bool:
    """Whether an MPS control daemon serves the processes of this environment: its pipe in
    $CUDA_MPS_PIPE_DIRECTORY (by default /tmp/nvidia-mps, the machine's own)."""
    pipes = (os.environ if environ is None else environ).get(
        "CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"
    )
    return Path(pipes, "control").exists()


def _run(argv: list[str], env: dict, text: str | None = None) -> tuple[bool, str | None]:
    """Run argv to its end (30 s at most), its output to a file, not a pipe (a daemon that kept the
    pipe open would hold the wait to the end) -> (whether what it did is known: it exited, or never
    started; None if it exited 0, else its last line or why not)."""
    with tempfile.TemporaryFile("w+") as out:
        try:
            code = subprocess.run(
                argv,
                env=env,
                input=text,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=30,
            ).returncode
        except (OSError, subprocess.SubprocessError) as e:
            return isinstance(e, OSError), f"{type(e).__name__}: {e}"  # OSError: it never ran
        out.seek(0)
        lines = out.read().strip().splitlines()
    return True, None if code == 0 else lines[-1] if lines else f"exit code {code}"


@contextlib.contextmanager
def own_mps(processes: int, probe: list[str] | None = None):
    """Yield None where the `processes` started inside share the GPU through MPS (this command's own
    daemon, or the machine's), else why not, one line (they then take turns); os.environ points at
    the daemon inside only."""
    if serving():
        yield None
        return
    if processes > CLIENTS_MOST:
        yield f"more processes ({processes}) than an MPS server takes ({CLIENTS_MOST})"
        return
    if shutil.which(CONTROL) is None:
        yield f"no {CONTROL} on PATH"
        return
    folder = Path(tempfile.mkdtemp(prefix="minigrpo-mps-"))
    ours = {
        "CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(folder / "log"),
    }
    env = {**os.environ, **ours}
    for path in ours.values():
        Path(path).mkdir()
    known, why = _run([CONTROL, "-d"], env)
    # a start that ran past its time may have started it: it is told to quit
    started = why is None or not known
    watchdog = None
    try:
        if why is None:
            watchdog = subprocess.Popen(
                ["sh", "-c", WATCHDOG, "watchdog", str(os.getpid()), CONTROL, str(folder)],
                env=env,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                # its own session: a Ctrl-C does not reach it
                stderr=subprocess.DEVNULL,
            )
            why = _run(probe or PROBE, env)[1]
            why = None if why is None else f"its server did not serve a CUDA client: {why}"
        if why is not None:
            yield f"MPS did not start: {why}"
            return
        previous = {k: os.environ.get(k) for k in ours}
        os.environ.update(ours)
        try:
            yield None
        finally:
            for k, v in previous.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
    finally:
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()
        if started:
            _run([CONTROL], env, "quit\n")
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def sharing_gpu(processes: int, gpu: bool, mps: str = "auto"):
    """Around `processes` that share one GPU: CUDA's Multi-Process Service, so that their kernels
    overlap where they would take turns. mps: "auto" (a daemon of this command's own where none
    serves: own_mps), "off", or "machine" (only the machine's own: under torchrun, whose ranks would
    each start one) -> yields what compare adds to its first line (nothing where one process, or the
    CPU's cores, run them)."""
    if not gpu or processes < 2:
        yield ""
    elif serving():
        yield " (sharing the GPU through the machine's CUDA MPS)"
    elif mps != "auto":
        yield " (on one GPU they take turns: " + (
            "--mps auto overlaps them)"
            if mps == "off"
            else "CUDA MPS overlaps them: `nvidia-cuda-mps-control -d` first)"
        )
    else:
        with own_mps(processes) as why:
            yield (
                " (sharing the GPU through CUDA MPS, a daemon of this command's own)"
                if why is None
                else f" (on one GPU they take turns: {why})"
            )
