"""tools/pool.run_pool: every item done once, in worker processes; a worker with nothing left exits
early; compare killed or stopped twice leaves no worker's traceback or warning behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minigrpo.tools.pool import STOPPING_LINE, StopFlag, gpu_note, run_pool


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


def test_the_stop_flag_is_set_once_the_parents_end_is_closed():
    """StopFlag, the pool's stop event without a semaphore: unset until the parent sets it (closes
    its end, as the parent's death does), set from then on; a worker gets the read end only."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    flag = StopFlag(ctx)
    assert not flag.is_set() and flag.wait(0.01) is False
    flag.set()
    assert flag.is_set() and flag.wait() is True
    assert StopFlag(ctx).__getstate__()["_writer"] is None, "a worker never holds the write end"


def _compare(out: Path, init, engine: str) -> subprocess.Popen:
    """A compare of two endless default runs on the tiny model, in a session of its own (so that a
    Ctrl-C can reach its whole process group, as a terminal's does), its output in one pipe."""
    cmd = [sys.executable, "-m", "minigrpo.compare", "--engine", engine, "--algos", "default"]
    cmd += ["--seeds", "2", "--jobs", "2", "--members", "1", "--steps", "100000"]
    cmd += ["--out", str(out), "--init", str(init), "--group-size", "4", "--prompts-per-step", "2"]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("engine", ["pool", "population"])
@pytest.mark.parametrize("stop", ["kill_9", "ctrl_c_twice"])
def test_a_compare_killed_or_ctrl_c_twice_prints_no_worker_traceback_or_warning(
    tmp_path, tiny_pretrained, engine, stop
):
    """`kill -9` of compare left the resource tracker's "leaked semaphore objects" warning on the
    terminal, and a second Ctrl-C a worker's ConnectionResetError traceback (and, in a population,
    each worker's own "stopping at the end of this step" line). Now kill -9 prints nothing more and
    each run keeps its checkpoint at its last step; Ctrl-C twice prints the pool's line once, then
    "interrupted", exit 130; no worker outlives it."""
    init, _, _ = tiny_pretrained
    out = tmp_path / "cmp"
    p = _compare(out, init, engine)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not all(
            (out / f"default-s{s}" / "metrics.jsonl").exists()
            and len((out / f"default-s{s}" / "metrics.jsonl").read_text().splitlines()) > 2
            for s in (0, 1)
        ):
            time.sleep(0.2)
        if stop == "kill_9":
            p.kill()
        else:
            os.killpg(p.pid, signal.SIGINT)
            time.sleep(1.0)
            os.killpg(p.pid, signal.SIGINT)
        # the workers hold the pipe too: it ends when the last of them has
        printed, _ = p.communicate(timeout=120)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # what this test started, if any is left
        except ProcessLookupError:
            pass
    lines = printed.strip().splitlines()
    assert "Traceback" not in printed and "Error" not in printed, printed
    assert "semaphore" not in printed and "Warning" not in printed, printed
    assert "stopping at the end of this step" not in printed, "the parent says it once for all"
    assert lines[0].startswith("compare:"), printed
    if stop == "kill_9":
        assert p.returncode == -signal.SIGKILL and len(lines) == 1, printed
        for s in (0, 1):  # each run ended at a step with its checkpoint, unfinished
            run = out / f"default-s{s}"
            assert (run / "model.pt").exists() and not (run / "summary.json").exists(), s
    else:
        assert p.returncode == 130 and lines[-1] == "interrupted", printed
        assert printed.count(STOPPING_LINE) == 1, printed


def test_a_run_folder_that_cannot_be_removed_fails_its_run_naming_the_folder(tmp_path, monkeypatch):
    """A file in an old run's folder that may not be removed (chattr +i; root removes a mode-000
    one, so a stand-in for rmtree denies it here): the run's error names the folder, not only the
    file ('Operation not permitted: f'), and its main never runs."""
    import errno
    import shutil

    from minigrpo.tools import pool

    folder = tmp_path / "grpo-s1"
    folder.mkdir()

    def denied(path, *args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted", "f")

    monkeypatch.setattr(shutil, "rmtree", denied)
    mains = {"minigrpo.grpo": lambda argv: pytest.fail("the run started")}
    task = ("grpo", 1, ["python", "-m", "minigrpo.grpo"], folder)
    error = pool.run_one(task, mains)
    assert error == (
        f"PermissionError: [Errno 1] cannot remove {str(folder)!r} to make the run afresh "
        "(Operation not permitted)"
    ), error
