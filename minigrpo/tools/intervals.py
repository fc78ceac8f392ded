"""compare's interval estimates (tools/stats.py) from a sweep's runs: per algorithm the IQM of three
scores with its 95 % bootstrap interval, the probability-of-improvement matrix on the final target
rate, and intervals.png.

    scores(runs)                   -> {score: [one value per run]}          runs:
                                   sweep_report.curves(...) of each run
    score_intervals(results)       -> {algorithm: {score: Estimate}}        results: {algorithm:
                                   runs}
    interval_table(results)        -> markdown lines                        (given score_intervals',
                                   or made)
    improvement_table(results)     -> markdown lines                        P(row > column) on the
                                   final target rate
    draw_intervals(results, path)  -> intervals.png: each score's IQM and interval per algorithm,
                                   and the target
                                      rate by step (IQM with its interval as a band)
    ask_early(boot, order, ended)  -> the bootstraps of the algorithms whose runs have all ended,
                                   started now

Each takes `boot`: a Bootstraps (each bootstrap made once, in its threads: numpy's partitions and
sorts let go of the interpreter lock), or a number of threads for one of its own. Each bootstrap is
seeded by what it estimates (an algorithm's place, a pair's, a step), so the tables are the same
whatever the threads and whenever it is made: compare asks for an algorithm's as its last run ends
(ask_early), while the others still run, and the report finds them made.

Steps to the goal: a run that never reaches 0.95 counts as its last step + 1, a lower bound (the
table says how many such runs there are). Regret exists on food only (the exact frontier); elsewhere
its column is left out.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from minigrpo.tools.bars import BARS, first_reaching
from minigrpo.tools.stats import Estimate, improvement_interval, iqm_interval

# score -> (its column's title, higher is better)
SCORES = {
    "final target": ("final exact target rate", True),
    "steps to 0.95": ("steps to 0.95", False),
    "regret": ("regret: frontier's E[r] at the run's KL minus its own", False),
}


def scores(runs: list[dict]) -> dict[str, list[float]]:
    out = {
        "final target": [c["final"]["target_rate"] for c in runs],
        "steps to 0.95": [
            first_reaching(c["steps"], c["target"], BARS["final"]) or c["final"]["steps"] + 1
            for c in runs
        ],
    }
    regrets = [c["final"].get("regret") for c in runs]
    if all(r is not None for r in regrets):
        out["regret"] = regrets
    return out


def never(runs: list[dict]) -> int:
    return sum(first_reaching(c["steps"], c["target"], BARS["final"]) is None for c in runs)


class Bootstraps:
    """Calls (function, *args) of the bootstraps below, each made once, in `jobs` threads: asking
    again for a call already asked (the same function and arguments) gives the first one's
    result."""

    def __init__(self, jobs: int = 1):
        self.pool, self.asked = ThreadPoolExecutor(max(1, jobs)), {}

    def ask(self, calls: list[tuple]) -> list[Future]:
        """Start the calls not yet asked for -> each call's future."""
        keys = [(f, *(tuple(a) if isinstance(a, list) else a for a in args)) for f, *args in calls]
        for key, (f, *args) in zip(keys, calls):
            if key not in self.asked:
                self.asked[key] = self.pool.submit(f, *args)
        return [self.asked[key] for key in keys]

    def made(self, calls: list[tuple]) -> list:
        """-> each call's result, in order."""
        return [future.result() for future in self.ask(calls)]

    @classmethod
    def of(cls, boot: "Bootstraps | int") -> "Bootstraps":
        """`boot` itself, or new Bootstraps of that many threads."""
        return boot if isinstance(boot, Bootstraps) else cls(boot)

    def cancel(self) -> None:
        """Drop the calls not yet begun (Ctrl-C: the process's exit would wait for them)."""
        self.pool.shutdown(wait=False, cancel_futures=True)


def _score_calls(runs: list[dict], place: int, present) -> list[tuple]:
    """The IQM of each score in `present` that the runs have, each seeded by the algorithm's
    place."""
    sc = scores(runs)
    return [(iqm_interval, sc[s], place) for s in present if s in sc]


def _band_calls(runs: list[dict]) -> list[tuple]:
    """The target rate's IQM at every step the runs all reached, each seeded by its step."""
    return [
        (iqm_interval, [c["target"][t] for c in runs], t)
        for t in range(min(len(c["target"]) for c in runs))
    ]


def _pair_call(a: list[dict], b: list[dict], i: int, j: int) -> tuple:
    """P(A > B) of the algorithms at places i, j (among those with runs) on the final target
    rate."""
    return improvement_interval, scores(a)["final target"], scores(b)["final target"], 97 * i + j


def ask_early(boot: Bootstraps, order: list[str], ended: dict[str, list[dict]]) -> None:
    """Start the bootstraps of the algorithms in `ended` (those whose runs have all ended,
    {algorithm: runs}) as the report will ask for them, each algorithm at its place in `order` (the
    report's results, every algorithm with runs): its score intervals, its band and the pairs of
    them. A call the report makes otherwise (an algorithm before it without runs) is not found made,
    and is made then: the report is the same."""
    calls = []
    for a, runs in ended.items():
        calls += _score_calls(runs, order.index(a), SCORES) + _band_calls(runs)
        calls += [  # each pair once, the earlier algorithm first (improvement_table)
            _pair_call(runs, ended[b], order.index(a), order.index(b))
            for b in ended
            if order.index(a) < order.index(b)
        ]
    boot.ask(calls)


