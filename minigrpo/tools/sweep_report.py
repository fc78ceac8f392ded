"""What compare writes from a sweep's finished runs: each run's curves read back from its
metrics.jsonl, then the table (table.md: medians with min–max over seeds, the runs outside the bars
with what each missed, then the IQMs with their 95 % intervals and P(A > B): intervals.py) and the
figures (curves.png, frontier.png, intervals.png)."""

from __future__ import annotations

import statistics
import textwrap
from pathlib import Path

from minigrpo.tools.bars import BARS, first_reaching, med, missed_bars, within_bars
from minigrpo.tools.intervals import (
    Bootstraps,
    draw_intervals,
    improvement_table,
    interval_table,
    score_intervals,
)
from minigrpo.util.jsonl import read_jsonl


def curves(folder: Path) -> dict:
    rows = read_jsonl(folder / "metrics.jsonl")
    secs = toks = 0.0
    out = {"secs": [], "tokens": [], "target": [], "steps": []}
    for r in rows:
        secs += r.get("step_time", 0.0)
        toks += r.get("tokens_per_s", 0.0) * r.get("step_time", 0.0)
        if "target_rate" in r:
            (
                out["secs"].append(secs),
                out["tokens"].append(toks),
                out["target"].append(r["target_rate"]),
            )
            out["steps"].append(r["step"])
    # the last value of each metric (a step that skipped its update, e.g. DAPO's, logs no KL)
    out["final"] = {
        k: next((r[k] for r in reversed(rows) if r.get(k) is not None), None)
        for k in (
            "target_rate",
            "exact_reward",
            "kl_exact",
            "worst_drift",
            "malformed",
            "peak_worst_drift",
            "peak_malformed",
            *OPTIMUM_KEYS,
            "expected_reward",
        )
    }
    # strict JSON's inf
    if rows and "implied_beta" in rows[-1] and rows[-1]["implied_beta"] is None:
        out["final"]["implied_beta"] = float("inf")
    out["final"]["steps"] = rows[-1]["step"] if rows else float("nan")
    out["run"] = folder.name  # e.g. dapo-s3
    # the first max
    out["peak_at"] = {
        f"peak_{k}": max(
            ((r[k], r["step"]) for r in rows if r.get(k) is not None),
            key=lambda vs: vs[0],
            default=(None, None),
        )[1]
        for k in ("worst_drift", "malformed")
    }
    return out


OPTIMUM_KEYS = (
    "kl_ref",
    "regret",
    "implied_beta",
    "kl_to_implied_optimum",
    "kl_to_optimum",
    "pass_at_8",
)


def summarise(values: list, none: str = "never") -> str:
    return med(values, "{:.3g}", none=none)


def median(values: list, never: bool = False) -> str:
    """The median of the values that exist ('-' if none); `never`: the missing ones (a goal never
    reached) counted."""
    got = [v for v in values if v is not None]
    if not got:
        return "never" if never and values else "-"
    missing = len(values) - len(got)
    return f"{statistics.median(got):.3g}" + (f" ({missing} never)" if never and missing else "")


def outside_bars(results: dict) -> list[str]:
    """One line per run outside a quality bar, naming what it missed and, for a peak, at which step,
    e.g. 'ppo_oracle-s13: peak drift 0.0508 > 0.05 (step 3)'."""
    lines = []
    for runs in results.values():
        for c in runs:
            missed = [
                m + (f" (step {c['peak_at'][bar]})" if c["peak_at"].get(bar) is not None else "")
                for bar, m in missed_bars(c["final"]).items()
            ]
            if missed:
                lines.append(f"{c['run']}: {'; '.join(missed)}")
    return lines


