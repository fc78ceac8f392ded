"""Interval estimates over runs (minigrpo/tools/stats.py): the IQM and P(A > B) pinned by properties
and slow oracles, their bootstrap intervals by what an interval must do."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from minigrpo.tools.stats import improvement_interval, iqm, iqm_interval, probability_of_improvement

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
