"""bench's world section: a task's own world (--task other than food), from runs it makes. The
task's default pretrained model (made once under --out, as the other sections' are) with its exact
pretraining report, then the task's default GRPO command `python -m minigrpo.grpo --task <task>`
over --seeds from it: per seed the start → end of the world's headline figures (HEADLINE: the think
rate and accuracy, on the RL and the held-out prompts; a world without them: the target rate and
held-out rate), the peak malformed mass, whether the run held its bars (tools/bars.py), its steps
and its whole process's seconds, then medians (min–max) over the seeds. Written as question → setup
→ tables → conclusion into docs/worlds.md's block world-<task>.

    python -m minigrpo.bench --task sums            # = --only world; --seeds 10 for ten runs
"""

from __future__ import annotations

import json
from pathlib import Path

from minigrpo.bench.common import run_all
from minigrpo.bench.pretraining import task_init
from minigrpo.tools.bars import BARS, med, missed_bars
from minigrpo.util.jsonl import read_jsonl
from toy_tasks import default_pretrain_dir, get_task

HEADLINE = (
    "exact_think_rate",
    "exact_accuracy",
    "exact_think_rate_heldout",
    "exact_accuracy_heldout",
)
FALLBACK = ("target_rate", "heldout_rate")
# issue 54, item 3: the default command learns to think (where the world logs a think rate)
GOAL = {"think_from": 0.3, "think_to": 0.8, "accuracy_up": 0.2}


def bench_world(out: Path, task: str, seeds: int, jobs: int) -> str:
    """Pretrain (once) and run the task's default GRPO command over `seeds`; -> the block."""
    init = task_init(out, task)
    runs = [
        (
            str(s),
            ["minigrpo.grpo", "--task", task, "--init", str(init), "--seed", str(s)],
            out / f"world-{task}" / f"s{s}",
        )
        for s in range(seeds)
    ]
    run_all(runs, jobs)
    return world_block(task, init.parent, [folder for _, _, folder in runs])


def headline(rows: list[dict]) -> list[str]:
    """The figures the tables follow: HEADLINE where the run logs them, else FALLBACK's."""
    first = rows[0] if rows else {}
    return [k for k in HEADLINE if k in first] or [k for k in FALLBACK if k in first]


def read_run(folder: Path) -> dict | None:
    """A finished run's figures: its evaluations' first and last values, peak malformed, steps,
    stop reason, the bars it missed, its whole process's seconds (bench's wall_seconds.txt); None
    for a run that did not finish (no summary.json)."""
    if not (folder / "summary.json").is_file():
        return None
    summary = json.loads((folder / "summary.json").read_text())
    evals = [r for r in read_jsonl(folder / "metrics.jsonl") if "target_rate" in r]
    keys = headline(evals)
    final = {**evals[-1], "peak_malformed": max(r["malformed"] for r in evals)}
    wall = folder / "wall_seconds.txt"
    return {
        "figures": keys,
        "start": {k: evals[0][k] for k in keys},
        "end": {k: evals[-1][k] for k in keys},
        "peak_malformed": final["peak_malformed"],
        "missed": list(missed_bars(final).values()),
        "steps": evals[-1]["step"],
        "stop": summary.get("stop_reason", "").split(" ")[0],
        "wall": float(wall.read_text()) if wall.is_file() else None,
    }


def _short(key: str) -> str:
    name = key.removeprefix("exact_").replace("_", " ")
    return name.replace(" heldout", ", held-out").replace("heldout rate", "held-out rate")


def _goal(run: dict) -> bool | None:
    """Item 3's goal on one run (None where the world logs no think rate)."""
    s, e = run["start"], run["end"]
    if "exact_think_rate" not in s:
        return None
    return not run["missed"] and all(
        s[f"exact_think_rate{h}"] <= GOAL["think_from"]
        and e[f"exact_think_rate{h}"] >= GOAL["think_to"]
        and e[f"exact_accuracy{h}"] - s[f"exact_accuracy{h}"] >= GOAL["accuracy_up"]
        for h in ("", "_heldout")
    )


