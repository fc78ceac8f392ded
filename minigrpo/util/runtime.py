"""What a run runs on: torch's CPU threads and the device, chosen once at a command's start
(`setup_runtime`).

Every CLI defaults to one thread, so that a seed gives the same figures whatever else the machine is
doing, and so that runs side by side (compare's workers, bench's pairs) never compete for cores
inside one process. `--threads 0` takes the idle cores (`auto_threads`); `python -m minigrpo.bench
--only threads` measures both cases, idle and beside a busy neighbour.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from minigrpo.util.cli import UsageError


def cores() -> int:
    """The CPU cores this process may use (its affinity where the system has one, else every
    core)."""
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


def auto_threads(load: tuple[float, int] | None = None) -> int:
    """Threads for --threads 0: the cores nobody else is using, at least 1. load: (1-minute load
    average, tasks running now besides this process); None reads them (`busy_now`).

    Beside a busy neighbour, OpenMP threads that spin-wait for a core another process holds make a
    step slower than one thread (`bench --only threads`; docs/performance.md), so we only take idle
    cores. The load average lags (a neighbour that started seconds ago is hardly in it) and the
    running count is a snapshot (it misses a neighbour between its bursts), so a core counts as busy
    if either says so.
    """
    n = cores()
    average, running = busy_now() if load is None else load
    busy = max(average, running)
    return max(1, min(n, int(n - busy + 0.5)))


def busy_now(loadavg: str | None = None) -> tuple[float, int]:
    """(the 1-minute load average, the tasks running right now other than this one), from
    /proc/loadavg's first and fourth fields on Linux (loadavg: its text, None reads it; "0.61 0.85
    0.87 2/80 2179": 2 running, this process one of them); elsewhere the load average alone (every
    core busy where there is none: one thread)."""
    try:
        fields = (Path("/proc/loadavg").read_text() if loadavg is None else loadavg).split()
        return float(fields[0]), max(0, int(fields[3].split("/")[0]) - 1)
    except (OSError, IndexError, ValueError):
        return (os.getloadavg()[0] if hasattr(os, "getloadavg") else float(os.cpu_count() or 1)), 0


def on_gpu(device: str) -> bool:
    """Whether runs of --device `device` use a GPU: cuda, or auto with one present."""
    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def check_device(device: str) -> None:
    """A UsageError unless `device` is auto, cpu, or cuda with a CUDA GPU at hand."""
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"--device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            "--device cuda was asked for but no CUDA GPU is available (use --device cpu)"
        )


def setup_runtime(threads: int, device: str, seed: int | None = None) -> torch.device:
    """Set torch's thread count (0 = auto, see `auto_threads`) and pick the device ('auto' = cuda if
    available, else cpu). `python -m minigrpo.bench` measures the thread settings."""
    if threads < 0:
        raise UsageError(f"--threads must be >= 0 (0 = auto), got {threads}")
    torch.set_num_threads(threads or auto_threads())
    check_device(device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    # every generator a reward can reach draws from --seed: torch's, Python's, numpy's
    if seed is not None:
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
    return torch.device(device)


def global_rng_state() -> dict:
    """The global generators a user's reward may draw from (torch's CPU one, Python's random,
    numpy's), as plain numbers and lists: checkpoints load with weights_only, and --resume restores
    them (set_global_rng_state)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }


def set_global_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
