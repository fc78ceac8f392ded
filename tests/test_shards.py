"""tools/shards.py: compare under torchrun, two ranks over gloo on the CPU, against the same sweep
in one process."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from test_population import UNTIMED, close

from minigrpo.compare import main
from minigrpo.tools.shards import Shard, join
from minigrpo.util.jsonl import read_jsonl

SWEEP = [
    "--engine",
    "population",
    "--algos",
    "default,ppo",
    "--seeds",
    "2",
    "--steps",
    "3",
    "--group-size",
    "4",
    "--prompts-per-step",
    "2",
    "--preserve-per-prompt",
    "2",
    "--device",
    "cpu",
]


def test_one_process_is_a_shard_of_the_whole_sweep(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    shard = join()
    assert (
        shard == Shard(0, 1) and shard.mine([1, 2, 3]) == [1, 2, 3] and shard.gather("x") == ["x"]
    )
    assert Shard(1, 3).mine(list(range(8))) == [1, 4, 7] and shard.share(5) == 5


@pytest.mark.parametrize(
    "visible, local_rank, index, seen",
    [(None, 1, 1, "1"), ("4,6", 3, 1, "6"), ("GPU-a,GPU-b", 0, 0, "GPU-a")],
)
def test_a_rank_and_the_workers_it_starts_use_its_own_gpu(
    monkeypatch, visible, local_rank, index, seen
):
    told = {}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: told.setdefault("device", i))
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend: told.setdefault("backend", backend)
    )
    monkeypatch.setattr(dist, "get_rank", lambda: local_rank)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    # restored after the test: join changes it
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible or "")
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert join() == Shard(local_rank, 4)
    # this process's "cuda"; bookkeeping over gloo
    assert told == {"device": index, "backend": "gloo"}
    # what the workers it spawns see: that GPU alone
    assert os.environ["CUDA_VISIBLE_DEVICES"] == seen


@pytest.mark.slow
def test_two_torchrun_ranks_write_what_one_process_writes(tmp_path, tiny_pretrained, capsys):
    init, _, _ = tiny_pretrained
    one, two = tmp_path / "one", tmp_path / "two"
    main([*SWEEP, "--out", str(one), "--init", str(init)])
    capsys.readouterr()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "minigrpo.compare",
            *SWEEP,
            "--out",
            str(two),
            "--init",
            str(init),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (
        "4 to run over 2 processes" in done.stdout and done.stdout.count("interquartile means") == 1
    ), done.stdout
    runs = sorted(p.name for p in one.iterdir() if p.is_dir())
    assert runs == sorted(p.name for p in two.iterdir() if p.is_dir()) and len(runs) == 4
    for run in runs:
        rows, want = (
            read_jsonl(two / run / "metrics.jsonl"),
            read_jsonl(one / run / "metrics.jsonl"),
        )
        assert len(rows) == len(want) == 4 and (two / run / "summary.json").exists()
        # batched with other members: equal to float rounding
        for got, ref in zip(rows[:3], want[:3]):
            assert close(UNTIMED(got), UNTIMED(ref)) == [], (run, got["step"])
    table = (two / "table.md").read_text()
    assert (
        "| default | 2 |" in table and "| ppo | 2 |" in table and (two / "intervals.png").exists()
    )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_two_torchrun_ranks_run_on_the_gpus_at_hand(tmp_path, tiny_pretrained):
    """Each rank's runs on its own GPU, or two ranks sharing one GPU (where LOCAL_RANK 1 had no GPU
    of its own)."""
    init, _, _ = tiny_pretrained
    sweep = [*SWEEP[:-1], "cuda", "--out", str(tmp_path / "two"), "--init", str(init)]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "minigrpo.compare",
            *sweep,
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "4 to run over 2 processes" in done.stdout, done.stdout
    runs = [p for p in (tmp_path / "two").iterdir() if p.is_dir()]
    assert len(runs) == 4 and all((p / "summary.json").exists() for p in runs), runs
