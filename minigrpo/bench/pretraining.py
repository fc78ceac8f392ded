"""The bench's pretraining: the pretrain section (the default `python -m minigrpo.pretrain` over
seeds, one process at a time so the seconds are comparable, with its exact quality report; on food
beside the minibatch recipe it replaced), and the pretrained models the other sections start from,
each made once under --out (run_cli: a whole `python -m minigrpo.<...>` process).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from minigrpo.bench.common import pretrain_name, run_module, table
from minigrpo.tools.bars import med
from toy_tasks import default_pretrain_dir


def run_cli(args: list[str]) -> tuple[float, str]:
    """Run `python -m minigrpo.<args>` as a whole process; -> (wall seconds, output); RuntimeError
    if it fails."""
    wall, error, out = run_module(args, os.environ.get("OMP_NUM_THREADS", "1"))
    if error:
        raise RuntimeError(f"{' '.join(args)} failed: {error}")
    return wall, out


def bench_pretrain(out: Path, task: str, seeds: int) -> str:
    """The default pretraining over seeds (one process at a time, so the seconds are comparable);
    food also runs the minibatch recipe it replaced. Seed 0's default model is the one the RL
    sections start from."""
    configs = [("defaults", [])]
    if task == "food":
        configs.append(
            (
                "--batch-size 128 --steps 600 (minibatches)",
                ["--batch-size", "128", "--steps", "600"],
            )
        )
    rows, base = [], default_pretrain_dir(task).split("/")[-1]
    for label, args in configs:
        figs = []
        for seed in range(seeds):
            folder = out / pretrain_name(base, label, seed)
            wall, _ = run_cli(
                [
                    "minigrpo.pretrain",
                    "--task",
                    task,
                    "--out",
                    str(folder),
                    "--overwrite",
                    "--seed",
                    str(seed),
                    *args,
                ]
            )
            figs.append({"wall": wall, **json.loads((folder / "summary.json").read_text())})
        rep = [f["report"] for f in figs]
        rows.append(
            [
                label,
                f"{sum(r['ok'] for r in rep)}/{seeds}",
                med([f["wall"] for f in figs], "{:.1f}"),
                med([f["train_seconds"] for f in figs], "{:.1f}"),
                med([100 * f["val_over_floor"] for f in figs], "+{:.2f}%"),
                med([r.get("worst_tv") for r in rep], "{:.4f}"),
                med([r.get("worst_malformed") for r in rep], "{:.4f}"),
            ]
        )
    return table(
        f"pretrain: `python -m minigrpo.pretrain --task {task}`, seeds 0-{seeds - 1}, one process "
        "at a time (median (min-max))",
        [
            "run",
            "quality bar",
            "whole process s",
            "training s",
            "val loss over floor",
            "worst TV to truth",
            "worst malformed",
        ],
        rows,
    )


def ensure_pretrained(out: Path, name: str, extra: list[str]) -> Path:
    ckpt = out / name / "model.pt"
    if not ckpt.exists():
        run_cli(["minigrpo.pretrain", "--out", str(out / name), *extra])
    return ckpt


def task_init(out: Path, task: str) -> Path:
    return ensure_pretrained(out, default_pretrain_dir(task).split("/")[-1], ["--task", task])
