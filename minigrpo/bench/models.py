"""The models section: the default recipes from every pretrained model the pretrain section makes.

    python -m minigrpo.bench --only models      # 5 models x 2 rewards x (default, ppo) x 5 seeds:
                                                # 100 runs

Every other RL table starts from one pretrained model (seed 0's). Do the default recipes hold their
bars from the other models of the same pretraining recipe, or does seed 0's model make them look
good? For each model (the pretrain section's seeds 0 … --seeds − 1) and each reward (pizza; apple
pie, p = 0.02), one compare command of default GRPO and PPO over --seeds RL seeds: compare's fixed
budget, the stop rule off, the bars watched at every step. A row per model: its malformed mass, each
algorithm's runs within every bar with its steps to 0.95, the largest peaks, and how many of GRPO's
steps the trust region shrank. The question's answer: docs/experiments.md, "From other pretrained
models".
"""

from __future__ import annotations

from pathlib import Path

from minigrpo.bench.common import run_module, slug, table
from minigrpo.tools.bars import first_reaching, med, within_bars
from minigrpo.tools.sweep_report import curves
from minigrpo.util.jsonl import read_jsonl

REWARDS = {"pizza": "pizza", "apple pie": "food:apple pie"}
ALGOS = {"default": "default GRPO", "ppo": "PPO"}


def bench_models(
    out: Path, models: list[Path], seeds: int, jobs: int, rewards: dict = REWARDS, extra: tuple = ()
) -> str:
    """The section's table (module docstring) from `models` (model k: the pretrain section's seed
    k); `extra`: more compare flags (the tests' short runs)."""
    rows = []
    for k, model in enumerate(models):
        cells, runs, shrunk, starts = [], [], [], []
        for name, reward in rewards.items():
            folder = out / "models" / f"m{k}-{slug(name)}"
            _, error, _ = run_module(
                [
                    "minigrpo.compare",
                    "--algos",
                    ",".join(ALGOS),
                    "--seeds",
                    str(seeds),
                    "--reward",
                    reward,
                    "--init",
                    str(model),
                    "--jobs",
                    str(jobs),
                    "--out",
                    str(folder),
                    "--overwrite",
                    *extra,
                ]
            )
            if error is not None:
                raise RuntimeError(f"compare from {model} on {reward} failed: {error}")
            for algo in ALGOS:
                got = [curves(folder / f"{algo}-s{s}") for s in range(seeds)]
                reached = [first_reaching(c["steps"], c["target"], 0.95) for c in got]
                cells.append(
                    f"{sum(within_bars(c['final']) for c in got)}/{seeds}, "
                    f"{med(reached, '{:g}', 'never')}"
                )
                runs += got
            # GRPO's rows: its steps the trust region shrank, the model's start
            for s in range(seeds):
                logged = read_jsonl(folder / f"default-s{s}" / "metrics.jsonl")
                shrunk.append(sum(r.get("tr_scale", 1.0) < 1 for r in logged))
                starts.append(logged[0]["malformed"])
        rows.append(
            [
                f"{k}: {starts[0]:.4f}",
                *cells,
                f"{max(c['final']['peak_worst_drift'] for c in runs):.3f}",
                f"{max(c['final']['peak_malformed'] for c in runs):.4f}",
                f"{med(shrunk, '{:g}')} of {runs[0]['final']['steps']}",
            ]
        )
    header = [
        "pretrained model (seed): its malformed mass",
        *(f"{label}, {name}" for name in rewards for label in ALGOS.values()),
        "peak drift, most",
        "peak malformed, most",
        "steps the trust region shrank (GRPO)",
    ]
    return table(
        f"models: default GRPO and PPO from each of {len(models)} pretrained models, {seeds} seeds "
        "each; a cell: runs within every bar, steps to 0.95 (median (min–max))",
        header,
        rows,
    )
