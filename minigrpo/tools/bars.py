"""The quality bars a finished RL run is held to, and the summaries its figures are read with:
shared by `python -m minigrpo.bench` (its RL sections), `python -m minigrpo.compare` (its table's
"within bars") and `python -m minigrpo.metrics` (its summary of a run).

The bars (issue "any reward, any person"): final exact target >= 0.95; at EVERY step malformed mass
<= 0.02 and every other person's drift <= 0.05; at the end malformed <= 0.01 and drift <= 0.03; the
whole process <= 30 s (bench only: compare's runs share a pool). OPTIMUM_BAR: KL(π_θ‖π*_β) over the
target prompt's outcomes, for --preset j_beta (bench's optimum section).
"""

from __future__ import annotations

import statistics

# defined beside the stop rule, whose goal flags default to them
from minigrpo.rl.stopping import BARS

OPTIMUM_BAR = 0.02


# each quality bar: (what a person reads, the metric it holds)
CHECKS = {
    "final": ("final target", "target_rate"),
    "peak_malformed": ("peak malformed", "peak_malformed"),
    "malformed": ("end malformed", "malformed"),
    "peak_worst_drift": ("peak drift", "peak_worst_drift"),
    "worst_drift": ("end drift", "worst_drift"),
}


def missed_bars(f: dict) -> dict[str, str]:
    """The quality bars above that a run's last evaluation (as its metrics.jsonl names them:
    target_rate, malformed, the peaks) misses: {bar: "what value > bar"} (four decimals: a miss by
    rounding shows, 0.0303 > 0.03); {} within every bar. The drift bars only where the task has
    off-target prompts (worst_drift None, NaN or absent: none)."""
    drift = f.get("worst_drift")
    out = {}
    for bar, (what, key) in CHECKS.items():
        if "drift" in bar and (drift is None or drift != drift):
            continue
        # the target rate must reach its bar, the rest stay under theirs (NaN: a miss)
        higher = bar == "final"
        value = f[key]
        if not ((value >= BARS[bar]) if higher else (value <= BARS[bar])):
            out[bar] = f"{what} {value:.4f} {'<' if higher else '>'} {BARS[bar]:g}"
    return out


def misses(f: dict) -> list[str]:
    """What `missed_bars` says, as a list: [] within every bar."""
    return list(missed_bars(f).values())


def quality_ok(final: float, peak_malformed: float, malformed: float, peak_drift, drift) -> bool:
    """The quality bars above (see `misses`)."""
    return not misses(
        {
            "target_rate": final,
            "peak_malformed": peak_malformed,
            "malformed": malformed,
            "peak_worst_drift": peak_drift,
            "worst_drift": drift,
        }
    )


def within_bars(f: dict) -> bool:
    """The quality bars on a run's last evaluation as its metrics.jsonl names them (target_rate, the
    peaks)."""
    return not misses(f)


def first_reaching(xs: list, targets: list, level: float):
    """The x (step, seconds, tokens) of the first evaluation whose exact target rate is >= level;
    None if never."""
    return next((x for x, t in zip(xs, targets) if t >= level), None)


def med(values: list, fmt: str = "{:.3f}", none: str = "-") -> str:
    """'median (min–max)' of the values that exist (None: missing, e.g. never reached), the missing
    ones counted as 'never'; `none` when no value exists."""
    got = [v for v in values if v is not None]
    if not got:
        return none
    text = fmt.format(statistics.median(got))
    if len(got) > 1:
        text += f" ({fmt.format(min(got))}–{fmt.format(max(got))})"
    return text + (f", {len(values) - len(got)} never" if len(got) < len(values) else "")
