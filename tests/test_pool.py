"""tools/pool.run_pool: every item done once, in worker processes; a worker with nothing left exits
early."""

import os
import time
from pathlib import Path

from minigrpo.tools.pool import gpu_note, run_pool


def _pid_or_wait(item):
    """An item ("short" or "long", a folder): short -> this worker's pid; long -> whether the short
    one's worker (its pid in a file the parent writes) ended while this run still ran."""
    kind, folder = item
    if kind == "short":
        return os.getpid()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pid_file = Path(folder) / "short.pid"
        if pid_file.exists() and pid_file.read_text():
            if _gone(int(pid_file.read_text())):
                return True
        time.sleep(0.05)
    return False


def _gone(pid: int) -> bool:
    """Whether the process has ended: no longer there, or a zombie its parent has not yet reaped
    (Linux's /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except FileNotFoundError:
        return True


def test_a_worker_with_nothing_left_exits_while_the_others_run(tmp_path):
    results = {}

    def done(item, result):
        results[item[0]] = result
        if item[0] == "short":
            (tmp_path / "short.pid").write_text(str(result))

    run_pool(_pid_or_wait, [("long", str(tmp_path)), ("short", str(tmp_path))], 2, done)
    assert isinstance(results["short"], int) and results["short"] != os.getpid()
    assert results["long"] is True  # the short run's worker ended while the long run still ran


def test_every_item_is_done_once_when_there_are_more_items_than_workers(tmp_path):
    seen = []
    run_pool(
        _pid_or_wait, [("short", str(tmp_path))] * 5, 2, lambda item, result: seen.append(result)
    )
    assert len(seen) == 5 and len(set(seen)) <= 2  # two workers took the five in turn


def test_a_failed_runs_line_is_its_errors_first_line_cut_short():
    from minigrpo.tools.pool import brief

    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. "
        + "Process 581 has 9.48 GiB memory in use. " * 30
    )
    assert (
        brief(oom).startswith("torch.OutOfMemoryError: CUDA out of memory.")
        and len(brief(oom)) == 200
    )
    assert (
        brief(oom).endswith("…")
        and brief("ValueError: bad\nmore") == "ValueError: bad"
        and brief("") == ""
    )


def test_the_note_on_one_gpu_says_whether_a_cuda_mps_daemon_serves(tmp_path, monkeypatch):
    """compare's first line where several of its processes share one GPU: through the CUDA MPS a
    user started (its control pipe where CUDA looks for it), else in turns; compare starts none."""
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert gpu_note(2, True) == (
        " (on one GPU they take turns; CUDA MPS overlaps them: docs/running.md)"
    )
    (tmp_path / "control").touch()  # the daemon's pipe (a FIFO; its name is what counts)
    assert gpu_note(2, True) == " (sharing the GPU through CUDA MPS)"
    assert gpu_note(1, True) == gpu_note(2, False) == ""