def _pretraining(task: str, folder: Path) -> list[str]:
    path = folder / "summary.json"
    if not path.is_file():
        return [f"No pretrained model in {folder} (no summary.json)."]
    s = json.loads(path.read_text())
    report = get_task(task).format_report(s["report"])
    return [
        f"Pretrained once by `python -m minigrpo.pretrain --task {task}` (seed 0; into "
        f"{default_pretrain_dir(task)}/ outside the bench): val loss "
        f"{100 * s['val_over_floor']:+.1f} % over the floor, {s['train_seconds']:.0f} s of "
        "training. Its exact report:",
        "",
        "```",
        *report.splitlines(),
        "```",
    ]


def world_block(task: str, pretrained: Path, folders: list[Path]) -> str:
    """The section's markdown from the pretrained model's folder and the runs' folders (a run that
    did not finish is named, not tabulated)."""
    runs = {f: read_run(f) for f in folders}
    done = {f: r for f, r in runs.items() if r is not None}
    command = f"python -m minigrpo.grpo --task {task}"
    pretraining = _pretraining(task, pretrained)
    lines = [
        f"**Question.** Does the default command `{command}` (the task's own defaults) take the "
        "pretrained model where the world says it should, on the RL and the held-out prompts, "
        "within its bars, and how much do the seeds differ?",
        "",
        "**Setup.** " + pretraining[0],
        *pretraining[1:],
        "",
        f"Then `{command} --seed S` for S = 0..{len(folders) - 1} from that model, each a whole "
        f"process, the bars of tools/bars.py (final target ≥ {BARS['final']:g}, malformed ≤ "
        f"{BARS['peak_malformed']:g} at every step and ≤ {BARS['malformed']:g} at the end). "
        f"{len(done)}/{len(folders)} runs finished.",
    ]
    missing = [f.name for f in folders if f not in done]
    if missing:
        lines[-1] += f" Not finished: {', '.join(missing)}."
    if not done:
        return "\n".join(lines)
    keys = next(iter(done.values()))["figures"]
    header = ["seed", *[f"{_short(k)} start → end" for k in keys], "peak malformed"]
    header += ["within bars", "steps (stop)", "whole process s"]
    table = [
        "| " + " | ".join(header) + " |",
        "|---" * len(header) + "|",
    ]
    for f, r in done.items():
        cells = [f.name.removeprefix("s")]
        cells += [f"{r['start'][k]:.3f} → {r['end'][k]:.3f}" for k in keys]
        cells += [
            f"{r['peak_malformed']:.4f}",
            "yes" if not r["missed"] else "; ".join(r["missed"]),
        ]
        cells += [f"{r['steps']} ({r['stop']})", "-" if r["wall"] is None else f"{r['wall']:.0f}"]
        table.append("| " + " | ".join(cells) + " |")
    pick = lambda get: [get(r) for r in done.values()]
    cells = ["median (min–max)"]
    cells += [
        f"{med(pick(lambda r: r['start'][k]))} → {med(pick(lambda r: r['end'][k]))}" for k in keys
    ]
    cells += [med(pick(lambda r: r["peak_malformed"]), "{:.4f}")]
    cells += [f"{sum(not r['missed'] for r in done.values())}/{len(done)}"]
    cells += [med(pick(lambda r: r["steps"]), "{:.0f}")]
    walls = [w for w in pick(lambda r: r["wall"]) if w is not None]
    cells += [med(walls, "{:.0f}")]
    table.append("| " + " | ".join(cells) + " |")
    lines += ["", *table, "", "**Conclusion.** " + conclusion(done, keys)]
    return "\n".join(lines)


def conclusion(done: dict, keys: list[str]) -> str:
    """What the runs show, medians over seeds: each headline figure's change, the runs within the
    bars and, where the world logs a think rate, the runs that meet issue 54's item 3."""
    n = len(done)
    parts = []
    for k in keys:
        d = [r["end"][k] - r["start"][k] for r in done.values()]
        parts.append(f"{_short(k)} {med(d, '{:+.3f}')}")
    within = sum(not r["missed"] for r in done.values())
    text = f"Change from start to end, median (min–max) over {n} seeds: " + "; ".join(parts) + "."
    text += f" {within}/{n} runs within every bar."
    goals = [_goal(r) for r in done.values()]
    if goals and goals[0] is not None:
        text += (
            f" Item 3's goal (think rate from ≤ {GOAL['think_from']:g} to ≥ {GOAL['think_to']:g} "
            f"and accuracy up by ≥ {GOAL['accuracy_up']:g}, on the RL and the held-out prompts, "
            f"within every bar): met by {sum(goals)}/{n} runs."
        )
    return text
