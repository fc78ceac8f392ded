from minigrpo.rl.stopping import Peaks, StopRule


def test_goal_must_hold_for_patience_consecutive_evaluations():
    rule = StopRule(goal=0.95, patience=3, plateau=0)
    seq = [0.5, 0.96, 0.97, 0.94, 0.96, 0.97]
    assert [rule.update(i + 1, {"target_rate": t}) for i, t in enumerate(seq)] == [None] * 6
    reason = rule.update(7, {"target_rate": 0.99})
    assert reason is not None and reason.startswith("goal reached at step 5")


def test_the_goal_needs_a_whole_model():
    rule = StopRule(goal=0.9, patience=2, plateau=0, max_malformed=0.01, max_drift=0.03)
    assert rule.update(1, {"target_rate": 0.99, "malformed": 0.02, "worst_drift": 0.0}) is None
    assert rule.update(2, {"target_rate": 0.99, "malformed": 0.005, "worst_drift": 0.0}) is None
    assert rule.update(3, {"target_rate": 0.99, "malformed": 0.005, "worst_drift": 0.04}) is None
    assert rule.update(4, {"target_rate": 0.99, "malformed": 0.005, "worst_drift": 0.02}) is None
    assert rule.update(5, {"target_rate": 0.99, "malformed": 0.005}).startswith(
        "goal reached at step 4"
    )


def test_plateau_stops_a_run_that_no_longer_improves_and_goal_zero_never_stops():
    rule = StopRule(goal=0.95, patience=3, plateau=10)
    reasons = [
        rule.update(s, {"target_rate": 0.3 + (0.05 if s < 5 else 0.055)}) for s in range(1, 30)
    ]
    first = next(i for i, r in enumerate(reasons) if r)
    # best set at step 1, +0.005 is no rise
    assert first + 1 == 11 and reasons[first].startswith("plateau")
    off = StopRule(goal=0.0, patience=1, plateau=0)
    assert all(off.update(s, {"target_rate": 1.0}) is None for s in range(1, 100))


def test_stop_rule_state_round_trips_and_peaks_are_running_maxima():
    rule = StopRule(goal=0.9, patience=2, plateau=5)
    rule.update(1, {"target_rate": 0.95})
    again = StopRule(goal=0.9, patience=2, plateau=5)
    again.load_state_dict(rule.state_dict())
    assert again.update(2, {"target_rate": 0.95}) is not None
    peaks = Peaks()
    assert peaks.update({"malformed": 0.02, "worst_drift": 0.01}) == {
        "peak_malformed": 0.02,
        "peak_worst_drift": 0.01,
    }
    assert peaks.update({"malformed": 0.01, "worst_drift": 0.03}) == {
        "peak_malformed": 0.02,
        "peak_worst_drift": 0.03,
    }
    # no drift key: no drift peak
    assert Peaks().update({"malformed": 0.5}) == {"peak_malformed": 0.5}
