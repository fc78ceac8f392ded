"""compare's interval estimates (minigrpo/tools/: intervals.py, interval_tables.py and
interval_figure.py) on hand-made runs whose figures are known."""

import numpy as np
import pytest

from minigrpo.tools.interval_figure import draw_intervals
from minigrpo.tools.interval_tables import (
    better_matrix,
    figure_table,
    printed_statistics,
    statement,
    statistics_markdown,
)
from minigrpo.tools.intervals import (
    MIN_RUNS,
    Bootstraps,
    ask_early,
    comparison,
    never,
    scores,
    verdict,
)


def run(targets, regret=0.001, name=None):
    """A run's curves as sweep_report.curves reads them: the exact target rate at steps 0, 1, 2,
    ..."""
    out = {
        "steps": list(range(len(targets))),
        "target": list(targets),
        "final": {"target_rate": targets[-1], "steps": len(targets) - 1, "regret": regret},
    }
    return out | ({"run": name} if name else {})


FAST = [run([0.1, 0.96, 0.99]), run([0.1, 0.97, 0.98]), run([0.1, 0.5, 0.97])]
SLOW = [run([0.1, 0.2, 0.9]), run([0.1, 0.3, 0.985]), run([0.1, 0.2, 0.3])]
THIRD = [run([0.1, 0.4, 0.99]), run([0.1, 0.9, 0.96]), run([0.2, 0.6, 0.95]), run([0.1, 0.8, 1.0])]


def many(final, n=MIN_RUNS, seed=0, reach=1):
    """n runs whose final target rates scatter around `final` (the spread of a real sweep's), each
    reaching 0.95 at step `reach` or the next."""
    rng = np.random.default_rng(seed)
    return [
        run([0.1] * (reach + k % 2) + [0.96, float(x)], regret=float(1 - x))
        for k, x in enumerate(rng.normal(final, 0.002, n).clip(0, 1))
    ]


def cells(line):
    return [c.strip() for c in line.split("|")[1:-1]]


def test_scores_take_each_runs_final_rate_steps_to_the_goal_and_regret():
    s = scores(SLOW)
    assert s["final target"] == [0.9, 0.985, 0.3]
    assert s["steps to 0.95"] == [3, 2, 3], "never reaching 0.95: the last step + 1, a lower bound"
    assert never(SLOW) == 2 and never(FAST) == 0
    assert "regret" not in scores([run([0.1, 0.9], regret=None)]), (
        "no frontier (not food): no regret column"
    )


def test_each_figure_has_iqm_difference_from_the_baseline_probability_and_test():
    c = comparison({"fast": FAST, "slow": SLOW})
    assert c.baseline == "fast" and c.figures == ["final target", "steps to 0.95", "regret"]
    rows = figure_table(c, "final target")
    assert cells(rows[0]) == [
        "algorithm",
        "runs",
        "IQM [95 % CI]",
        "IQM − fast [95 % CI]",
        "P(better than fast) [95 % CI]",
        "permutation p",
        "Holm p",
        "against fast",
    ]
    assert cells(rows[2])[:4] == ["fast", "3", "0.98 [0.97, 0.99]", "baseline"]
    slow = cells(rows[3])
    assert slow[:2] == ["slow", "3"] and slow[2].startswith("0.728 [")
    assert slow[3].startswith("-0.252 [") and slow[4].startswith("0.22 [")
    assert slow[5] == slow[6], "one algorithm tested against the baseline: Holm's p is its p"
    assert slow[7] == f"n < {MIN_RUNS}: none called", "3 runs: no difference is called"
    # steps: lower is better, so the slow runs' more steps make P(slow better) small
    steps = cells(figure_table(c, "steps to 0.95")[3])
    assert steps[1] == "3, 2 never" and float(steps[4].split()[0]) < 0.5
    matrix = better_matrix(c, "final target")
    assert cells(matrix[2])[:2] == ["fast", "-"] and cells(matrix[3])[1].startswith("0.22 [")


