"""Measure speed and quality, print them as tables, and write them into the results pages. Speed
goals are checked here, never in tests.

    python -m minigrpo.bench            # everything (several minutes on 2 CPU cores)
    python -m minigrpo.bench --quick    # sampling and threads only (seconds)
    python -m minigrpo.bench --only grpo,presets
    python -m minigrpo.bench --quick --no-docs   # print only

Sections: machine; the speed sections of speed.py (sampling: KV cache vs the slow path; threads;
scale, only on request: a 6 x 384 model, where a GPU wins; prefix: the shared-prefix forward against
the plain one); pretrain (the default command over --seeds, with its exact quality report, beside
the minibatch recipe it replaced); then the RL sections of common.py (grpo, presets, targets,
rarest, custom, optimum), each a median (min–max) over --seeds and checked against the bars of
minigrpo/tools/bars.py; grpo adds the spill-over figure and the per-step time of a 4-layer model;
models (models.py): default GRPO and PPO from each of the pretrain section's models; step (step.py,
in process): that GRPO step against TRL's GRPOTrainer, paired, when trl is importable (otherwise
through a plain/TRL ratio recorded on this machine); population (population.py): P default GRPO runs
as one lockstep population against P, with where the time goes; sweep (sweep.py): compare's default
list over 5 seeds (128 on a GPU) as one timed command. Subprocess runs write under --out (default
runs/bench), --jobs at a time. Each section's tables replace its own block in --docs (default docs/:
performance.md for the speed sections, results.md for the others; pages.py), the rest of each page
kept; --no-docs only prints.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minigrpo.bench import pages
from minigrpo.bench.common import (
    ROW_HEADER,
    bench_optimum,
    passes,
    pretrain_name,
    rarest_foods,
    run_all,
    run_module,
    seed_row,
    slug,
    table,
    write_rare_reward,
)
from minigrpo.bench.entropy import bench_entropy
from minigrpo.bench.mismatch import bench_mismatch
from minigrpo.bench.models import bench_models
from minigrpo.bench.population import bench_population
from minigrpo.bench.speed import bench_prefix, bench_sampling, bench_scale, bench_threads
from minigrpo.bench.step import bench_step
from minigrpo.bench.sweep import bench_sweep
from minigrpo.tools.bars import med
from minigrpo.util.cli import UsageError, main_guard, meta, parse_config
from minigrpo.util.outputs import prepare_out
from minigrpo.util.runtime import cores, setup_runtime
from toy_tasks import default_pretrain_dir, get_task

SECTIONS = [
    "sampling",
    "threads",
    "scale",
    "prefix",
    "pretrain",
    "grpo",
    "presets",
    "targets",
    "rarest",
    "custom",
    "optimum",
    "models",
    "entropy",
    "mismatch",
    "step",
    "population",
    "sweep",
]


@dataclass
class BenchConfig:
    quick: bool = field(
        default=False, metadata={"help": "only the fast sections (sampling, threads)"}
    )
    task: str = field(
        default="food", metadata={"help": "toy task for the pretrain, grpo and presets sections"}
    )
    only: str | None = field(
        default=None, metadata={"help": f"comma-separated sections of {', '.join(SECTIONS)}"}
    )
    out: str = field(
        default="runs/bench", metadata={"help": "folder for the runs the bench starts"}
    )
    seeds: int = field(
        default=5,
        metadata=meta(
            "seeds per configuration in the pretrain, grpo, presets, rarest, custom, models "
            "sections (models: as many "
            "pretrained models, each with that many RL seeds)"
        ),
    )
    jobs: int = field(
        default=0, metadata={"help": "runs at a time in the RL sections (0 = the number of cores)"}
    )
    threads: int = field(
        default=1, metadata={"help": "torch CPU threads for the in-process sections"}
    )
    device: str = field(
        default="cpu", metadata={"help": "auto, cpu or cuda", "choices": ["auto", "cpu", "cuda"]}
    )
    docs: str = field(
        default="docs",
        metadata=meta(
            "folder of the results pages the sections rewrite (results.md, performance.md); "
            "--no-docs: print only"
        ),
    )


def _run_cli(args: list[str]) -> tuple[float, str]:
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
            wall, _ = _run_cli(
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
        f"pretrain: `python -m minigrpo.pretrain --task {task}`, seeds 0-{seeds - 1}, one "
        "process at a time "
        f"(median (min-max))",
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


def _ensure_pretrained(out: Path, name: str, extra: list[str]) -> Path:
    ckpt = out / name / "model.pt"
    if not ckpt.exists():
        _run_cli(["minigrpo.pretrain", "--out", str(out / name), *extra])
    return ckpt


def _task_init(out: Path, task: str) -> Path:
    return _ensure_pretrained(out, default_pretrain_dir(task).split("/")[-1], ["--task", task])


def _seed_table(
    title: str, configs: list[tuple[str, list[str]]], out: Path, init: Path, seeds: int, jobs: int
) -> tuple[str, dict]:
    """Run every (label, args) over seeds 0..seeds-1; -> (a table of medians over seeds, {label:
    [figures]})."""
    runs = [
        (
            f"{label}|{s}",
            [*args, "--init", str(init), "--seed", str(s)],
            out / slug(label) / f"s{s}",
        )
        for label, args in configs
        for s in range(seeds)
    ]
    res = run_all(runs, jobs)
    by_label = {label: [res[f"{label}|{s}"] for s in range(seeds)] for label, _ in configs}
    errors = [f"  {k}: {v['error']}" for k, v in res.items() if "error" in v]
    return table(title, ROW_HEADER, [seed_row(label, figs) for label, figs in by_label.items()]) + (
        "\nfailed:\n" + "\n".join(errors) if errors else ""
    ), by_label


def bench_grpo(out: Path, task: str, seeds: int, jobs: int) -> str | dict[str, str]:
    """The default commands over seeds; on food also the spill-over and a bigger model's step time:
    {block: text} (each its own block of the pages)."""
    init = _task_init(out, task)
    if task != "food":  # the task's own defaults (RL_DEFAULTS), GRPO and PPO
        configs = [
            (f"{cli} --task {task} (default)", [f"minigrpo.{cli}", "--task", task])
            for cli in ("grpo", "ppo")
        ]
        return _seed_table(
            f"grpo and ppo on {task}: whole processes, medians (min–max) over {seeds} seeds",
            configs,
            out,
            init,
            seeds,
            jobs,
        )[0]
    configs = [
        ("grpo --reward pizza (default)", ["minigrpo.grpo", "--reward", "pizza"]),
        (
            "grpo --reward 'food:apple pie' (p=0.02)",
            ["minigrpo.grpo", "--reward", "food:apple pie"],
        ),
        (
            "grpo --reward pizza --no-preserve",
            ["minigrpo.grpo", "--reward", "pizza", "--no-preserve"],
        ),
        ("ppo --reward pizza (default)", ["minigrpo.ppo", "--reward", "pizza"]),
        (
            "ppo --reward pizza --critic head",
            ["minigrpo.ppo", "--reward", "pizza", "--critic", "head"],
        ),
        (
            "ppo --reward pizza --critic oracle",
            ["minigrpo.ppo", "--reward", "pizza", "--critic", "oracle"],
        ),
    ]
    text, _ = _seed_table(
        f"grpo and ppo: whole processes, medians (min–max) over {seeds} seeds",
        configs,
        out,
        init,
        seeds,
        jobs,
    )
    spill = spillover(
        out / slug(configs[0][0]) / "s0", out / slug(configs[2][0]) / "s0", out / "spillover.png"
    )
    big = _ensure_pretrained(
        out,
        "pretrain-4x128",
        ["--n-layer", "4", "--n-head", "4", "--n-embd", "128", "--steps", "300"],
    )
    folder = out / "grpo-step-time"
    _run_cli(
        [
            "minigrpo.grpo",
            "--init",
            str(big),
            "--out",
            str(folder),
            "--quiet",
            "--prompts-per-step",
            "1",
            "--group-size",
            "8",
            "--max-new-tokens",
            "12",
            "--updates",
            "1",
            "--no-preserve",
            "--threads",
            "1",
            "--steps",
            "40",
            "--eval-every",
            "1000",
            "--goal",
            "0",
            "--overwrite",
        ]
    )
    times = [
        json.loads(line)["step_time"]
        for line in (folder / "metrics.jsonl").read_text().splitlines()
        if "step_time" in json.loads(line)
    ]
    step_time = table(
        "grpo per-step time: 4-layer 128-wide model, 1 prompt x 8 completions, 12 new tokens, μ=1, "
        "--no-preserve, 1 thread",
        ["steps", "median ms", "p90 ms"],
        [
            [
                len(times),
                f"{1000 * statistics.median(times[5:]):.1f}",
                f"{1000 * sorted(times[5:])[int(0.9 * len(times[5:]))]:.1f}",
            ]
        ],
    )
    return {"grpo": text, "spillover": spill, "grpo-step-time": step_time}


def bench_targets(out: Path, jobs: int) -> str:
    """The default command for every (person, food) pair at seed 0, and the worst of them."""
    from toy_tasks.food import FOODS, PEOPLE

    init = _task_init(out, "food")
    runs = [
        (
            f"{p}|{f}",
            ["minigrpo.grpo", "--person", p, "--reward", f"food:{f}", "--init", str(init)],
            out / "targets" / slug(f"{p}-{f}"),
        )
        for p in PEOPLE
        for f in FOODS
    ]
    res = run_all(runs, jobs)
    figs = list(res.values())
    fails = [
        f"  {k.replace('|', ': ')}: "
        + (
            v["error"]
            if "error" in v
            else f"final {v['final']:.3f}, peak malformed {v['peak_malformed']:.4f}, end "
            f"{v['malformed']:.4f}, "
            f"peak drift {v['peak_worst_drift']:.3f}, end {v['worst_drift']:.3f}, {v['wall']:.1f} s"
        )
        for k, v in res.items()
        if not passes(v)
    ]
    return table(
        f"targets: the default command for all {len(runs)} (person, food) pairs, seed 0",
        ROW_HEADER,
        [seed_row("every pair", figs)],
    ) + ("\npairs missing a bar:\n" + "\n".join(fails) if fails else "")


def bench_rarest(out: Path, seeds: int, jobs: int, custom: bool = False) -> str:
    """Each person's rarest food over seeds, named (food:<food>) or through a user reward file."""
    init = _task_init(out, "food")
    configs = []
    for person, food in rarest_foods().items():
        reward = write_rare_reward(out / f"rare_{person}.py", food) if custom else f"food:{food}"
        configs.append(
            (
                f"{person}: {food}" + (" (custom file)" if custom else ""),
                ["minigrpo.grpo", "--person", person, "--reward", reward],
            )
        )
    kind = (
        "a user reward file paying 1 for it (the run is not told the food)"
        if custom
        else "food:<food>"
    )
    return _seed_table(
        f"each person's rarest food, {kind}: medians (min–max) over {seeds} seeds",
        configs,
        out / ("custom" if custom else "rarest"),
        init,
        seeds,
        jobs,
    )[0]


