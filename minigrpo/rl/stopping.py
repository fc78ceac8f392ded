"""When an RL run stops, and what it watched on the way: a pure rule, no model.

`--steps` is a cap. After every exact evaluation the rule sees the exact target rate (the
probability of a best completion, toy_tasks/support.py) and says whether to stop:

  goal      at --goal-patience consecutive evaluations the target rate is >= --goal AND the model is
            whole: malformed mass <= --goal-malformed and every other person's drift <= --goal-drift
            (steered, not broken: right after the target is reached the malformed mass is often
            still up, and a few more steps of the KL terms bring it back down)
  plateau   the best target rate seen has not risen by --plateau-delta in the last --plateau steps
  cap       --steps were taken (the loop's own condition)

So one default command serves pizza (p = 0.15, goal after ~15 steps) and apple pie (p = 0.02, ~90
steps) without a per-target step count. `--goal 0` and `--plateau 0` turn the rules off (compare
does so by default: algorithms are compared on equal work).

`Peaks` keeps the running maximum of what must never break during a run (malformed mass, the worst
other person's drift): a run is judged on its worst step, not only its last.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# The quality bars a run is judged by (tools/bars.py judges compare's and bench's runs; metrics.png
# draws them): final exact target >= 0.95; at EVERY step malformed mass <= 0.02 and every other
# person's drift <= 0.05; at the end malformed <= 0.01 and drift <= 0.03 (--goal, --goal-malformed
# and --goal-drift default to the final and end bars); bench's whole process <= 30 s.
BARS = {
    "final": 0.95,
    "peak_malformed": 0.02,
    "peak_worst_drift": 0.05,
    "malformed": 0.01,
    "worst_drift": 0.03,
    "wall": 30.0,
}


@dataclass
class StopRule:
    goal: float  # target rate to reach (0 = no goal)
    patience: int  # consecutive evaluations at or above the goal
    plateau: int  # steps without improvement that end a run (0 = never)
    max_malformed: float = 1.0  # the goal also needs malformed mass at or below this
    # ... and the worst other-person drift at or below this (where the task has one)
    max_drift: float = 1.0
    delta: float = 0.01  # what counts as an improvement of the best target rate
    streak: int = 0
    best: float = float("-inf")
    best_step: int = 0

    def update(self, step: int, ev: dict) -> str | None:
        """Feed one evaluation (target_rate, malformed, worst_drift if any); the reason to stop now,
        or None."""
        target_rate = ev["target_rate"]
        whole = (
            ev.get("malformed", 0.0) <= self.max_malformed
            and ev.get("worst_drift", 0.0) <= self.max_drift
        )
        self.streak = self.streak + 1 if self.goal > 0 and target_rate >= self.goal and whole else 0
        if target_rate > self.best + self.delta or self.best == float("-inf"):
            self.best, self.best_step = target_rate, step
        return self.reason(step)

    def reason(self, step: int) -> str | None:
        """The reason to stop at `step` by the evaluations fed so far (`update`), or None."""
        if self.goal > 0 and self.streak >= self.patience:
            return (
                f"goal reached at step {step - self.patience + 1}: exact target rate >= "
                f"{self.goal:g}, malformed <= {self.max_malformed:g}, drift <= {self.max_drift:g} "
                f"at {self.patience} consecutive evaluations"
            )
        if self.plateau and step - self.best_step >= self.plateau:
            return (
                f"plateau: the exact target rate has not risen by {self.delta:g} since step "
                f"{self.best_step} ({self.best:.3f})"
            )
        return None

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)


class Peaks:
    """Running maxima of the watched quality metrics, e.g. {'malformed': 0.012, 'worst_drift':
    0.03}."""

    KEYS = ("malformed", "worst_drift")

    def __init__(self, state: dict | None = None):
        self.values: dict[str, float] = dict(state or {})

    def update(self, ev: dict) -> dict:
        """Fold one evaluation in; -> {'peak_malformed': ..., 'peak_worst_drift': ...} so far."""
        for k in self.KEYS:
            if k in ev:
                self.values[k] = max(self.values.get(k, ev[k]), ev[k])
        return {f"peak_{k}": v for k, v in self.values.items()}