def short_table(results: dict, regret: bool) -> str:
    """What compare prints: one line per algorithm, medians over seeds of what judges it (table.md:
    the ranges and every other column), aligned for a terminal."""
    goal = BARS["final"]
    rows = [
        [
            "algorithm",
            "within bars",
            f"steps to {goal:g}",
            "final target",
            "peak drift",
            "peak malformed",
            "regret",
        ][: 7 if regret else 6]
    ]
    for algo, runs in results.items():
        f = [c["final"] for c in runs]
        rows.append(
            [
                algo,
                f"{sum(map(within_bars, f))}/{len(f)}",
                median([first_reaching(c["steps"], c["target"], goal) for c in runs], never=True),
                *[
                    median([x[k] for x in f])
                    for k in ("target_rate", "peak_worst_drift", "peak_malformed", "regret")[
                        : 4 if regret else 3
                    ]
                ],
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows
    )


def printed_summary(
    results: dict, title: str, regret: bool, missed: list[str], intervals: list[str]
) -> str:
    """What compare prints at the end: the short table, the runs outside the bars (`missed`,
    outside_bars'; at most 10: table.md lists them all) and the IQMs with their intervals
    (`intervals`, intervals.interval_table's)."""
    text = f"\n{textwrap.fill(title, 120)}; medians over seeds:\n{short_table(results, regret)}"
    if missed:
        text += (
            f"\n\noutside the bars ({len(missed)}):\n"
            + "\n".join(f"  {m}" for m in missed[:10])
            + (f"\n  … {len(missed) - 10} more in table.md" if len(missed) > 10 else "")
        )
    if intervals:
        text += "\n\ninterquartile means with their 95 % bootstrap intervals:\n" + "\n".join(
            intervals
        )
    return text


def write_outputs(
    out: Path, results: dict, errors: dict, title: str, curve=None, boot: Bootstraps | int = 1
) -> str:
    """table.md and the figures in `out` (their bootstraps: `boot`'s, some perhaps made already, or
    in that many threads) -> what compare prints (printed_summary, from the same runs outside the
    bars and intervals)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    lines = [
        "| algorithm | runs | within bars | steps | steps to 0.90 | s to 0.90 | steps to 0.95 | s "
        "to 0.95 | final target | final exact E[r] | exact KL/token | worst drift: end | peak | "
        "malformed: end | peak |"
        + (
            " KL(π‖π_ref), 13 outcomes | regret | implied β | KL to π* of equal E[r] | KL to π*_β, "
            "own β | pass@8 |"
            if curve is not None
            else ""
        ),
        "|---" * (15 + 6 * (curve is not None)) + "|",
    ]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    fig2, axes2 = plt.subplots(1, 2, figsize=(11, 3.8))
    fig.suptitle(f"{title}\nexact target rate, mean and min–max over seeds", fontsize=9)
    fig2.suptitle(f"{title}\nwhere each run ended", fontsize=9)
    for i, (algo, runs) in enumerate(results.items()):
        color = f"C{i % 10}"
        if runs:
            for ax, key, label in (
                (axes[0], "secs", "wall seconds (sum of step times)"),
                (axes[1], "tokens", "sampled tokens"),
            ):
                n = min(len(c["target"]) for c in runs)
                xs = np.mean([c[key][:n] for c in runs], axis=0)
                ys = np.array([c["target"][:n] for c in runs])
                ax.plot(xs, ys.mean(0), color=color, label=algo)
                ax.fill_between(xs, ys.min(0), ys.max(0), color=color, alpha=0.2)
                ax.set_xlabel(label)
            for ax, key in (
                (axes2[0], "kl_ref" if curve is not None else "kl_exact"),
                (axes2[1], "worst_drift"),
            ):
                y = "expected_reward" if curve is not None else "exact_reward"
                nan = lambda v: float("nan") if v is None else v  #  (a task without drift)
                ax.scatter(
                    [nan(c["final"][key]) for c in runs],
                    [nan(c["final"][y]) for c in runs],
                    color=color,
                    label=algo,
                )
        f = [c["final"] for c in runs]
        row = [
            algo,
            f"{len(runs)} ok"
            + (f", {len(errors.get(algo, []))} failed" if errors.get(algo) else ""),
            f"{sum(map(within_bars, f))}/{len(f)}",
            summarise([x["steps"] for x in f]),
            *[
                summarise([first_reaching(c[key], c["target"], level) for c in runs])
                for level in (0.9, 0.95)
                for key in ("steps", "secs")
            ],
            *[
                summarise([x[k] for x in f], "-")
                for k in (
                    "target_rate",
                    "exact_reward",
                    "kl_exact",
                    "worst_drift",
                    "peak_worst_drift",
                    "malformed",
                    "peak_malformed",
                    *(OPTIMUM_KEYS if curve is not None else ()),
                )
            ],
        ]
        lines.append("| " + " | ".join(row) + " |")
    if curve is not None:
        axes2[0].plot(
            curve["kl"],
            curve["expected_reward"],
            color="black",
            lw=1,
            zorder=0,
            label="exact frontier (no policy above it)",
        )
        axes2[0].set_xlim(
            0, 1.15 * max([c["final"]["kl_ref"] for runs in results.values() for c in runs] + [0.1])
        )
    axes2[0].set_xlabel(
        "exact KL(π‖π_ref) over the target prompt's outcomes"
        if curve is not None
        else "exact KL to π_ref per token (lower = closer)"
    )
    axes2[1].set_xlabel("worst other-person drift, TV (lower is better)")
    for ax, y in [(ax, "exact target rate") for ax in axes] + [
        (ax, "final exact expected reward") for ax in axes2
    ]:
        ax.set_ylabel(f"{y} (higher is better)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for f, name in ((fig, "curves.png"), (fig2, "frontier.png")):
        f.tight_layout()
        f.savefig(out / name, dpi=90)
        plt.close(f)
    missed = outside_bars(results)
    lines += [
        "",
        f"Runs outside the bars ({len(missed)}):" if missed else "Every run within every bar.",
        *[""] * bool(missed),
        *[f"- {line}" for line in missed],
    ]
    boot = Bootstraps.of(boot)
    estimates = score_intervals(results, boot) if any(results.values()) else {}
    intervals = interval_table(results, estimates=estimates) if estimates else []
    if intervals:  # the interval tables and figure leave out an algorithm without runs
        lines += [
            "",
            "Interquartile means over seeds with their 95 % bootstrap intervals (tools/stats.py):",
            "",
            *intervals,
            "",
            "P(row > column) on the final exact target rate, with its 95 % interval (0.5: no "
            "difference; an interval without 0.5: a difference the runs support):",
            "",
            *improvement_table(results, boot),
        ]
        draw_intervals(results, out / "intervals.png", title, boot, estimates)
    for algo, errs in errors.items():
        for seed, err in errs:
            lines.append(f"\nfailed: {algo} seed {seed}: {err}")
    (out / "table.md").write_text(
        f"{title}. Medians over seeds (min–max).\n\n" + "\n".join(lines) + "\n"
    )
    return printed_summary(results, title, curve is not None, missed, intervals)