def test_below_ten_runs_the_tables_say_so_and_call_nothing():
    c = comparison({"a": many(0.99, 5), "b": many(0.95, 5, seed=1)})
    assert c.p["final target"]["b"] < 0.05 and c.difference["final target"]["b"].high < 0, (
        "a clear difference at 5 runs..."
    )
    assert verdict(c, "final target", "b") == f"n < {MIN_RUNS}: none called", "...is not called"
    said = " ".join(statement(c))
    assert "**Fewer than 10 runs** (a 5, b 5): the intervals are unreliable at that n" in said
    assert "worse" not in "\n".join(statistics_markdown(c) + printed_statistics(c))
    assert all(len(line) <= 120 for line in printed_statistics(c)[2:])


def test_at_ten_runs_a_clear_difference_is_called_in_its_direction_and_none_is_not():
    c = comparison(
        {
            "base": many(0.99),
            "worse": many(0.97, seed=1),
            "same": many(0.99, seed=2),
            "sooner": many(0.99, seed=3, reach=0),
        }
    )
    assert verdict(c, "final target", "worse") == "worse"
    assert verdict(c, "regret", "worse") == "worse", "a higher regret is worse"
    assert verdict(c, "final target", "same") == "no difference shown"
    assert verdict(c, "steps to 0.95", "sooner") == "better", "fewer steps are better"
    assert "Fewer than" not in " ".join(statement(c))
    # steps {0, 1} against {1, 2}: of the four pairs only (1, 1) is not better, a tie
    assert c.better["steps to 0.95"]["sooner", "base"].value == 1 - 0.25 / 2


def test_a_nan_or_infinite_figure_leaves_its_run_out_with_a_line_naming_it():
    """rliable gives NaN for a NaN among the runs, and a trimmed mean would trim it away: a finite
    0.9 [0.9, 0.9]. The run is left out of that figure, by name, and n says so."""
    spoiled = many(0.99, 5) + [run([0.1, float("nan")], name="dapo-s5")]
    spoiled += [run([0.1, 0.96, 0.99], regret=float("inf"), name="dapo-s6")]
    c = comparison({"dapo": spoiled, "grpo": many(0.98, 5)})
    assert c.n["dapo"] == {"final target": 6, "steps to 0.95": 7, "regret": 6}
    assert c.left_out == [
        "dapo-s5: final target is nan, left out of its statistics",
        "dapo-s6: regret is inf, left out of its statistics",
    ]
    assert all(np.isfinite(list(e)).all() for e in c.iqm["dapo"].values())
    assert "Left out: dapo-s5: final target is nan" in "\n".join(statement(c))
    assert "Runs counted per algorithm: dapo 6/7, grpo 5." in statement(c)[0]


def test_a_figure_a_run_logged_non_finite_is_left_out_not_read_from_an_earlier_step(tmp_path):
    """A run writes NaN and inf as null (strict JSON, util/jsonl.py). Read back (sweep_report's
    curves) an evaluation's null is NaN, its run left out by name: not the evaluation before it
    (stale), and no TypeError in the steps to 0.95. A step's figure missing from the last row
    (DAPO's skipped step logs no KL) is still its last logged value; implied_beta's null is inf."""
    from minigrpo.tools.sweep_report import curves
    from minigrpo.util.jsonl import JsonlLogger

    def logged(name, last):
        (tmp_path / name).mkdir()
        log = JsonlLogger(tmp_path / name / "metrics.jsonl")
        log.log({"step": 0, "target_rate": 0.2, "regret": 0.05, "implied_beta": 2.0})
        log.log(
            {"step": 1, "target_rate": 0.9, "regret": 0.01, "implied_beta": 1.0, "kl_exact": 0.1}
        )
        log.log({"step": 2, **last})
        log.close()
        return curves(tmp_path / name)

    nan = float("nan")
    spoiled = logged("dapo-s1", {"target_rate": nan, "regret": float("inf"), "implied_beta": nan})
    assert spoiled["final"]["kl_exact"] == 0.1 and spoiled["final"]["implied_beta"] == float("inf")
    assert np.isnan(spoiled["target"][-1]) and np.isnan(spoiled["final"]["target_rate"])
    assert np.isnan(spoiled["final"]["regret"]), "null is no number: not the 0.01 of step 1"
    sound = logged("dapo-s0", {"target_rate": 0.96, "regret": 0.001, "implied_beta": 0.5})
    assert sound["final"]["target_rate"] == 0.96 and sound["final"]["regret"] == 0.001
    c = comparison({"dapo": [sound, spoiled]})
    assert c.n["dapo"] == {"final target": 1, "steps to 0.95": 2, "regret": 1}
    assert c.left_out == [
        "dapo-s1: final target is nan, left out of its statistics",
        "dapo-s1: regret is nan, left out of its statistics",
    ]


