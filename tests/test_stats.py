"""Interval estimates over runs (minigrpo/tools/stats.py): the IQM and P(A > B) pinned by properties
and slow oracles, their BCa bootstrap intervals and the permutation test by scipy's own computation
on the same draws and by what an interval and a test must do, at the runs a sweep has (simulated:
slow)."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from minigrpo.tools.stats import (
    LEVEL,
    PERMUTATIONS,
    RESAMPLES,
    SEED,
    difference_interval,
    holm,
    improvement_interval,
    iqm,
    iqm_interval,
    permutation_p,
    probability_of_improvement,
)

scores = st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=24)


def iqm_oracle(x):
    """The definition, written out: sort, drop ⌊n/4⌋ from each end, average the rest."""
    x, k = sorted(x), len(x) // 4
    kept = x[k : len(x) - k]
    return sum(kept) / len(kept)


def improvement_oracle(a, b):
    return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b) / (len(a) * len(b))


def test_the_iqm_of_one_to_eight_is_the_mean_of_three_to_six():
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == 4.5


@given(scores)
def test_iqm_is_the_mean_of_the_middle_half(x):
    assert iqm(x) == pytest.approx(iqm_oracle(x), rel=1e-12, abs=1e-9)
    assert min(x) - 1e-9 <= iqm(x) <= max(x) + 1e-9


@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=4, max_size=24))
def test_the_iqm_ignores_the_best_and_the_worst_run(x):
    """A single run far out (a diverged seed) does not move it: the mean would follow it."""
    spoiled = sorted(x)
    spoiled[-1], spoiled[0] = 1e9, -1e9
    assert iqm(spoiled) == pytest.approx(iqm(x), rel=1e-12, abs=1e-9)


@given(scores, scores)
def test_probability_of_improvement_counts_pairs_ties_half(a, b):
    p = probability_of_improvement(a, b)
    assert p == pytest.approx(improvement_oracle(a, b), abs=1e-12)
    assert p + probability_of_improvement(b, a) == pytest.approx(1.0, abs=1e-12)
    assert probability_of_improvement(a, a) == pytest.approx(0.5, abs=1e-12)


@given(scores, st.integers(1, 5))
def test_iqm_over_a_batch_is_scipys_trim_mean_to_the_bit(x, rows):
    """The bootstrap calls iqm on (resamples, runs) batches: each row's value is scipy's
    trim_mean(row, 0.25)."""
    batch = np.random.default_rng(len(x)).permutation(np.tile(x, (rows, 1)), axis=1)
    assert np.array_equal(iqm(batch), stats.trim_mean(batch, 0.25, axis=-1))
    assert iqm(x) == stats.trim_mean(x, 0.25)


@given(scores, scores, st.integers(1, 4))
def test_probability_of_improvement_over_a_batch_counts_each_rows_pairs(a, b, rows):
    """A batch of a's resamples against b's runs (and against a batch of b's): each row is its
    pairs' count."""
    rng = np.random.default_rng(len(a) + len(b))
    a_rows = rng.choice(a, (rows, len(a)))
    b_rows = rng.choice(b, (rows, len(b)))
    assert list(probability_of_improvement(a_rows, b)) == [improvement_oracle(r, b) for r in a_rows]
    paired = [improvement_oracle(r, s) for r, s in zip(a_rows, b_rows)]
    assert list(probability_of_improvement(a_rows, b_rows)) == paired


@settings(max_examples=25, deadline=None)
@given(scores, st.integers(0, 3))
def test_an_interval_brackets_its_resamples_and_is_reproducible(x, seed):
    e = iqm_interval(x, seed)
    assert min(x) - 1e-9 <= e.low <= e.high <= max(x) + 1e-9
    assert e == iqm_interval(x, seed), "a seeded bootstrap: the same table every time"
    if len(set(x)) == 1:
        assert e.low == e.value == e.high


def test_improvement_intervals_tell_a_real_difference_from_none():
    rng = np.random.default_rng(0)
    worse, better = rng.normal(0.90, 0.02, 20), rng.normal(0.97, 0.02, 20)
    e = improvement_interval(better, worse)
    assert e.value > 0.9 and e.low > 0.5, e
    same = improvement_interval(worse, rng.permutation(worse))
    assert same.value == 0.5 and same.low < 0.5 < same.high, same


def test_one_run_has_an_interval_of_itself():
    assert tuple(iqm_interval([0.97])) == (0.97, 0.97, 0.97)
    assert tuple(improvement_interval([1.0], [0.0])) == (1.0, 1.0, 1.0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's mean of nothing
def test_no_runs_give_no_figure_and_no_error():
    assert all(np.isnan(v) for v in iqm_interval([])) and all(
        np.isnan(v) for v in improvement_interval([], [0.5])
    )


def test_one_run_against_several_resamples_only_the_several():
    """A seed that failed leaves an algorithm with one run: P(A > B) against another's runs still
    has an interval, that of the several runs' resamples (one run resampled is itself), mirrored
    when the two change places."""
    several, one = [0.1, 0.5, 0.9, 0.3, 0.7], [0.4]
    e, mirrored = improvement_interval(several, one), improvement_interval(one, several)
    assert e.value == pytest.approx(0.6) and 0.0 <= e.low < e.value < e.high <= 1.0, e
    assert (mirrored.value, mirrored.low, mirrored.high) == pytest.approx(
        (1 - e.value, 1 - e.high, 1 - e.low)
    )
    assert {round(v * 5, 9) % 1 for v in (e.low, e.high)} <= {0.0}, (
        "a resample's P(A > B) is a fifth, k/5"
    )


def trim_mean_difference(a, b, axis=-1):
    return stats.trim_mean(a, 0.25, axis=axis) - stats.trim_mean(b, 0.25, axis=axis)


def scipy_bca(samples, statistic, key, method="BCa"):
    """The oracle: scipy.stats.bootstrap itself, with scipy's trim_mean, on stats' generator."""
    ci = stats.bootstrap(
        samples,
        statistic,
        n_resamples=RESAMPLES,
        confidence_level=LEVEL,
        method=method,
        vectorized=True,
        batch=500,
        rng=np.random.default_rng((SEED, *np.atleast_1d(key).tolist())),
    ).confidence_interval
    return ci.low, ci.high


@settings(max_examples=6, deadline=None)
@given(
    st.lists(st.floats(0, 1, allow_nan=False), min_size=5, max_size=16, unique=True),
    st.lists(st.floats(0, 1, allow_nan=False), min_size=5, max_size=16, unique=True),
    st.integers(0, 3),
)
def test_the_intervals_are_scipys_bca_on_the_same_draws(x, y, key):
    """The fast path (iqm over a batch of resamples) against scipy's bootstrap of scipy's own
    trim_mean: the same BCa interval, so the method is what the table says it is."""
    e = iqm_interval(x, (1, key))
    trim = lambda v, axis=-1: stats.trim_mean(v, 0.25, axis=axis)
    assert (e.low, e.high) == pytest.approx(scipy_bca((x,), trim, (1, key)), rel=1e-9, abs=1e-12)
    d = difference_interval(x, y, key)
    assert d.value == pytest.approx(iqm(x) - iqm(y), abs=1e-12)
    assert (d.low, d.high) == pytest.approx(
        scipy_bca((x, y), trim_mean_difference, key), rel=1e-9, abs=1e-12
    )


def test_where_bca_is_undefined_the_interval_is_the_percentile_one_of_the_same_draws():
    """Every run's jackknife IQM the same (a lone 5 among 1s is always trimmed), so BCa's
    acceleration divides 0 by 0; the resamples with three 5s or more still move the IQM."""
    x = [1.0] * 7 + [5.0]
    e = iqm_interval(x, 2)
    trim = lambda v, axis=-1: stats.trim_mean(v, 0.25, axis=axis)
    assert (e.low, e.high) == scipy_bca((x,), trim, 2, method="percentile")
    assert e.value == 1.0 < e.high


def test_a_nan_among_the_runs_gives_nan_never_a_finite_figure():
    """A trimmed mean would trim a NaN away (0.9 [0.9, 0.9]); rliable gives NaN, and so does this
    (the report leaves such a run out by name: test_intervals.py)."""
    nan = float("nan")
    assert np.isnan(iqm([0.9, 0.9, 0.9, nan])) and np.isnan(iqm([0.9, 0.8, 0.7, 0.6, nan]))
    for e in (
        iqm_interval([0.9, 0.8, 0.7, nan]),
        improvement_interval([0.9, 0.8, nan], [0.5, 0.6]),
        difference_interval([0.9, 0.8], [0.5, nan, 0.6]),
    ):
        assert all(np.isnan(v) for v in e), e
    assert np.isnan(permutation_p([0.9, 0.8, nan], [0.5, 0.6]))


def exact_permutation_oracle(a, b):
    """Every split of the runs into groups of len(a) and len(b), counted: the two-sided p as scipy
    defines it, twice the smaller share of splits whose IQM difference is at most, or at least, the
    runs' own (a float's last bits forgiven), at most 1."""
    x, m = np.concatenate([a, b]), len(a)
    seen, splits = iqm(a) - iqm(b), []
    for idx in itertools.combinations(range(len(x)), m):
        mask = np.zeros(len(x), bool)
        mask[list(idx)] = True
        splits.append(iqm(x[mask]) - iqm(x[~mask]))
    splits, slack = np.array(splits), 1e-12 * max(1.0, abs(seen))
    return min(1.0, 2 * min(np.mean(splits <= seen + slack), np.mean(splits >= seen - slack)))


# runs' figures on a grid of 0.01 (as rates and step counts are): ties between splits are real and
# counted; scipy forgives ties relative to the runs' own difference, the oracle absolutely, which
# part ways only at differences near 1e-135 that no figure has
GRID = st.integers(-100, 100).map(lambda k: k / 100)


@settings(max_examples=10, deadline=None)
@given(
    st.lists(GRID, min_size=2, max_size=4, unique=True),
    st.lists(GRID, min_size=2, max_size=4, unique=True),
)
def test_the_permutation_test_counts_every_split_of_few_runs(a, b):
    """At most PERMUTATIONS splits: the test is exact, every split counted once."""
    assert math.comb(len(a) + len(b), len(a)) <= PERMUTATIONS
    p = permutation_p(a, b)
    assert p == pytest.approx(exact_permutation_oracle(np.array(a), np.array(b)), abs=1e-9)
    assert 0 < p <= 1.0


def test_one_run_has_no_permutation_test():
    assert np.isnan(permutation_p([0.9], [0.1, 0.2, 0.3]))


def simulate(n: int, trials: int):
    """Over `trials` sweeps of two algorithms with n runs each from one distribution (a normal's
    and a Laplace's, alternately: the IQM's value is known, their centre): how often each 95 %
    interval misses the known value, and how often the permutation test rejects at 0.05."""
    missed = {"IQM": 0, "difference": 0, "P(A > B)": 0, "permutation p < 0.05": 0}
    for k in range(trials):
        rng = np.random.default_rng(10_000 + k)
        draw = rng.normal if k % 2 else rng.laplace
        a, b = draw(0.0, 1.0, n), draw(0.0, 1.0, n) + 0.5
        missed["IQM"] += iqm_interval(a, k).excludes(0.0)
        missed["difference"] += difference_interval(b, a, k).excludes(0.5)
        missed["P(A > B)"] += improvement_interval(a, b - 0.5, k).excludes(0.5)
        missed["permutation p < 0.05"] += permutation_p(a, b - 0.5, k) < 0.05
    return {what: count / trials for what, count in missed.items()}


@pytest.mark.slow
def test_at_ten_runs_the_intervals_and_the_test_hold_their_level_simulated():
    """The method checked where compare calls differences (intervals.MIN_RUNS = 10 runs each):
    each 95 % interval misses its known value about 5 % of the time and the test rejects equal
    algorithms about 5 % of the time (400 sweeps: a binomial's standard error at 5 % is 1.1 %, so
    the bar of 9 % is beyond noise). At 5 runs the IQM's interval is too narrow (it missed about
    11 % when this was written), which is why the tables call nothing below 10."""
    at_ten = simulate(10, 400)
    assert all(rate <= 0.09 for rate in at_ten.values()), at_ten
    assert at_ten["IQM"] >= 0.01, ("an interval that never misses is too wide", at_ten)
    assert simulate(5, 400)["IQM"] > at_ten["IQM"], "fewer runs, worse coverage"


def holm_oracle(ps):
    """Holm's procedure as written (Holm 1979), run at every level α it can turn at: going up the
    sorted p's, reject while the k-th smallest is <= α / (m − k + 1), stop at the first that is
    not. A test's adjusted p is the least such α that rejects it (1 if none <= 1 does)."""
    m, order = len(ps), sorted(range(len(ps)), key=lambda i: ps[i])

    def rejected(alpha):
        out = set()
        for k, i in enumerate(order):
            if ps[i] > alpha / (m - k) * (1 + 1e-12):  # rounding of (m − k)·p / (m − k)
                break
            out.add(i)
        return out

    levels = sorted({min(1.0, (m - k) * ps[i]) for k, i in enumerate(order)} | {1.0})
    return [min((a for a in levels if i in rejected(a)), default=1.0) for i in range(m)]


p_values = st.lists(st.floats(0, 1), min_size=1, max_size=12)


@given(p_values)
def test_holm_is_the_procedure_as_written(ps):
    assert holm(ps) == pytest.approx(holm_oracle(ps), abs=1e-15)


@given(p_values)
def test_holm_never_lowers_a_p_keeps_their_order_and_stays_a_probability(ps):
    adjusted = holm(ps)
    assert all(p <= a <= 1.0 for p, a in zip(ps, adjusted))
    assert all(adjusted[i] <= adjusted[j] for i in range(len(ps)) for j in range(len(ps))
               if ps[i] < ps[j])  # fmt: skip
    assert min(adjusted) == pytest.approx(min(1.0, len(ps) * min(ps)), abs=1e-15), (
        "the smallest is Bonferroni's"
    )


def test_holm_of_one_test_is_its_p_and_nan_counts_in_no_family():
    assert holm([0.03]) == [0.03]
    adjusted = holm([0.01, float("nan"), 0.04])
    assert math.isnan(adjusted[1]) and adjusted[0] == pytest.approx(0.02) and adjusted[2] == 0.04
    assert holm([]) == []


def test_holm_keeps_the_chance_of_any_false_call_at_its_level():
    """Eight true nulls (uniform p's), 4,000 families: a call anywhere in 5 % of them at most, where
    the unadjusted p's call one in 1 − 0.95⁸ = 34 %."""
    ps = np.random.default_rng(0).uniform(size=(4000, 8))
    any_call = np.mean([min(holm(row)) < 0.05 for row in ps])
    assert 0.03 < any_call < 0.06 and np.mean(ps.min(1) < 0.05) > 0.3, any_call
