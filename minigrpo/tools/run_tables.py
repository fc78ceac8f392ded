"""compare's tables of a sweep's runs, medians over seeds (min–max), and every run's figures:

    main_table(results, errors, regret)  -> markdown lines: at most 10 columns, what judges a run
    more_table(results, regret)          -> markdown lines: the other figures
    short_table(results, regret)         -> what compare prints, aligned for a terminal
    short_world_table(results)           -> the same of the world's figures ('' where none)
    world_table(results, held_out)       -> markdown lines: the world's own figures (world_keys)
    write_runs_csv(path, results)        -> runs.csv: one row per run, every figure
    outside_bars(results)                -> one line per run outside a quality bar

results: {algorithm: [sweep_report.curves(...) of each run]}; regret: food's figures exist (the
exact frontier); errors: {algorithm: [(seed, error)]} of the failed runs.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from minigrpo.tools.bars import BARS, first_reaching, med, missed_bars, within_bars

OPTIMUM_KEYS = (
    "kl_ref",
    "regret",
    "implied_beta",
    "kl_to_implied_optimum",
    "kl_to_optimum",
    "pass_at_8",
)
# the run's last value of each metric (sweep_report.curves' "final"), runs.csv's columns
FINAL_KEYS = (
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
# what a task's evaluation logs that is not its world's own figure: the step, the support's best
# reward and its off-support mass (the reward's figures beside target_rate)
NOT_WORLD = ("step", "best_reward", "off_support")
WORLD_COLUMNS = 9  # algorithms per world table: with the figure's name, at most 10 columns


def world_keys(first: dict) -> list[str]:
    """The world's own figures of a run whose first evaluation (step 0, before any update) logged
    `first`: its numbers that FINAL_KEYS do not carry, less NOT_WORLD, each person's drift
    (worst_drift carries them) and the running peaks; then peak_<k> of each malformed figure k
    (malformed_heldout: its every-step maximum). Sums: exact_accuracy, exact_think_rate, the
    lengths, pass@k, the entropy, their *_heldout, heldout_rate, malformed_heldout; food: none."""
    keys = [
        k
        for k, v in first.items()
        if isinstance(v, (int, float))
        and not isinstance(v, bool)
        and k not in FINAL_KEYS
        and k not in NOT_WORLD
        and not k.startswith(("drift_", "peak_"))
    ]
    return keys + [f"peak_{k}" for k in keys if k.startswith("malformed")]


def world_names(results: dict) -> list[str]:
    """Every world figure of the runs (curves' "world"), in the order the runs logged them."""
    return list(dict.fromkeys(k for runs in results.values() for c in runs for k in world_of(c)))


def world_of(c: dict) -> dict:
    """A run's world figures (sweep_report.curves' "world"; {} for a run read without them)."""
    return c.get("world") or {}


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


def _reaching(runs: list[dict], key: str, level: float) -> list:
    return [first_reaching(c[key], c["target"], level) for c in runs]


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|---" * len(header) + "|",
        *["| " + " | ".join(row) + " |" for row in rows],
    ]


def main_table(results: dict, errors: dict, regret: bool) -> list[str]:
    """Per algorithm: its runs (and failed ones), those within every bar, then medians (min–max)
    of the steps and seconds to 0.95, the final target rate, the end and peak drift, the peak
    malformed mass and (food) the regret: at most 10 columns."""
    goal = BARS["final"]
    header = ["algorithm", "runs", "within bars", f"steps to {goal:g}", f"seconds to {goal:g}"]
    header += ["final target", "end drift", "peak drift", "peak malformed", *["regret"][:regret]]
    rows = []
    for algo, runs in results.items():
        f = [c["final"] for c in runs]
        failed = len(errors.get(algo, []))
        rows.append(
            [
                algo,
                f"{len(runs)} ok" + (f", {failed} failed" if failed else ""),
                f"{sum(map(within_bars, f))}/{len(f)}",
                *[summarise(_reaching(runs, key, goal)) for key in ("steps", "secs")],
                *[
                    summarise([x[k] for x in f], "-")
                    for k in ("target_rate", "worst_drift", "peak_worst_drift", "peak_malformed")
                    + ("regret",) * regret
                ],
            ]
        )
    return _markdown(header, rows)


