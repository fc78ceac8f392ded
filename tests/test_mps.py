"""util/mps.py: compare's own MPS control daemon, with a stand-in `nvidia-cuda-mps-control` and CUDA
client (this machine has no GPU): started with its pipes in a folder of its own, its processes
pointed at it inside only, its server checked by a client first, told to quit at the end, stopped by
its watchdog when its owner is killed."""

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from minigrpo.util import mps

OK = [sys.executable, "-c", "pass"]  # a CUDA client the server served
REFUSED = [sys.executable, "-c", "import sys; sys.exit('CUDA error 805')"]  # one it did not


def fake_control(folder: Path, monkeypatch, fails: str = "") -> Path:
    """A stand-in `nvidia-cuda-mps-control` first on PATH: it logs its arguments, what it was told
    and its pipe folder, and on -d makes the control pipe there and leaves a process behind with its
    output (as the daemon does: it touches daemon-ended there when it ends), or, `fails`, says so
    and exits 1 -> its log."""
    log, fake = folder / "mps.log", folder / "bin" / mps.CONTROL
    fake.parent.mkdir()
    start = (
        f'echo "{fails}" >&2; exit 1'
        if fails
        else 'touch "$CUDA_MPS_PIPE_DIRECTORY/control"; '
        f'( (sleep 20; touch "{folder}/daemon-ended") & ); told='
    )
    fake.write_text(
        f'#!/bin/sh\nif [ "$1" = "-d" ]; then {start}; else told=$(cat); fi\n'
        f'echo "$* $told $CUDA_MPS_PIPE_DIRECTORY" >> {log}\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    # the machine's: none
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(folder / "no-mps-here"))
    return log


def test_serving_reads_the_control_pipe_where_cuda_looks_for_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert not mps.serving()
    (tmp_path / "control").touch()  # the daemon's pipe (a FIFO; its name is what counts)
    assert mps.serving() and not mps.serving(
        {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "elsewhere")}
    )


def test_its_own_daemon_serves_the_processes_started_inside_then_quits(tmp_path, monkeypatch):
    log = fake_control(tmp_path, monkeypatch)
    before = dict(os.environ)
    with mps.own_mps(9, probe=OK) as why:
        # not held until the daemon's process ends (its output is no pipe): it still runs
        assert not (tmp_path / "daemon-ended").exists()
        assert why is None and mps.serving()  # a process started here goes through it
        pipes = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ['CUDA_MPS_PIPE_DIRECTORY'])"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        assert child == pipes and Path(pipes).parent.name.startswith("minigrpo-mps-")
    assert dict(os.environ) == before  # pointed at it inside only
    started, stopped = log.read_text().splitlines()
    assert started.split() == ["-d", pipes] and stopped.split() == ["quit", pipes], (
        started,
        stopped,
    )
    assert not Path(pipes).parent.exists()  # its temporary folder removed


def test_a_server_that_serves_no_client_is_stopped_and_the_processes_take_turns(
    tmp_path, monkeypatch
):
    log = fake_control(tmp_path, monkeypatch)
    with mps.own_mps(9, probe=REFUSED) as why:
        assert why == "MPS did not start: its server did not serve a CUDA client: CUDA error 805"
        assert not mps.serving()  # nothing points at the daemon
    started, stopped = log.read_text().splitlines()
    assert started.split()[0] == "-d" and stopped.split()[0] == "quit"


def test_where_mps_cannot_start_or_already_serves_it_says_why_and_starts_nothing(
    tmp_path, monkeypatch
):
    folders = lambda: set(Path(tempfile.gettempdir()).glob("minigrpo-mps-*"))
    before = folders()
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with mps.own_mps(9, probe=OK) as why:
        assert why == "no nvidia-cuda-mps-control on PATH"
    log = fake_control(tmp_path, monkeypatch, fails="An instance of this daemon is already running")
    with mps.own_mps(9, probe=OK) as why:
        assert (
            why == "MPS did not start: An instance of this daemon is already running"
            and not mps.serving()
        )
    with mps.own_mps(mps.CLIENTS_MOST + 1, probe=OK) as why:
        assert why.startswith(f"more processes ({mps.CLIENTS_MOST + 1}) than an MPS server takes")
    (tmp_path / "no-mps-here").mkdir()
    (tmp_path / "no-mps-here" / "control").touch()  # the machine's own daemon serves already
    with mps.own_mps(9, probe=OK) as why:
        assert why is None
    assert not log.exists()  # the refused start logs nothing; nothing was told to quit
    assert folders() == before  # the refused daemon's folder removed


def test_the_watchdog_stops_the_daemon_of_a_killed_command(tmp_path, monkeypatch):
    log = fake_control(tmp_path, monkeypatch)
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\nfrom minigrpo.util import mps\n"
            f"with mps.own_mps(9, probe={OK!r}) as why:\n"
            "    print(os.environ['CUDA_MPS_PIPE_DIRECTORY'], flush=True)\n    time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    pipes = owner.stdout.readline().strip()
    owner.send_signal(signal.SIGKILL)  # no `finally` runs
    owner.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(log.read_text().splitlines()) < 2:
        time.sleep(0.1)
    assert log.read_text().split() == ["-d", pipes, "quit", pipes]
    while time.monotonic() < deadline and Path(pipes).parent.exists():
        time.sleep(0.1)
    assert not Path(pipes).parent.exists()


def test_compare_says_how_its_processes_share_one_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))  # no MPS of the machine's
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # and none to start
    said = lambda *a: mps.sharing_gpu(*a).__enter__()
    assert said(1, True) == said(9, False) == ""  # one process, or the CPU's cores: nothing to say
    assert said(9, True, "off") == " (on one GPU they take turns: --mps auto overlaps them)"
    # torchrun's ranks start none
    assert "`nvidia-cuda-mps-control -d` first" in said(9, True, "machine")
    assert said(9, True) == " (on one GPU they take turns: no nvidia-cuda-mps-control on PATH)"
    (tmp_path / "control").touch()  # the machine's own daemon's pipe
    assert (
        said(9, True) == said(9, True, "off") == " (sharing the GPU through the machine's CUDA MPS)"
    )


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available() or shutil.which(mps.CONTROL) is None,
    reason="needs a CUDA GPU and nvidia-cuda-mps-control",
)
def test_on_a_gpu_compares_processes_share_it_through_mps(tmp_path, tiny_pretrained):
    """compare's two population processes go through its own daemon (or the machine's, where one
    serves), their runs finish, and the daemon's folder is gone after it."""
    init, _, _ = tiny_pretrained
    before = set(Path(tempfile.gettempdir()).glob("minigrpo-mps-*"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "minigrpo.compare",
            "--algos",
            "default,ppo",
            "--seeds",
            "2",
            "--steps",
            "2",
            "--device",
            "cuda",
            "--jobs",
            "2",
            "--init",
            str(init),
            "--out",
            str(tmp_path / "cmp"),
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    first = done.stdout.splitlines()[0]
    mine = "the machine's CUDA MPS" if mps.serving() else "CUDA MPS, a daemon of this command's own"
    assert f"2 at a time (sharing the GPU through {mine}) ->" in first, first
    assert all(
        (tmp_path / "cmp" / f"{a}-s{s}" / "summary.json").exists()
        for a in ("default", "ppo")
        for s in (0, 1)
    )
    assert set(Path(tempfile.gettempdir()).glob("minigrpo-mps-*")) == before
