"""compare's interval estimates (tools/stats.py) from a sweep's runs: per algorithm the IQM of three scores with its
95 % bootstrap interval, the probability-of-improvement matrix on the final target rate, and intervals.png.

    scores(runs)                   -> {score: [one value per run]}          runs: sweep_report.curves(...) of each run
    score_intervals(results)       -> {algorithm: {score: Estimate}}        results: {algorithm: runs}
    interval_table(results)        -> markdown lines                        (given score_intervals', or made)
    improvement_table(results)     -> markdown lines                        P(row > column) on the final target rate
    draw_intervals(results, path)  -> intervals.png: each score's IQM and interval per algorithm, and the target
                                      rate by step (IQM with its interval as a band)

Each takes `jobs`: its bootstraps in that many threads (numpy's partitions and sorts let go of the interpreter lock),
each seeded as it is one after another, so the tables are the same whatever `jobs`.

Steps to the goal: a run that never reaches 0.95 counts as its last step + 1, a lower bound (the table says how many
such runs there are). Regret exists on food only (the exact frontier); elsewhere its column is left out.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from minigrpo.tools.bars import BARS, first_reaching
from minigrpo.tools.stats import improvement_interval, iqm_interval

# score -> (its column's title, higher is better)
SCORES = {"final target": ("final exact target rate", True), "steps to 0.95": ("steps to 0.95", False),
          "regret": ("regret: frontier's E[r] at the run's KL minus its own", False)}


def scores(runs: list[dict]) -> dict[str, list[float]]:
    out = {"final target": [c["final"]["target_rate"] for c in runs],
           "steps to 0.95": [first_reaching(c["steps"], c["target"], BARS["final"]) or c["final"]["steps"] + 1
                             for c in runs]}
    regrets = [c["final"].get("regret") for c in runs]
    if all(r is not None for r in regrets):
        out["regret"] = regrets
    return out


def never(runs: list[dict]) -> int:
    return sum(first_reaching(c["steps"], c["target"], BARS["final"]) is None for c in runs)


def _estimates(calls: list[tuple], jobs: int) -> list:
    """Each call (function, *args) made, in `jobs` threads -> their results in order."""
    if jobs <= 1 or len(calls) < 2:
        return [f(*args) for f, *args in calls]
    with ThreadPoolExecutor(min(jobs, len(calls))) as pool:
        return list(pool.map(lambda call: call[0](*call[1:]), calls))


def score_intervals(results: dict[str, list[dict]], jobs: int = 1) -> dict[str, dict]:
    """{algorithm: {score: its IQM's Estimate}} of each algorithm with runs, its bootstraps seeded by its place in
    `results` (what interval_table writes and draw_intervals draws: made once for both)."""
    sc = {a: scores(runs) for a, runs in results.items() if runs}
    present = [s for s in SCORES if all(s in x for x in sc.values())]
    seeds = {algo: seed for seed, algo in enumerate(results)}
    found = iter(_estimates([(iqm_interval, sc[a][s], seeds[a]) for a in sc for s in present], jobs))
    return {a: {s: next(found) for s in present} for a in sc}


def interval_table(results: dict[str, list[dict]], jobs: int = 1, estimates: dict | None = None) -> list[str]:
    """One row per algorithm: the run count, then 'IQM [low, high]' of each score (`estimates`: score_intervals',
    else made here)."""
    estimates = estimates or score_intervals(results, jobs)
    present = list(next(iter(estimates.values()), {}))
    lines = ["| algorithm | runs | " + " | ".join(f"{s}: IQM [95 % CI]" for s in present) + " |",
             "|---" * (2 + len(present)) + "|"]
    for algo, found in estimates.items():
        runs = results[algo]
        cells = [found[s].text() + (f", {never(runs)} never" if s == "steps to 0.95" and never(runs) else "")
                 for s in present]
        lines.append(f"| {algo} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def improvement_table(results: dict[str, list[dict]], jobs: int = 1) -> list[str]:
    """P(row > column) on the final exact target rate, with its 95 % interval; 0.5 = no difference."""
    finals = {a: scores(runs)["final target"] for a, runs in results.items() if runs}
    algos = list(finals)
    pairs = [(i, j) for i in range(len(algos)) for j in range(len(algos)) if i != j]
    found = dict(zip(pairs, _estimates([(improvement_interval, finals[algos[i]], finals[algos[j]], 97 * i + j)
                                        for i, j in pairs], jobs)))
    lines = ["| P(row > column) | " + " | ".join(algos) + " |", "|---" * (1 + len(algos)) + "|"]
    for i, a in enumerate(algos):
        cells = ["-" if i == j else found[i, j].text("{:.2f}") for j in range(len(algos))]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    return lines


def draw_intervals(results: dict[str, list[dict]], path: Path, title: str, jobs: int = 1,
                   estimates: dict | None = None) -> None:
    """intervals.png (module docstring); `estimates`: score_intervals', else made here."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    estimates = estimates or score_intervals(results, jobs)
    algos, present = list(estimates), list(next(iter(estimates.values()), {}))
    lengths = {a: min(len(c["target"]) for c in results[a]) for a in algos}
    found = iter(_estimates([(iqm_interval, [c["target"][t] for c in results[a]], t) for a in algos
                             for t in range(lengths[a])], jobs))
    fig, axes = plt.subplots(1, len(present) + 1, figsize=(4.2 * (len(present) + 1), 0.8 + 0.35 * len(algos) + 1.5))
    fig.suptitle(f"{title}\nIQM and 95 % bootstrap interval over seeds", fontsize=9)
    for ax, s in zip(axes, present):
        for y, a in enumerate(algos):
            e = estimates[a][s]
            ax.plot([e.low, e.high], [y, y], color=f"C{y % 10}", lw=4, alpha=0.5, solid_capstyle="butt")
            ax.plot([e.value], [y], "o", color=f"C{y % 10}")
        ax.set_yticks(range(len(algos)), algos if ax is axes[0] else [""] * len(algos))
        ax.set_xlabel(f"{SCORES[s][0]} ({'higher' if SCORES[s][1] else 'lower'} is better)", fontsize=8)
        ax.set_ylim(len(algos) - 0.5, -0.5)  # the first algorithm on top
        ax.grid(alpha=0.3, axis="x")
    ax = axes[-1]
    for k, a in enumerate(algos):
        steps = results[a][0]["steps"][:lengths[a]]
        band = [next(found) for _ in steps]
        ax.plot(steps, [e.value for e in band], color=f"C{k % 10}", label=a)
        ax.fill_between(steps, [e.low for e in band], [e.high for e in band], color=f"C{k % 10}", alpha=0.2)
    ax.axhline(BARS["final"], color="black", ls="--", lw=0.8, label=f"goal {BARS['final']}")
    ax.set_xlabel("step", fontsize=8)
    ax.set_ylabel("exact target rate (higher is better)", fontsize=8)
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