def test_intervals_png_is_drawn(tmp_path):
    results = {"fast": FAST, "slow": SLOW}
    draw_intervals(comparison(results), results, tmp_path / "intervals.png", "two algorithms")
    assert (tmp_path / "intervals.png").stat().st_size > 10_000


@pytest.mark.slow  # a second whole report: about a second
def test_the_bootstraps_in_threads_give_the_same_tables_and_figure(tmp_path):
    """compare runs them in --jobs threads: each bootstrap keyed by what it estimates, so nothing
    moves."""
    results = {"fast": FAST, "slow": SLOW, "third": THIRD, "none": []}
    one, three = comparison(results), comparison(results, 3)
    assert statistics_markdown(one) == statistics_markdown(three)
    for jobs, c in ((1, one), (3, three)):
        draw_intervals(c, results, tmp_path / f"intervals{jobs}.png", "three algorithms", jobs)
    assert (tmp_path / "intervals1.png").read_bytes() == (tmp_path / "intervals3.png").read_bytes()


@pytest.mark.slow  # a second whole report: about a second
def test_bootstraps_asked_early_are_the_reports_own_and_not_made_again(tmp_path):
    """compare asks for an algorithm's bootstraps as its last run ends (ask_early): the report then
    finds every one of them made (only the third algorithm's, and its pairs, are new) and is the
    same, table and figure."""
    results = {"fast": FAST, "slow": SLOW, "third": THIRD}
    boot, every = Bootstraps(2), Bootstraps(1)
    ask_early(boot, list(results), {"slow": SLOW, "fast": FAST})  # in the order they ended
    early = set(boot.asked)
    # each of 3 figures: 2 IQMs, the pair once (its mirror is the same bootstrap), the slow's
    # difference from the baseline and its test; a band over 3 steps each, their step 0 one call
    # (the same values, the same key)
    assert len(early) == 3 * (2 + 1 + 2) + 2 * 3 - 1
    c = comparison(results, boot)
    assert statistics_markdown(c) == statistics_markdown(comparison(results))
    draw_intervals(c, results, tmp_path / "early.png", "t", boot)
    draw_intervals(comparison(results), results, tmp_path / "late.png", "t")
    assert (tmp_path / "early.png").read_bytes() == (tmp_path / "late.png").read_bytes()
    ask_early(every, list(results), results)
    # what the report asks is what ask_early asks, no more
    assert early < set(boot.asked) == set(every.asked)


def test_a_cell_and_its_mirror_are_one_bootstrap_and_agree_exactly():
    """P(B better) = 1 − P(A better), ties counted half, from the same resamples: a cell's interval
    is its mirror's reflected, so one cannot exclude 0.5 while the other includes it (they were
    seeded apart: 0.16 [0.00, 0.48] against 0.84 [0.40, 1.00] in a 5-seed table)."""
    rng = np.random.default_rng(3)
    results = {
        name: [run([0.1, 0.5, x]) for x in rng.uniform(0.8, 1.0, 5)] for name in ("a", "b", "c")
    }
    c = comparison(results)
    for figure in c.figures:
        for (a, b), e in c.better[figure].items():
            m = c.better[figure][b, a]
            assert (e.value + m.value, e.low + m.high, e.high + m.low) == pytest.approx((1, 1, 1))
    parse = lambda text: [float(x) for x in text.translate(str.maketrans("[],", "   ")).split()]
    matrix = [cells(line)[1:] for line in better_matrix(c, "final target")[2:]]
    for i in range(3):
        for j in range(3):
            if i != j:
                v, lo, hi = parse(matrix[i][j])
                w, lo2, hi2 = parse(matrix[j][i])
                assert (v + w, lo + hi2, hi + lo2) == pytest.approx((1, 1, 1), abs=0.011), (i, j)