def spillover(with_preserve: Path, without: Path, png: Path) -> str:
    """Each person's exact pizza share before RL and after it, with and without preservation:
    a table, and the same as a grouped bar chart in `png`."""
    a = json.loads((with_preserve / "summary.json").read_text())
    b = json.loads((without / "summary.json").read_text())
    pizza = lambda dists: {p: d["pizza"] for p, d in dists.items()}
    before, on, off = pizza(a["baseline"]), pizza(a["shares"]), pizza(b["shares"])
    people = list(before)
    rows = [[p, f"{before[p]:.3f}", f"{on[p]:.3f}", f"{off[p]:.3f}"] for p in people]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    x = range(len(people))
    for i, (label, shares) in enumerate(
        [("pretrained", before), ("GRPO, preservation on", on), ("GRPO --no-preserve", off)]
    ):
        ax.bar(
            [j + (i - 1) * 0.27 for j in x], [shares[p] for p in people], width=0.27, label=label
        )
    ax.set_xticks(list(x), people)
    ax.set_ylabel("exact P(pizza)")
    ax.set_title(
        "GRPO on 'ravin likes ' only: everyone's pizza share (spill-over when unpreserved)"
    )
    ax.set_ylim(0, 1.25)
    ax.legend(fontsize=8, ncol=3, loc="upper left")
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)
    return table(
        f"spill-over: exact P(pizza) per person (figure: {png})",
        ["person", "pretrained", "after GRPO (preservation on)", "after GRPO --no-preserve"],
        rows,
    )


