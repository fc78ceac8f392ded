"""Interval estimates over runs, the way Agarwal et al. ("Deep RL at the Edge of the Statistical
Precipice", NeurIPS 2021; their library rliable) report them, with the intervals and the test a
reviewer accepts at few runs: a robust point estimate with a 95 % BCa bootstrap interval, the
probability that one algorithm beats another, and a permutation test for a difference.

    iqm(x)                              -> float      the interquartile mean: the mean of the middle
                                                      50 % of x (NaN if any x is NaN)
    probability_of_improvement(a, b)    -> float      P(A > B): the mean over run pairs of
                                                      [a_i > b_j] + ½·[a_i = b_j]
    iqm_difference(a, b)                -> float      IQM(a) − IQM(b)
    iqm_interval(x, key)                -> Estimate   IQM and its 95 % interval
    improvement_interval(a, b, key)     -> Estimate   P(A > B) and its interval, a's and b's runs
                                                      resampled apart
    difference_interval(a, b, key)      -> Estimate   IQM(a) − IQM(b) and its interval, likewise
    permutation_p(a, b, key)            -> float      two-sided p of IQM(a) − IQM(b) = 0 when the
                                                      runs' labels are exchanged at random
    holm(ps)                            -> [float]    the p's of tests made together, adjusted so
                                                      that P(any false call) <= α (Holm 1979)

x, a, b: 1-D sequences of one score per run (final target rate, steps to the goal, regret). Why the
IQM: the median ignores half the runs, the mean follows a single outlier; the IQM discards the best
and worst quarter (scipy.stats.trim_mean(x, 0.25), rliable's `IQM`). P(A > B) is the Mann–Whitney U
statistic over m·n (rliable's `probability_of_improvement`): 0.5 means no difference.

The intervals: scipy.stats.bootstrap's bias-corrected and accelerated (BCa) interval (Efron &
Tibshirani 1993, ch. 14), RESAMPLES draws from numpy's default_rng((SEED, *key)), so a table is
reproducible and each estimate has its own draws (`key`: what it estimates). Departures from
rliable: its intervals are percentile ones and its bootstrap stratified over tasks; a compare sweep
measures one task, so the bootstrap is the ordinary one over runs, and BCa because the percentile
interval is too narrow at few runs (docs/running.md, simulated). Where BCa is undefined (the
jackknife values all equal, e.g. every run of A above every run of B) the interval is the percentile
one of the same draws. Runs all alike (one run, say) give an
interval of their value alone (low = high). A NaN among the runs gives NaN (as rliable): the caller
leaves such runs out and says so (intervals.py).

The permutation test (scipy.stats.permutation_test, PERMUTATIONS random relabellings, or every one
when there are fewer) holds its level at any number of runs: for two algorithms of one
distribution P(p < 0.05) <= 0.05, which no bootstrap interval guarantees at 5 runs. compare tests
every algorithm against one baseline, k tests at once, so a call needs its Holm-adjusted p < 0.05:
the chance of any false call among the k stays <= 0.05, as the chance of one does for a single test.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

RESAMPLES = 2000
PERMUTATIONS = 9999
LEVEL = 0.95
SEED = 0
METHOD = (
    f"{LEVEL:.0%} BCa bootstrap intervals (scipy.stats.bootstrap, {RESAMPLES} resamples of the "
    f"runs; numpy generator seed {SEED}, one stream per estimate) and a two-sided permutation test "
    f"of the IQMs' difference ({PERMUTATIONS} relabellings)"
).replace("95%", "95 %")


class Estimate(NamedTuple):
    value: float
    low: float
    high: float

    def text(self, fmt: str = "{:.3g}") -> str:
        return f"{fmt.format(self.value)} [{fmt.format(self.low)}, {fmt.format(self.high)}]"

    def excludes(self, x: float) -> bool:
        """The interval leaves out x (False for a NaN interval)."""
        return bool(self.low > x or self.high < x)


def iqm(x, axis: int = -1) -> float | np.ndarray:
    """The mean of the middle 50 %: trims ⌊n/4⌋ runs from each end (n < 4: the plain mean).
    scipy.stats.trim_mean(x, 0.25)'s arithmetic (its partition, then the mean of the kept slice),
    without its per-call checks: the bootstrap calls it on every batch of resamples. A NaN among
    the values gives NaN (a partition would sort it to an end and trim it away)."""
    a = np.moveaxis(np.asarray(x, dtype=float), axis, -1)
    n = a.shape[-1]
    cut = n // 4
    kept = np.partition(a, (cut, n - cut - 1), axis=-1)[..., cut : n - cut]
    return np.where(np.isnan(a).any(axis=-1), np.nan, kept.mean(axis=-1))[()]


def probability_of_improvement(a, b, axis: int = -1) -> float | np.ndarray:
    """P(A > B) over every pair of one run of a and one run of b, ties counted half; along `axis`
    (the runs). Counted through ranks, as the Mann–Whitney U: U = (the sum of a's ranks among a ∪ b,
    ties at their mean rank) − m(m + 1)/2, and P = U / (m·n): a sort of m + n values instead of m·n
    comparisons (the pairs' count is the tests' oracle). Every term is a multiple of ½, so U is
    exact and P the pair count's mean to the last bit. NaN where a NaN is among them."""
    # here, not at the top: compare's worker processes import this module and never use it
    from scipy import stats

    a, b = (
        np.moveaxis(np.asarray(a, dtype=float), axis, -1),
        np.moveaxis(np.asarray(b, dtype=float), axis, -1),
    )
    # a batch of resamples of one against the other's runs
    lead = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    m, n = a.shape[-1], b.shape[-1]
    a, b = np.broadcast_to(a, (*lead, m)), np.broadcast_to(b, (*lead, n))
    both = np.concatenate([a, b], axis=-1)
    ranks = stats.rankdata(both, axis=-1)  # ties: their mean rank
    u = ranks[..., :m].sum(axis=-1) - m * (m + 1) / 2
    return np.where(np.isnan(both).any(axis=-1), np.nan, u / (m * n))[()]


