"""Interval estimates over runs, the way Agarwal et al. ("Deep RL at the Edge of the Statistical
Precipice", NeurIPS 2021; their library rliable) report them: a robust point estimate with a 95 %
bootstrap confidence interval, and the probability that one algorithm beats another.

    iqm(x)                              -> float      the interquartile mean: the mean of the middle
                                        50 % of x
    iqm_interval(x, seed)               -> Estimate   IQM and its 95 % percentile-bootstrap interval
    probability_of_improvement(a, b)    -> float      P(A > B): the mean over run pairs of [a_i >
                                        b_j] + ½·[a_i = b_j]
    improvement_interval(a, b, seed)    -> Estimate   P(A > B) and its interval, a's and b's runs
                                        resampled apart

x, a, b: 1-D sequences of one score per run (final target rate, steps to the goal, regret). Why the
IQM: the median ignores half the runs, the mean follows a single outlier; the IQM discards the best
and worst quarter (scipy.stats.trim_mean(x, 0.25), rliable's `IQM`). P(A > B) is the Mann–Whitney U
statistic over m·n (rliable's `probability_of_improvement`): 0.5 means no difference, and its
interval excluding 0.5 is a difference the runs support.

Source and departures: rliable resamples runs within each task (a stratified bootstrap) and
aggregates over tasks; a compare sweep measures one task, so its strata are one and the bootstrap is
the ordinary one over runs. The resampling is scipy.stats.bootstrap's (percentile intervals, as
rliable), with RESAMPLES draws from a seeded generator, so a table is reproducible. Runs all alike
(one run, say) give an interval of their value alone (low = high).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


class Estimate(NamedTuple):
    value: float
    low: float
    high: float

    def text(self, fmt: str = "{:.3g}") -> str:
        return f"{fmt.format(self.value)} [{fmt.format(self.low)}, {fmt.format(self.high)}]"


def iqm(x, axis: int = -1) -> float | np.ndarray:
    """The mean of the middle 50 %: trims ⌊n/4⌋ runs from each end (n < 4: the plain mean).
    scipy.stats.trim_mean(x, 0.25)'s arithmetic (its partition, then the mean of the kept slice),
    without its per-call checks: the bootstrap calls it on every batch of resamples."""
    a = np.moveaxis(np.asarray(x, dtype=float), axis, -1)
    n = a.shape[-1]
    cut = n // 4
    kept = np.partition(a, (cut, n - cut - 1), axis=-1)[..., cut : n - cut]
    return kept.mean(axis=-1)[()]


def probability_of_improvement(a, b, axis: int = -1) -> float | np.ndarray:
    """P(A > B) over every pair of one run of a and one run of b, ties counted half; along `axis`
    (the runs). Counted through ranks, as the Mann–Whitney U: U = (the sum of a's ranks among a ∪ b,
    ties at their mean rank) − m(m + 1)/2, and P = U / (m·n): a sort of m + n values instead of m·n
    comparisons (the pairs' count is the tests' oracle). Every term is a multiple of ½, so U is
    exact and P the pair count's mean to the last bit."""
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
    ranks = stats.rankdata(np.concatenate([a, b], axis=-1), axis=-1)  # ties: their mean rank
    u = ranks[..., :m].sum(axis=-1) - m * (m + 1) / 2
    return (u / (m * n))[()]


def _interval(samples: tuple, statistic, seed: int) -> Estimate:
    from scipy import stats  # as in probability_of_improvement

    value = float(statistic(*samples, axis=-1))
    # runs all alike: themselves
    free = [i for i, s in enumerate(samples) if s.size > 1 and s.min() < s.max()]
    if not free:  # nothing to resample
        return Estimate(value, value, value)

    # scipy resamples the free samples only (it refuses one observation)
    def on_resamples(*drawn, axis=-1):
        full = list(samples)
        for i, x in zip(free, drawn):
            full[i] = x
        return statistic(*full, axis=axis)

    res = stats.bootstrap(
        [samples[i] for i in free],
        on_resamples,
        n_resamples=RESAMPLES,
        confidence_level=LEVEL,
        method="percentile",
        vectorized=True,
        batch=200,
        rng=np.random.default_rng(seed),
    )
    return Estimate(value, float(res.confidence_interval.low), float(res.confidence_interval.high))


def iqm_interval(x, seed: int = 0) -> Estimate:
    """The IQM of x and its 95 % percentile-bootstrap interval over the runs."""
    return _interval((np.asarray(x, dtype=float),), iqm, seed)


def improvement_interval(a, b, seed: int = 0) -> Estimate:
    """P(A > B) and its 95 % interval: a's runs and b's runs resampled independently."""
    return _interval(
        (np.asarray(a, dtype=float), np.asarray(b, dtype=float)), probability_of_improvement, seed
    )