def bench_presets(out: Path, task: str, seeds: int, jobs: int) -> str:
    from minigrpo.grpo import PRESETS

    init = _task_init(out, task)
    configs = [
        (f"--preset {name}", ["minigrpo.grpo", "--preset", name, "--task", task])
        for name in PRESETS
    ]
    return _seed_table(
        f"presets on {task} (the task's default reward): medians (min–max) over {seeds} seeds",
        configs,
        out / "presets",
        init,
        seeds,
        jobs,
    )[0]


def block_names(
    section: str, task: str, result: str | dict[str, str], device: str = "cpu"
) -> dict[str, str]:
    """{block name in the pages: markdown} of one section's result; a task other than food names its
    own blocks (grpo-arithmetic), and so does a GPU (population-cuda), so neither overwrites food's
    on the CPU."""
    parts = result if isinstance(result, dict) else {section: result}
    gpu = "-cuda" if device.startswith("cuda") else ""
    return {
        (name if task == "food" else f"{name}-{task}") + gpu: text for name, text in parts.items()
    }


@main_guard
def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    write_docs = "--no-docs" not in argv
    argv = [a for a in argv if a != "--no-docs"]
    cfg, _ = parse_config(BenchConfig, argv, description=__doc__.split("\n\n")[0])
    # scale: on request
    sections = SECTIONS[:2] if cfg.quick else [s for s in SECTIONS if s != "scale"]
    # an empty --only is a mistake, not "everything" (a whole bench takes long)
    if cfg.only is not None:
        sections = [s.strip() for s in cfg.only.split(",")]
        bad = [s or "''" for s in sections if s not in SECTIONS]
        if bad:
            raise UsageError(
                f"unknown --only section(s) {', '.join(bad)} (available: {', '.join(SECTIONS)})"
            )
    try:
        get_task(cfg.task)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if cfg.seeds < 1 or cfg.jobs < 0:
        raise UsageError(f"--seeds must be >= 1 and --jobs >= 0, got {cfg.seeds} and {cfg.jobs}")
    if cfg.task != "food" and any(
        s in sections
        for s in (
            "targets",
            "rarest",
            "custom",
            "optimum",
            "models",
            "entropy",
            "mismatch",
            "prefix",
        )
    ):
        raise UsageError(
            "the targets, rarest, custom, optimum, models, entropy, mismatch and prefix sections "
            "are "
            "food's (people and foods): use --task food"
        )
    jobs = cfg.jobs or cores()
    device = setup_runtime(cfg.threads, cfg.device)
    # one line for an impossible or read-only folder; one bench per folder
    out = prepare_out(cfg.out)
    print(
        f"machine: {platform.machine()} {cores()} cores | torch {torch.__version__} | device "
        f"{device} | "
        f"threads {torch.get_num_threads()} | python {platform.python_version()}",
        flush=True,
    )
    runners = {
        "sampling": lambda: bench_sampling(device),
        "threads": lambda: bench_threads(device),
        "scale": lambda: bench_scale(device),
        "prefix": lambda: bench_prefix(out, _task_init(out, "food")),
        "pretrain": lambda: bench_pretrain(out, cfg.task, cfg.seeds),
        "grpo": lambda: bench_grpo(out, cfg.task, cfg.seeds, jobs),
        "presets": lambda: bench_presets(out, cfg.task, cfg.seeds, jobs),
        "targets": lambda: bench_targets(out, jobs),
        "rarest": lambda: bench_rarest(out, cfg.seeds, jobs),
        "custom": lambda: bench_rarest(out, cfg.seeds, jobs, custom=True),
        "optimum": lambda: bench_optimum(out, _task_init(out, "food"), cfg.seeds, jobs),
        "models": lambda: bench_models(
            out,
            [
                _ensure_pretrained(
                    out, pretrain_name("pretrain", "defaults", k), ["--seed", str(k)]
                )
                for k in range(cfg.seeds)
            ],
            cfg.seeds,
            jobs,
        ),
        "entropy": lambda: bench_entropy(out, _task_init(out, "food"), cfg.seeds),
        "mismatch": lambda: bench_mismatch(out, _task_init(out, "food"), cfg.seeds, jobs),
        "step": lambda: bench_step(),
        "population": lambda: bench_population(out, _task_init(out, "food"), str(device)),
        "sweep": lambda: bench_sweep(out, _task_init(out, "food"), str(device)),
    }
    docs = Path(cfg.docs) if write_docs else None
    if docs is not None and docs.exists() and not docs.is_dir():
        raise UsageError(f"--docs {cfg.docs} is a file, not a folder (--no-docs: print only)")
    line = pages.header(pages.machine(), sections) if docs is not None else ""
    for s in sections:
        blocks = block_names(s, cfg.task, runners[s](), str(device))
        print("\n".join(blocks.values()), flush=True)
        if docs is not None:
            try:
                written = pages.write_blocks(docs, blocks, line)
            except ValueError as e:
                raise UsageError(str(e)) from None
            print(f"wrote {', '.join(map(str, written))}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
