"""The quality bars a finished RL run is held to, and the summaries its figures are read with: shared by
`python -m minigrpo.bench` (its RL sections) and `python -m minigrpo.compare` (its table's "within bars").

The bars (issue "any reward, any person"): final exact target >= 0.95; at EVERY step malformed mass
<= 0.02 and every other person's drift <= 0.05; at the end malformed <= 0.01 and drift <= 0.03; the
whole process <= 30 s (bench only: compare's runs share a pool). OPTIMUM_BAR: KL(π_θ‖π*_β) over the target
prompt's outcomes, for --preset j_beta (bench's optimum section).
"""

from __future__ import annotations

import statistics

OPTIMUM_BAR = 0.02
BARS = {"final": 0.95, "peak_malformed": 0.02, "peak_worst_drift": 0.05, "malformed": 0.01, "worst_drift": 0.03,
        "wall": 30.0}


def quality_ok(final: float, peak_malformed: float, malformed: float, peak_drift, drift) -> bool:
    """The quality bars above; the drift bars only where the task has off-target prompts (drift None or NaN:
    it has none)."""
    ok = final >= BARS["final"] and peak_malformed <= BARS["peak_malformed"] and malformed <= BARS["malformed"]
    if drift is not None and drift == drift:
        ok = ok and peak_drift <= BARS["peak_worst_drift"] and drift <= BARS["worst_drift"]
    return ok


def within_bars(f: dict) -> bool:
    """The quality bars on a run's last evaluation as its metrics.jsonl names them (target_rate, the peaks)."""
    return quality_ok(f["target_rate"], f["peak_malformed"], f["malformed"], f["peak_worst_drift"], f["worst_drift"])


def first_reaching(xs: list, targets: list, level: float):
    """The x (step, seconds, tokens) of the first evaluation whose exact target rate is >= level; None if never."""
    return next((x for x, t in zip(xs, targets) if t >= level), None)


def med(values: list, fmt: str = "{:.3f}", none: str = "-") -> str:
    """'median (min–max)' of the values that exist (None: missing, e.g. never reached), the missing ones
    counted as 'never'; `none` when no value exists."""
    got = [v for v in values if v is not None]
    if not got:
        return none
    text = fmt.format(statistics.median(got))
    if len(got) > 1:
        text += f" ({fmt.format(min(got))}–{fmt.format(max(got))})"
    return text + (f", {len(values) - len(got)} never" if len(got) < len(values) else "")