def score_intervals(results: dict[str, list[dict]], boot: Bootstraps | int = 1) -> dict[str, dict]:
    """{algorithm: {score: its IQM's Estimate}} of each algorithm with runs, its bootstraps seeded
    by its place in `results` (what interval_table writes and draw_intervals draws: made once for
    both)."""
    sc = {a: scores(runs) for a, runs in results.items() if runs}
    present = [s for s in SCORES if all(s in x for x in sc.values())]
    seeds = {algo: seed for seed, algo in enumerate(results)}
    found = iter(
        Bootstraps.of(boot).made(
            [c for a in sc for c in _score_calls(results[a], seeds[a], present)]
        )
    )
    return {a: {s: next(found) for s in present} for a in sc}


def interval_table(
    results: dict[str, list[dict]], boot: Bootstraps | int = 1, estimates: dict | None = None
) -> list[str]:
    """One row per algorithm: the run count, then 'IQM [low, high]' of each score (`estimates`:
    score_intervals', else made here)."""
    estimates = estimates or score_intervals(results, boot)
    present = list(next(iter(estimates.values()), {}))
    lines = [
        "| algorithm | runs | " + " | ".join(f"{s}: IQM [95 % CI]" for s in present) + " |",
        "|---" * (2 + len(present)) + "|",
    ]
    for algo, found in estimates.items():
        runs = results[algo]
        cells = [
            found[s].text()
            + (f", {never(runs)} never" if s == "steps to 0.95" and never(runs) else "")
            for s in present
        ]
        lines.append(f"| {algo} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def improvement_table(results: dict[str, list[dict]], boot: Bootstraps | int = 1) -> list[str]:
    """P(row > column) on the final exact target rate, with its 95 % interval; 0.5 = no
    difference."""
    algos = [a for a, runs in results.items() if runs]
    # one bootstrap per pair: P(B > A) = 1 − P(A > B) (ties count half), on the same resamples, so
    # a cell and its mirror agree exactly, their intervals too
    pairs = [(i, j) for i in range(len(algos)) for j in range(i + 1, len(algos))]
    calls = [_pair_call(results[algos[i]], results[algos[j]], i, j) for i, j in pairs]
    found = dict(zip(pairs, Bootstraps.of(boot).made(calls)))
    mirror = lambda e: Estimate(1 - e.value, 1 - e.high, 1 - e.low)
    found.update({(j, i): mirror(e) for (i, j), e in found.items()})
    lines = ["| P(row > column) | " + " | ".join(algos) + " |", "|---" * (1 + len(algos)) + "|"]
    for i, a in enumerate(algos):
        cells = ["-" if i == j else found[i, j].text("{:.2f}") for j in range(len(algos))]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    return lines


def draw_intervals(
    results: dict[str, list[dict]],
    path: Path,
    title: str,
    boot: Bootstraps | int = 1,
    estimates: dict | None = None,
) -> None:
    """intervals.png (module docstring); `estimates`: score_intervals', else made here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    boot = Bootstraps.of(boot)
    estimates = estimates or score_intervals(results, boot)
    algos, present = list(estimates), list(next(iter(estimates.values()), {}))
    lengths = {a: min(len(c["target"]) for c in results[a]) for a in algos}
    found = iter(boot.made([c for a in algos for c in _band_calls(results[a])]))
    fig, axes = plt.subplots(
        1, len(present) + 1, figsize=(4.2 * (len(present) + 1), 0.8 + 0.35 * len(algos) + 1.5)
    )
    fig.suptitle(f"{title}\nIQM and 95 % bootstrap interval over seeds", fontsize=9)
    for ax, s in zip(axes, present):
        for y, a in enumerate(algos):
            e = estimates[a][s]
            ax.plot(
                [e.low, e.high], [y, y], color=f"C{y % 10}", lw=4, alpha=0.5, solid_capstyle="butt"
            )
            ax.plot([e.value], [y], "o", color=f"C{y % 10}")
        ax.set_yticks(range(len(algos)), algos if ax is axes[0] else [""] * len(algos))
        ax.set_xlabel(
            f"{SCORES[s][0]} ({'higher' if SCORES[s][1] else 'lower'} is better)", fontsize=8
        )
        ax.set_ylim(len(algos) - 0.5, -0.5)  # the first algorithm on top
        ax.grid(alpha=0.3, axis="x")
    ax = axes[-1]
    for k, a in enumerate(algos):
        steps = results[a][0]["steps"][: lengths[a]]
        band = [next(found) for _ in steps]
        ax.plot(steps, [e.value for e in band], color=f"C{k % 10}", label=a)
        ax.fill_between(
            steps, [e.low for e in band], [e.high for e in band], color=f"C{k % 10}", alpha=0.2
        )
    ax.axhline(BARS["final"], color="black", ls="--", lw=0.8, label=f"goal {BARS['final']}")
    ax.set_xlabel("step", fontsize=8)
    ax.set_ylabel("exact target rate (higher is better)", fontsize=8)
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
