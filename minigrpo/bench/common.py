"""The RL sections of `python -m minigrpo.bench`: whole-process runs over seeds and targets,
reported as medians with their min–max (a figure on one seed is an anecdote).

    grpo      the default command (pizza), the default command on a rare target (apple pie, p =
              0.02), --no-preserve, PPO (each critic: separate, head, oracle): --seeds N each, plus
              the spill-over figure
    presets   every --preset over --seeds N
    targets   the default command for EVERY (person, food) pair at seed 0: 96 runs, one sweep
    rarest    each person's rarest food over --seeds N
    custom    each person's rarest food through a user reward file that pays 1 for it and 0
              otherwise (the run is not told the food): must reproduce the `food:<food>` runs
              exactly
    optimum   --preset j_beta at β 0.1 and 0.3 on pizza, a fixed 300 steps, over --seeds N: how
              close it comes to the exact optimum π*_β of its own objective (bar: KL(π_θ‖π*_β) <=
              0.02)

Each run is checked against the bars of minigrpo/tools/bars.py (shared with compare's table). Runs
go `--jobs` at a time (default: the cores), each on one thread.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from minigrpo.tools.bars import BARS, OPTIMUM_BAR, first_reaching, med, quality_ok


def timed(step, n: int, warmup: int = 1) -> list[float]:
    """Seconds of each of n calls of step(), after `warmup` untimed ones."""
    out = []
    for _ in range(warmup + n):
        t = time.perf_counter()
        step()
        out.append(time.perf_counter() - t)
    return out[warmup:]


def run_module(args: list[str], omp_threads: str = "1") -> tuple[float, str | None, str]:
    """Run `python -m <args>` as a whole process (bench, compare); -> (wall seconds, its last error
    line or None if it exited 0, its stdout)."""
    t = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": omp_threads},
    )
    wall = time.perf_counter() - t
    if p.returncode == 0:
        return wall, None, p.stdout
    lines = (p.stderr or p.stdout).strip().splitlines()
    return wall, lines[-1] if lines else f"exit code {p.returncode}", p.stdout


def run_cli(args: list[str], folder: Path) -> dict:
    """Run `python -m <args> --out folder --quiet --overwrite` as a whole process; -> its
    figures."""
    wall, error, _ = run_module([*args, "--out", str(folder), "--quiet", "--overwrite"])
    if folder.is_dir():
        # so a table can be rebuilt from the folders
        (folder / "wall_seconds.txt").write_text(f"{wall:.2f}\n")
    return {"error": error, "wall": wall} if error else {**figures(folder), "wall": wall}


def table(title: str, header: list[str], rows: list[list]) -> str:
    cells = [header] + [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    fmt = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([f"\n### {title}", fmt(cells[0]), sep] + [fmt(r) for r in cells[1:]])


def figures(folder: Path) -> dict:
    """A finished run's figures from its metrics.jsonl and summary.json."""
    rows = [
        json.loads(line)
        for line in (folder / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    evals = [r for r in rows if r.get("target_rate") is not None]
    summary = json.loads((folder / "summary.json").read_text())
    steps, targets = [r["step"] for r in evals], [r["target_rate"] for r in evals]
    first = {lvl: first_reaching(steps, targets, lvl) for lvl in (0.9, 0.95)}
    return {
        "final": summary["target_rate"],
        "exact_reward": summary["exact_reward"],
        "steps": summary["step"],
        "stop": summary["stop_reason"].split()[0],
        "to_090": first[0.9],
        "to_095": first[0.95],
        "malformed": summary["malformed"],
        "worst_drift": summary.get("worst_drift"),
        "peak_malformed": max(r["malformed"] for r in evals),
        "peak_worst_drift": max(
            (r["worst_drift"] for r in evals if "worst_drift" in r), default=None
        ),
        "heldout": summary.get("heldout_rate"),
        **{k: summary.get(k) for k in ("kl_to_optimum", "regret")},
        "implied_beta": summary.get("implied_beta"),
        # from here on within 0.02 of π*_β
        "settled": next(
            (
                r["step"]
                for i, r in enumerate(evals)
                if all(e.get("kl_to_optimum", 1.0) <= OPTIMUM_BAR for e in evals[i:])
            ),
            None,
        ),
        "kl_exact": next(
            (r["kl_exact"] for r in reversed(rows) if r.get("kl_exact") is not None), None
        ),
    }


def passes(f: dict) -> bool:
    """Every bar of tools/bars.py: the quality bars and the whole-process time."""
    return (
        "error" not in f
        and f["wall"] <= BARS["wall"]
        and quality_ok(
            f["final"], f["peak_malformed"], f["malformed"], f["peak_worst_drift"], f["worst_drift"]
        )
    )


def run_all(jobs: list[tuple[str, list[str], Path]], n_jobs: int) -> dict[str, dict]:
    """{label: figures} for [(label, args, folder)], n_jobs processes at a time."""
    with ThreadPoolExecutor(max_workers=max(1, n_jobs)) as pool:
        results = pool.map(lambda j: run_cli(j[1], j[2]), jobs)
        return {label: f for (label, _, _), f in zip(jobs, results)}


ROW_HEADER = [
    "run",
    "seeds",
    "pass all bars",
    "whole process s",
    "steps (stop)",
    "steps to 0.95",
    "final exact target",
    "held-out",
    "peak malformed",
    "end malformed",
    "peak drift",
    "end drift",
]


def seed_row(label: str, figs: list[dict]) -> list:
    """One table row: medians (min–max) over the seeds' figures."""
    ok = [f for f in figs if "error" not in f]
    stops = sorted({f["stop"] for f in ok})
    pick = lambda k: [f[k] for f in ok]
    return [
        label,
        len(figs),
        f"{sum(map(passes, figs))}/{len(figs)}",
        med(pick("wall"), "{:.1f}"),
        med(pick("steps"), "{:.0f}") + f" ({'/'.join(stops)})",
        med(pick("to_095"), "{:.0f}") if any(pick("to_095")) else "never",
        med(pick("final")),
        med(pick("heldout")),
        med(pick("peak_malformed"), "{:.4f}"),
        med(pick("malformed"), "{:.4f}"),
        med(pick("peak_worst_drift")),
        med(pick("worst_drift")),
    ]


def rarest_foods() -> dict[str, str]:
    """Each person's least likely food (the first in FOODS order on a tie)."""
    from toy_tasks.food import FOODS, PREFERENCES

    return {p: min(FOODS, key=lambda f: PREFERENCES[p][f]) for p in PREFERENCES}


def write_rare_reward(path: Path, food: str) -> str:
    """A user reward file paying 1 for `food` only: the run is never told which food it is."""
    path.write_text(
        f"def reward(prompt, completion):\n    return 1.0 if completion == {food!r} else 0.0\n"
    )
    return f"{path}:reward"


def bench_optimum(out: Path, init: Path, seeds: int, jobs: int) -> str:
    """--preset j_beta (the exact gradient of J_β; minigrpo/grpo.py) at two β on pizza, 300 fixed
    steps."""
    rows = []
    for beta in ("0.1", "0.3"):
        runs = [
            (
                f"{beta}|{s}",
                [
                    "minigrpo.grpo",
                    "--preset",
                    "j_beta",
                    "--beta",
                    beta,
                    "--reward",
                    "pizza",
                    "--goal",
                    "0",
                    "--plateau",
                    "0",
                    "--steps",
                    "300",
                    "--init",
                    str(init),
                    "--seed",
                    str(s),
                ],
                out / f"j_beta-{beta}" / f"s{s}",
            )
            for s in range(seeds)
        ]
        figs = [f for f in run_all(runs, jobs).values() if "error" not in f]
        pick = lambda k: [f[k] for f in figs]
        rows.append(
            [
                f"j_beta --beta {beta}",
                f"{sum(f['kl_to_optimum'] <= OPTIMUM_BAR for f in figs)}/{seeds}",
                med(pick("kl_to_optimum"), "{:.4f}"),
                med(pick("settled"), "{:.0f}"),
                med(pick("implied_beta"), "{:.3f}"),
                med(pick("regret"), "{:.4f}"),
                med(pick("final")),
                med(pick("peak_malformed"), "{:.4f}"),
                med(pick("peak_worst_drift")),
                med(pick("wall"), "{:.1f}"),
            ]
        )
    return table(
        f"optimum: --preset j_beta on pizza, 300 steps, medians (min–max) over {seeds} seeds",
        [
            "run",
            f"KL to π*_β <= {OPTIMUM_BAR}",
            "final KL(π_θ‖π*_β)",
            "step from which always <= bar",
            "implied β",
            "regret",
            "final exact target",
            "peak malformed",
            "peak drift",
            "whole process s",
        ],
        rows,
    )


def slug(label: str) -> str:
    """A run folder's name for a table's label: every character but letters and digits a hyphen."""
    return "".join(c if c.isalnum() else "-" for c in label).strip("-")


def pretrain_name(base: str, label: str, seed: int) -> str:
    """The pretrain section's run folder of a recipe's label and seed; seed 0's defaults: the RL
    sections' model."""
    return base if (label, seed) == ("defaults", 0) else f"{base}-{slug(label)}-s{seed}"