def more_table(results: dict, regret: bool) -> list[str]:
    """Per algorithm, medians (min–max): the steps and seconds to 0.90, the final E[r], the end
    malformed mass, the exact KL per token and (food) the KL over the 13 outcomes, the implied β,
    the KL to the optimum of equal E[r] and pass@8: at most 10 columns."""
    header = ["algorithm", "steps to 0.9", "seconds to 0.9", "final E[r]", "end malformed"]
    header += ["KL per token"]
    keys = ["exact_reward", "malformed", "kl_exact"]
    if regret:
        header += ["KL over 13 outcomes", "implied β", "KL to equal-E[r] optimum", "pass@8"]
        keys += ["kl_ref", "implied_beta", "kl_to_implied_optimum", "pass_at_8"]
    rows = [
        [
            algo,
            *[summarise(_reaching(runs, key, 0.9)) for key in ("steps", "secs")],
            *[summarise([c["final"][k] for c in runs], "-") for k in keys],
        ]
        for algo, runs in results.items()
        if runs
    ]
    return _markdown(header, rows)


def world_table(results: dict, held_out: bool = True) -> list[str]:
    """The world's own figures (world_names), a row each, medians (min–max) over each algorithm's
    runs of their last values, an algorithm a column (WORLD_COLUMNS at a time: tables of at most 10
    columns); held_out=False leaves out the *_heldout rows. [] where the runs log none (food)."""
    names = [n for n in world_names(results) if held_out or "heldout" not in n]
    algos = [a for a, runs in results.items() if runs]
    lines = []
    for i in range(0, len(algos) * bool(names), WORLD_COLUMNS):
        part = algos[i : i + WORLD_COLUMNS]
        rows = [
            [
                name,
                *[
                    summarise(
                        [v for c in results[a] if (v := world_of(c).get(name)) is not None], "-"
                    )
                    for a in part
                ],
            ]
            for name in names
        ]
        lines += [*[""] * bool(lines), *_markdown(["figure", *part], rows)]
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
                median(_reaching(runs, "steps", goal), never=True),
                *[
                    median([x[k] for x in f])
                    for k in ("target_rate", "peak_worst_drift", "peak_malformed", "regret")[
                        : 4 if regret else 3
                    ]
                ],
            ]
        )
    return _aligned(rows)


def short_world_table(results: dict) -> str:
    """What compare prints of the world's own figures on the RL prompts (world_table without the
    held-out rows): a row each, the median of each algorithm's runs, aligned; '' where none."""
    names = [n for n in world_names(results) if "heldout" not in n]
    algos = [a for a, runs in results.items() if runs]
    if not names:
        return ""
    rows = [["figure", *algos]] + [
        [n, *[median([world_of(c).get(n) for c in results[a]]) for a in algos]] for n in names
    ]
    return _aligned(rows)


def _aligned(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows
    )


def write_runs_csv(path: Path, results: dict) -> None:
    """runs.csv: per run its algorithm, folder, whether it is within every bar (and what it
    missed), the steps it ran, the steps and seconds to 0.90 and 0.95 (empty: never), the last
    value of every metric in FINAL_KEYS and of the world's own figures (world_names; empty:
    none)."""
    header = ["algorithm", "run", "within bars", "missed", "steps"]
    header += [f"{what} to {level:g}" for level in (0.9, 0.95) for what in ("steps", "seconds")]
    world = world_names(results)
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(header + list(FINAL_KEYS) + world)
        for algo, runs in results.items():
            for c in runs:
                reached = [
                    first_reaching(c[key], c["target"], level)
                    for level in (0.9, 0.95)
                    for key in ("steps", "secs")
                ]
                out.writerow(
                    [
                        algo,
                        c.get("run", ""),
                        within_bars(c["final"]),
                        "; ".join(missed_bars(c["final"]).values()),
                        c["final"]["steps"],
                        *["" if v is None else v for v in reached],
                        *["" if c["final"].get(k) is None else c["final"][k] for k in FINAL_KEYS],
                        *["" if world_of(c).get(k) is None else world_of(c)[k] for k in world],
                    ]
                )


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
