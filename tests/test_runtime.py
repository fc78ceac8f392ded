"""runtime.py: --threads 0 takes only idle cores (by the load average and by what runs right now),
bad values are one-line errors."""

import pytest
import torch

from minigrpo.util import runtime
from minigrpo.util.cli import UsageError


@pytest.mark.parametrize(
    "cores,load,threads",
    [
        (2, (0.1, 0), 2),  # idle: both cores
        # a neighbour started seconds ago: the load average does not show it yet, the running count
        # does
        (2, (0.2, 1), 1),
        (2, (1.2, 0), 1),  # a neighbour between its bursts: the load average still shows it
        (2, (3.0, 3), 1),  # more busy than cores: still one thread
        (8, (2.4, 1), 6),
        (8, (0.0, 0), 8),
        (1, (0.0, 0), 1),
    ],
)
def test_auto_threads_takes_only_the_idle_cores(monkeypatch, cores, load, threads):
    monkeypatch.setattr(
        runtime.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False
    )
    assert runtime.auto_threads(load) == threads


def test_busy_now_reads_loadavg_and_leaves_this_process_out():
    assert runtime.busy_now("0.61 0.85 0.87 2/80 2179") == (0.61, 1)
    assert runtime.busy_now("0.00 0.01 0.05 1/80 2179") == (0.0, 0)
    # unreadable: the load average alone, nothing running
    average, running = runtime.busy_now("not a loadavg")
    assert average >= 0 and running == 0
    average, running = runtime.busy_now()
    assert average >= 0 and running >= 0


def test_setup_runtime_sets_threads_and_device_and_rejects_bad_values(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    try:
        assert (
            runtime.setup_runtime(1, "cpu") == torch.device("cpu") and torch.get_num_threads() == 1
        )
        # --threads 0 on an idle 2-core machine
        monkeypatch.setattr(runtime, "busy_now", lambda: (0.3, 0))
        runtime.setup_runtime(0, "cpu")
        assert torch.get_num_threads() == 2
        monkeypatch.setattr(runtime, "busy_now", lambda: (0.3, 1))  # ... beside a running neighbour
        runtime.setup_runtime(0, "cpu")
        assert torch.get_num_threads() == 1
        with pytest.raises(UsageError, match="--threads must be >= 0"):
            runtime.setup_runtime(-1, "cpu")
        with pytest.raises(UsageError, match="--device must be auto, cpu or cuda, got 'tpu'"):
            runtime.setup_runtime(1, "tpu")
        if not torch.cuda.is_available():
            with pytest.raises(UsageError, match="no CUDA GPU is available"):
                runtime.setup_runtime(1, "cuda")
    finally:
        torch.set_num_threads(before)
