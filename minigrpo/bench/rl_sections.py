"""The bench's RL sections of the trainers' own commands, each run as a whole process over seeds
and reported as medians (min–max) checked against the bars of minigrpo/tools/bars.py: grpo (the
default GRPO and PPO commands; on food also the spill-over figure, preservation on and off, and the
per-step time of a 4-layer model), presets (every --preset), and food's targets (every (person,
food) pair at seed 0), rarest (each person's rarest food) and custom (the same through a user
reward file). The others (optimum, models, ...) live in modules of their own; suite.py runs them.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from minigrpo.bench.common import (
    ROW_HEADER,
    passes,
    rarest_foods,
    run_all,
    seed_row,
    slug,
    table,
    write_rare_reward,
)
from minigrpo.bench.pretraining import ensure_pretrained, run_cli, task_init


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
    init = task_init(out, task)
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
    big = ensure_pretrained(
        out,
        "pretrain-4x128",
        ["--n-layer", "4", "--n-head", "4", "--n-embd", "128", "--steps", "300"],
    )
    folder = out / "grpo-step-time"
    run_cli(
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

    init = task_init(out, "food")
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
    init = task_init(out, "food")
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

    init = task_init(out, task)
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