def iqm_difference(a, b, axis: int = -1) -> float | np.ndarray:
    """IQM(a) − IQM(b) along `axis` (the runs)."""
    return iqm(a, axis=axis) - iqm(b, axis=axis)


def _rng(key) -> np.random.Generator:
    return np.random.default_rng((SEED, *np.atleast_1d(key).tolist()))


def _jackknife(samples: tuple, i: int, statistic) -> np.ndarray:
    """The statistic with each run of sample i left out in turn (BCa's acceleration)."""
    x = samples[i]
    left_out = np.stack([np.delete(x, k) for k in range(x.size)])
    rest = [s[None] for s in samples]
    rest[i] = left_out
    return np.asarray(statistic(*rest, axis=-1))


def _interval(samples: tuple, statistic, key) -> Estimate:
    from scipy import stats  # as in probability_of_improvement

    value = float(statistic(*samples, axis=-1))
    # runs all alike: themselves; NaN: NaN
    free = [i for i, s in enumerate(samples) if s.size > 1 and s.min() < s.max()]
    if not free or value != value:
        return Estimate(value, value, value)

    # scipy resamples the free samples only (it refuses one observation)
    def on_resamples(*drawn, axis=-1):
        full = list(samples)
        for i, x in zip(free, drawn):
            full[i] = x
        return statistic(*full, axis=axis)

    def bootstrap(method):  # the same draws for either method: the generator made anew
        return stats.bootstrap(
            [samples[i] for i in free],
            on_resamples,
            n_resamples=RESAMPLES,
            confidence_level=LEVEL,
            method=method,
            vectorized=True,
            batch=500,
            rng=_rng(key),
        ).confidence_interval

    # BCa's acceleration divides by the spread of the jackknife values: none, no BCa
    defined = any(np.ptp(_jackknife(samples, i, statistic)) > 0 for i in free)
    # scipy warns where BCa is degenerate (NaN ends): the percentile interval stands in, below
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        ci = bootstrap("BCa") if defined else None
    if ci is None or not (np.isfinite(ci.low) and np.isfinite(ci.high)):
        ci = bootstrap("percentile")
    return Estimate(value, float(ci.low), float(ci.high))


def iqm_interval(x, key=0) -> Estimate:
    """The IQM of x and its 95 % BCa interval over the runs."""
    return _interval((np.asarray(x, dtype=float),), iqm, key)


def improvement_interval(a, b, key=0) -> Estimate:
    """P(A > B) and its 95 % BCa interval: a's runs and b's runs resampled independently.
    P(B > A) is 1 − this, and its interval this one's reflected (BCa respects a monotone map)."""
    return _interval(
        (np.asarray(a, dtype=float), np.asarray(b, dtype=float)), probability_of_improvement, key
    )


def difference_interval(a, b, key=0) -> Estimate:
    """IQM(a) − IQM(b) and its 95 % BCa interval: a's runs and b's resampled independently."""
    return _interval((np.asarray(a, dtype=float), np.asarray(b, dtype=float)), iqm_difference, key)


def permutation_p(a, b, key=0) -> float:
    """The two-sided p-value of IQM(a) − IQM(b) under exchanged labels: the share of relabellings
    of the m + n runs into groups of m and n whose difference is at least as far from 0 as the
    runs' own (scipy.stats.permutation_test; every relabelling when there are at most PERMUTATIONS,
    else PERMUTATIONS at random, the runs' own counted). NaN where a run is NaN or a group has
    fewer than 2 runs (scipy's test refuses one)."""
    from scipy import stats

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2 or np.isnan(a).any() or np.isnan(b).any():
        return float("nan")
    return float(
        stats.permutation_test(
            (a, b),
            iqm_difference,
            permutation_type="independent",
            vectorized=True,
            n_resamples=PERMUTATIONS,
            batch=2000,
            rng=_rng(key),
        ).pvalue
    )


def holm(ps) -> list[float]:
    """Holm's step-down adjustment of m p-values tested together (Holm 1979, "A simple sequentially
    rejective multiple test procedure", Scand. J. Statist. 6): the i-th smallest (i = 1..m) becomes
    max_{j <= i} min(1, (m − j + 1)·p_(j)). Calling where the adjusted p < α keeps the family-wise
    error (the chance of any false call) <= α whatever the tests' dependence; it is uniformly more
    powerful than Bonferroni's m·p. A NaN stays NaN and does not count in m. -> in the given
    order."""
    ps = np.asarray(ps, dtype=float)
    out, finite = np.full(ps.shape, np.nan), np.flatnonzero(~np.isnan(ps))
    order = finite[np.argsort(ps[finite], kind="stable")]  # smallest first
    scaled = np.minimum(1.0, (order.size - np.arange(order.size)) * ps[order])
    out[order] = np.maximum.accumulate(scaled)
    return out.tolist()
