"""What compare writes from a sweep's finished runs: each run's curves read back from its
metrics.jsonl, then table.md (medians over seeds in two tables of at most 10 columns, the runs
outside the bars with what each missed, then the IQMs with their intervals, the differences from
the baseline and P(A better than B): run_tables.py, intervals.py, interval_tables.py), runs.csv
(every run's figures) and the figures (curves.png, frontier.png: sweep_figures.py; intervals.png:
interval_figure.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from minigrpo.tools.interval_figure import draw_intervals
from minigrpo.tools.interval_tables import printed_statistics, statistics_markdown
from minigrpo.tools.intervals import Bootstraps, comparison
from minigrpo.tools.run_tables import (
    FINAL_KEYS,
    main_table,
    more_table,
    outside_bars,
    short_table,
    short_world_table,
    world_keys,
    world_table,
    write_runs_csv,
)
from minigrpo.tools.sweep_figures import draw_curves, draw_frontier
from minigrpo.util.jsonl import read_jsonl

# what tests and the bench read from here (defined in run_tables.py)
__all__ = ["curves", "outside_bars", "printed_summary", "short_table", "write_outputs"]


def _logged(row: dict, key: str) -> float:
    """A figure of an evaluation row as logged: null is a non-finite number (strict JSON,
    util/jsonl.py), NaN, except implied_beta's, +inf (a reward no finite β reaches)."""
    v = row[key]
    return v if v is not None else float("inf") if key == "implied_beta" else float("nan")


def curves(folder: Path) -> dict:
    """A run's curves from its metrics.jsonl: the exact target rate by step (with the wall seconds
    and sampled tokens to it), the last value of each of FINAL_KEYS, the world's own figures and the
    steps of the peaks. An evaluation's figure logged as null (non-finite) reads NaN, so compare
    leaves that run out of the figure's statistics and names it (tools/intervals.py)."""
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
                out["target"].append(_logged(r, "target_rate")),
            )
            out["steps"].append(r["step"])
    evaluations = [r for r in rows if "target_rate" in r]
    first, last = (evaluations[0], evaluations[-1]) if evaluations else ({}, {})
    # an evaluation's figure: the last evaluation's; a step's (a step that skipped its update, e.g.
    # DAPO's, logs no KL): its last logged value
    out["final"] = {
        k: _logged(last, k)
        if k in first and k in last
        else next((r[k] for r in reversed(rows) if r.get(k) is not None), None)
        for k in FINAL_KEYS
    }
    out["final"]["steps"] = rows[-1]["step"] if rows else float("nan")
    # the world's own figures (run_tables.world_keys): the last value, a malformed figure's maximum
    keys = world_keys(first)
    out["world"] = {}
    for k in keys:
        values = [r[name] for r in rows if r.get(name := k.removeprefix("peak_")) is not None]
        if values:
            out["world"][k] = max(values) if k.startswith("peak_") else values[-1]
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


def printed_summary(
    results: dict, title: str, regret: bool, missed: list[str], statistics: list[str]
) -> str:
    """What compare prints at the end: the short table, the runs outside the bars (`missed`,
    outside_bars'; at most 10: table.md lists them all) and the IQMs with their intervals and the
    differences from the baseline (`statistics`, interval_tables.printed_statistics'), every line
    at most 120 characters."""
    text = f"\n{textwrap.fill(title, 120)}; medians over seeds:\n{short_table(results, regret)}"
    world = short_world_table(results)
    if world:
        text += "\n\nthe world's own figures, medians over seeds (table.md: ranges, held-out):"
        text += f"\n{world}"
    if missed:
        text += (
            f"\n\noutside the bars ({len(missed)}):\n"
            + "\n".join(f"  {m}" for m in missed[:10])
            + (f"\n  … {len(missed) - 10} more in table.md" if len(missed) > 10 else "")
        )
    if statistics:
        text += "\n\n" + "\n".join(
            textwrap.fill(line, 120, subsequent_indent="  ") if len(line) > 120 else line
            for line in statistics
        )
    return text


def write_outputs(
    out: Path, results: dict, errors: dict, title: str, curve=None, boot: Bootstraps | int = 1
) -> str:
    """table.md, runs.csv and the figures in `out` (their bootstraps: `boot`'s, some perhaps made
    already, or in that many threads) -> what compare prints (printed_summary, from the same runs
    outside the bars and estimates)."""
    regret, boot = curve is not None, Bootstraps.of(boot)
    draw_curves(results, out / "curves.png", title)
    draw_frontier(results, out / "frontier.png", title, curve)
    write_runs_csv(out / "runs.csv", results)
    missed = outside_bars(results)
    lines = [
        f"{title}.",
        "",
        "## Medians over seeds (min–max)",
        "",
        *main_table(results, errors, regret),
        "",
        "More figures, medians (min–max); every run's figures are in runs.csv beside this table:",
        "",
        *more_table(results, regret),
        *(
            ["", "The world's own figures (the task's exact evaluation), medians (min–max):", ""]
            if world_table(results)
            else []
        ),
        *world_table(results),
        "",
        f"Runs outside the bars ({len(missed)}):" if missed else "Every run within every bar.",
        *[""] * bool(missed),
        *[f"- {line}" for line in missed],
    ]
    statistics = []
    if any(results.values()):  # the interval tables and figure leave out an algorithm without runs
        c = comparison(results, boot)
        lines += ["", *statistics_markdown(c)]
        statistics = printed_statistics(c)
        draw_intervals(c, results, out / "intervals.png", title, boot)
    for algo, errs in errors.items():
        for seed, err in errs:
            lines.append(f"\nfailed: {algo} seed {seed}: {err}")
    (out / "table.md").write_text("\n".join(lines).rstrip("\n") + "\n")
    return printed_summary(results, title, regret, missed, statistics)
