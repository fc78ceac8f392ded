"""compare's interval estimates (minigrpo/tools/intervals.py) on hand-made runs whose figures are
known."""

import numpy as np
import pytest

from minigrpo.tools.intervals import (
    Bootstraps,
    ask_early,
    draw_intervals,
    improvement_table,
    interval_table,
    never,
    scores,
)


def run(targets, regret=0.001):
    """A run's curves as sweep_report.curves reads them: the exact target rate at steps 0, 1, 2,
    ..."""
    return {
        "steps": list(range(len(targets))),
        "target": list(targets),
        "final": {"target_rate": targets[-1], "steps": len(targets) - 1, "regret": regret},
    }


FAST = [run([0.1, 0.96, 0.99]), run([0.1, 0.97, 0.98]), run([0.1, 0.5, 0.97])]
SLOW = [run([0.1, 0.2, 0.9]), run([0.1, 0.3, 0.985]), run([0.1, 0.2, 0.3])]


def test_scores_take_each_runs_final_rate_steps_to_the_goal_and_regret():
    s = scores(SLOW)
    assert s["final target"] == [0.9, 0.985, 0.3]
    assert s["steps to 0.95"] == [3, 2, 3], "never reaching 0.95: the last step + 1, a lower bound"
    assert never(SLOW) == 2 and never(FAST) == 0
    assert "regret" not in scores([run([0.1, 0.9], regret=None)]), (
        "no frontier (not food): no regret column"
    )


def test_the_tables_give_each_algorithm_its_iqm_interval_and_each_pair_its_probability():
    rows = interval_table({"fast": FAST, "slow": SLOW})
    assert rows[0].startswith("| algorithm | runs | final target: IQM [95 % CI] | steps to 0.95")
    assert rows[2].startswith("| fast | 3 | 0.98 [") and ", 2 never" in rows[3]
    matrix = improvement_table({"fast": FAST, "slow": SLOW})
    assert matrix[2].startswith("| fast | - | 0.78 [") and matrix[3].startswith(
        "| slow | 0.22 ["
    ), matrix


def test_intervals_png_is_drawn(tmp_path):
    draw_intervals({"fast": FAST, "slow": SLOW}, tmp_path / "intervals.png", "two algorithms")
    assert (tmp_path / "intervals.png").stat().st_size > 10_000


def test_the_bootstraps_in_threads_give_the_same_tables_and_figure(tmp_path):
    """compare runs them in --jobs threads: each bootstrap seeded as one after another, so nothing
    moves."""
    third = [
        run([0.1, 0.4, 0.99]),
        run([0.1, 0.9, 0.96]),
        run([0.2, 0.6, 0.95]),
        run([0.1, 0.8, 1.0]),
    ]
    results = {"fast": FAST, "slow": SLOW, "third": third, "none": []}
    assert interval_table(results, 3) == interval_table(results)
    assert improvement_table(results, 3) == improvement_table(results)
    for jobs in (1, 3):
        draw_intervals(results, tmp_path / f"intervals{jobs}.png", "three algorithms", jobs)
    assert (tmp_path / "intervals1.png").read_bytes() == (tmp_path / "intervals3.png").read_bytes()


def test_bootstraps_asked_early_are_the_reports_own_and_not_made_again(tmp_path):
    """compare asks for an algorithm's bootstraps as its last run ends (ask_early): the report then
    finds every one of them made (only the third algorithm's, and its pairs, are new) and is the
    same, table and figure."""
    third = [
        run([0.1, 0.4, 0.99]),
        run([0.1, 0.9, 0.96]),
        run([0.2, 0.6, 0.95]),
        run([0.1, 0.8, 1.0]),
    ]
    results = {"fast": FAST, "slow": SLOW, "third": third}
    boot, every = Bootstraps(2), Bootstraps(1)
    ask_early(boot, list(results), {"slow": SLOW, "fast": FAST})  # in the order they ended
    early = set(boot.asked)
    # each: 3 scores, a band over 3 steps; the pair once (its mirror is the same bootstrap); their
    # step 0 is one call: the same values, the same seed
    assert len(early) == 2 * 3 + 2 * 3 + 1 - 1
    assert interval_table(results, boot) == interval_table(results)
    assert improvement_table(results, boot) == improvement_table(results)
    draw_intervals(results, tmp_path / "early.png", "t", boot)
    draw_intervals(results, tmp_path / "late.png", "t")
    assert (tmp_path / "early.png").read_bytes() == (tmp_path / "late.png").read_bytes()
    ask_early(every, list(results), results)
    # what the report asks is what ask_early asks, no more
    assert early < set(boot.asked) == set(every.asked)


def test_a_cell_and_its_mirror_are_one_bootstrap_and_agree_exactly():
    """P(B > A) = 1 − P(A > B), ties counted half, from the same resamples: a cell's interval is its
    mirror's reflected, so one cannot exclude 0.5 while the other includes it (they were seeded
    apart: 0.16 [0.00, 0.48] against 0.84 [0.40, 1.00] in a 5-seed table)."""
    rng = np.random.default_rng(3)
    results = {
        name: [run([0.1, 0.5, x]) for x in rng.uniform(0.8, 1.0, 5)] for name in ("a", "b", "c")
    }
    matrix = improvement_table(results)
    cells = [[c.strip() for c in line.split("|")[2:-1]] for line in matrix[2:]]
    parse = lambda text: [float(x) for x in text.translate(str.maketrans("[],", "   ")).split()]
    for i in range(3):
        for j in range(3):
            if i != j:
                v, lo, hi = parse(cells[i][j])
                w, lo2, hi2 = parse(cells[j][i])
                assert (v + w, lo + hi2, hi + lo2) == pytest.approx((1, 1, 1), abs=0.011), (i, j)
