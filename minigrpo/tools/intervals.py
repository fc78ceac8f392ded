"""compare's interval estimates (tools/stats.py) from a sweep's runs: for each figure that judges a
run (final target rate, steps to 0.95, regret) every algorithm's IQM with its 95 % interval, the
difference of each algorithm's IQM from the baseline's (the first algorithm) with its interval and
a permutation test, and P(A better than B) for every pair with its interval.

    scores(runs)                     -> {figure: [one value per run]}   runs: curves(...) of each
    comparison(results, boot)        -> Comparison                      results: {algorithm: runs}
    ask_early(boot, order, ended)    -> the bootstraps of the algorithms whose runs have all ended,
                                        started now
    verdict(c, figure, algo)         -> what the runs say of algo against the baseline

"Better" is a figure's direction: a higher final target rate, fewer steps to 0.95, a lower regret.
P(A better than B) is stats.probability_of_improvement on the values signed so that higher is better
(ties count half). A run whose figure is NaN or infinite is left out of that figure's statistics
(Comparison.left_out names it); n per algorithm and figure is what remains. Below MIN_RUNS runs a
bootstrap interval covers less than its nominal 95 % (tests/test_stats.py simulates it), so
`verdict` calls no difference there; at MIN_RUNS or more a difference is supported when its interval
leaves out 0 AND its permutation test's p, Holm-adjusted over the algorithms tested against the
baseline on that figure (stats.holm), is < ALPHA.

Each takes `boot`: a Bootstraps (each bootstrap made once, in its threads: numpy's partitions and
sorts let go of the interpreter lock), or a number of threads for one of its own. Each bootstrap is
keyed by what it estimates (a figure, an algorithm's place, a pair's, a step: stats' generator
stream), so the tables are the same whatever the threads and whenever it is made: compare asks for
an algorithm's as its last run ends (ask_early), while the others still run, and the report finds
them made.

Steps to the goal: a run that never reaches 0.95 counts as its last step + 1, a lower bound (the
table says how many such runs there are). Regret exists on food only (the exact frontier); elsewhere
it is left out.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from minigrpo.tools.bars import BARS, first_reaching
from minigrpo.tools.stats import (
    Estimate,
    difference_interval,
    holm,
    improvement_interval,
    iqm_interval,
    permutation_p,
)

# figure -> (what it is, higher is better)
SCORES = {
    "final target": ("final exact target rate", True),
    "steps to 0.95": ("steps to 0.95", False),
    "regret": ("regret: frontier's E[r] at the run's KL minus its own", False),
}
MIN_RUNS = 10  # fewer runs per algorithm: intervals unreliable, no difference called
ALPHA = 0.05


def _steps_to_goal(c: dict) -> float:
    """The first step whose target rate is >= 0.95 (step 0 too); never: the last step + 1."""
    step = first_reaching(c["steps"], c["target"], BARS["final"])
    return c["final"]["steps"] + 1 if step is None else step


def scores(runs: list[dict]) -> dict[str, list[float]]:
    out = {
        "final target": [c["final"]["target_rate"] for c in runs],
        "steps to 0.95": [_steps_to_goal(c) for c in runs],
    }
    regrets = [c["final"].get("regret") for c in runs]
    if all(r is not None for r in regrets):
        out["regret"] = regrets
    return out


def never(runs: list[dict]) -> int:
    return sum(first_reaching(c["steps"], c["target"], BARS["final"]) is None for c in runs)


def finite_scores(algo: str, runs: list[dict]) -> tuple[dict[str, tuple], dict[str, list[str]]]:
    """-> ({figure: its finite values, a tuple}, {figure: one line per value left out, naming its
    run})."""
    kept, left_out = {}, {}
    for figure, values in scores(runs).items():
        kept[figure] = tuple(float(v) for v in values if v is not None and math.isfinite(v))
        left_out[figure] = [
            f"{c.get('run', f'{algo} run {i}')}: {figure} is {v}, left out of its statistics"
            for i, (c, v) in enumerate(zip(runs, values))
            if v is None or not math.isfinite(v)
        ]
    return kept, left_out


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


def signed(figure: str, values: tuple) -> tuple:
    """The values with higher = better (a lower-is-better figure negated)."""
    return values if SCORES[figure][1] else tuple(-v for v in values)


def _calls(order: list[str], values: dict[str, dict], present: list[str]) -> dict[tuple, tuple]:
    """{(what, figure, algo[, other]): its call} for the algorithms in `values` ({algorithm: its
    finite_scores}), each at its place in `order` (order[0]: the baseline): their IQMs, each pair's
    P(A better than B) once (the earlier algorithm first), and against the baseline (when it is
    among them) the difference of IQMs and its permutation test."""
    calls, base = {}, order[0]
    for f, figure in enumerate(present):
        for a, x in values.items():
            i = order.index(a)
            calls["iqm", figure, a] = (iqm_interval, x[figure], (1, f, i))
            for b, y in values.items():
                j = order.index(b)
                if i < j:
                    pair = (improvement_interval, signed(figure, x[figure]))
                    calls["p", figure, a, b] = (*pair, signed(figure, y[figure]), (3, f, i, j))
            if base in values and a != base:
                them = (x[figure], values[base][figure])
                calls["difference", figure, a] = (difference_interval, *them, (4, f, i))
                calls["test", figure, a] = (permutation_p, *them, (5, f, i))
    return calls


def band_calls(runs: list[dict]) -> list[tuple]:
    """The target rate's IQM at every step the runs all reached (its finite values), each keyed by
    its step."""
    return [
        (iqm_interval, tuple(c["target"][t] for c in runs if math.isfinite(c["target"][t])), (2, t))
        for t in range(min(len(c["target"]) for c in runs))
    ]


def _present(values: dict[str, dict]) -> list[str]:
    return [s for s in SCORES if all(s in x for x in values.values())]


def ask_early(boot: Bootstraps, order: list[str], ended: dict[str, list[dict]]) -> None:
    """Start the bootstraps of the algorithms in `ended` (those whose runs have all ended,
    {algorithm: runs}) as the report will ask for them, each algorithm at its place in `order` (the
    report's results, every algorithm with runs): its IQMs, its band, its pairs with the others
    ended and, once the baseline has ended, its difference from it. A call the report makes
    otherwise (an algorithm before it without runs, a figure another algorithm lacks) is not found
    made, and is made then: the report is the same."""
    values = {a: finite_scores(a, runs)[0] for a, runs in ended.items() if runs}
    calls = list(_calls(order, values, _present(values)).values())
    boot.ask(calls + [c for runs in ended.values() if runs for c in band_calls(runs)])


@dataclass
class Comparison:
    """What the report's tables and intervals.png show (module docstring)."""

    algos: list[str]  # with runs; algos[0] the baseline
    figures: list[str]  # those every algorithm has
    n: dict[str, dict[str, int]]  # {algo: {figure: runs counted}}
    iqm: dict[str, dict[str, Estimate]]  # {algo: {figure: IQM}}
    better: dict[str, dict[tuple, Estimate]]  # {figure: {(a, b): P(a better than b)}}, both ways
    difference: dict[str, dict[str, Estimate]]  # {figure: {algo: IQM(algo) − IQM(baseline)}}
    p: dict[str, dict[str, float]]  # {figure: {algo: the permutation test's p}}
    p_holm: dict[str, dict[str, float]]  # {figure: {algo: p, Holm-adjusted over the figure's}}
    never: dict[str, int]  # {algo: runs that never reached 0.95}
    left_out: list[str] = field(default_factory=list)

    @property
    def baseline(self) -> str:
        return self.algos[0]


def comparison(results: dict[str, list[dict]], boot: Bootstraps | int = 1) -> Comparison:
    """Every estimate of the algorithms with runs, in `results`' order (module docstring)."""
    algos = [a for a, runs in results.items() if runs]
    found = {a: finite_scores(a, results[a]) for a in algos}
    values = {a: kept for a, (kept, _) in found.items()}
    present = _present(values)
    calls = _calls(algos, values, present)
    made = dict(zip(calls, Bootstraps.of(boot).made(list(calls.values()))))
    mirror = lambda e: Estimate(1 - e.value, 1 - e.high, 1 - e.low)
    better = {s: {} for s in present}
    for (what, figure, a, *b), e in made.items():
        if what == "p":  # one bootstrap per pair: P(B better) = 1 − P(A better), same resamples
            better[figure][a, b[0]], better[figure][b[0], a] = e, mirror(e)
    pick = lambda what: {
        s: {k[2]: e for k, e in made.items() if k[:2] == (what, s)} for s in present
    }
    p = pick("test")
    return Comparison(
        algos=algos,
        figures=present,
        n={a: {s: len(values[a][s]) for s in present} for a in algos},
        iqm={a: {s: made["iqm", s, a] for s in present} for a in algos},
        better=better,
        difference=pick("difference"),
        p=p,
        p_holm={s: dict(zip(p[s], holm(list(p[s].values())))) for s in present},
        never={a: never(results[a]) for a in algos},
        left_out=[line for a in algos for s in present for line in found[a][1][s]],
    )


def verdict(c: Comparison, figure: str, algo: str) -> str:
    """What the runs say of `algo` against the baseline on `figure`: 'better' or 'worse' (its
    difference's interval leaves out 0 and its Holm-adjusted p < ALPHA, with MIN_RUNS runs or more
    on both sides),
    'no difference shown', or that there are too few runs to say."""
    fewest = min(c.n[algo][figure], c.n[c.baseline][figure])
    if fewest < MIN_RUNS:
        return f"n < {MIN_RUNS}: none called"
    d, p = c.difference[figure][algo], c.p_holm[figure][algo]
    if not (d.excludes(0.0) and p < ALPHA):
        return "no difference shown"
    higher = SCORES[figure][1]
    return "better" if (d.value > 0) == higher else "worse"
