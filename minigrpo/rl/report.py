"""What an RL run shows the person watching it: the progress line and the figures of a step it
shows, the last rollout's samples, its metrics.png, and a Ctrl-C that stops cleanly at the end of
the step in flight."""

from __future__ import annotations

import json
import multiprocessing
import signal
import threading
from pathlib import Path

import torch

from minigrpo.rl.stopping import BARS
from minigrpo.util.jsonl import read_jsonl
from minigrpo.util.plotting import plot_panels

# Panels of metrics.png that every algorithm shares: what the run achieved (first) and what it cost
# (last). A third element names the quality bars (rl/stopping.py) the panel draws as dashed lines: a
# run within them at a glance.
OUTCOME_PANELS = [
    ("reward (higher is better)", ["reward_mean", "reward_rolling", "exact_reward"]),
    ("exact target rate (higher is better)", ["target_rate", "heldout_rate"], ["final"]),
    (
        "worst other-person drift, TV (lower is better)",
        ["worst_drift", "peak_worst_drift"],
        ["peak_worst_drift", "worst_drift"],
    ),
    (
        "malformed mass (lower is better)",
        ["malformed", "peak_malformed"],
        ["peak_malformed", "malformed"],
    ),
    ("policy loss", ["policy_loss"]),
]
COST_PANELS = [
    ("step time, s (lower is better)", ["step_time"]),
    ("preservation loss", ["preserve_loss"]),
    ("trust region: share of the step kept", ["tr_scale"]),
]
BAR_LABELS = {
    "final": "bar: final >= {:g}",
    "peak_malformed": "bar: every step <= {:g}",
    "malformed": "bar: end <= {:g}",
    "peak_worst_drift": "bar: every step <= {:g}",
    "worst_drift": "bar: end <= {:g}",
}
# the run's own stop rule
GOAL_FLAGS = {"final": "goal", "malformed": "goal_malformed", "worst_drift": "goal_drift"}


def batch_figures(rewards: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """A step's reward mean and std, mean completion length and token count over its rows (the last
    dim) -> (..., 4): rewards and lengths (..., N), float."""
    return torch.stack([rewards.mean(-1), rewards.std(-1), lengths.mean(-1), lengths.sum(-1)], -1)


def bar_lines(names: list[str], config: dict) -> list[tuple[float, str]]:
    """A panel's dashed lines [(y, label)]: each named bar, and the run's own goal flag (its
    config.json) where it is set and differs from the bar (--goal 0.9; --goal 0, compare's runs,
    draws none)."""
    lines = []
    for name in names:
        lines.append((BARS[name], BAR_LABELS[name].format(BARS[name])))
        flag = GOAL_FLAGS.get(name)
        own = config.get(flag) if flag else None
        if own and own != BARS[name]:
            lines.append((own, f"--{flag.replace('_', '-')} {own:g}"))
    return lines


class StopOnCtrlC:
    """Turn the first Ctrl-C into a request to stop at the end of the current step (a second one
    stops at once), so the checkpoint written on the way out never holds a half-applied update."""

    def __enter__(self):
        self.requested, self.previous = False, None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        # in a pool's worker the parent says it once for every run
        if multiprocessing.parent_process() is None:
            print(
                "\nCtrl-C: stopping at the end of this step (Ctrl-C again to stop at once)",
                flush=True,
            )

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


# how the line of a run that Ctrl-C ended starts (compare looks for it)
INTERRUPTED = "interrupted"


def stopped_line(error, step: int) -> str:
    """What a run stopped at `step` by an error of its reward or sampling says."""
    return f"{error} (stopped at step {step}; checkpoints already written are intact)"


def interrupted_line(step: int, out: Path) -> str:
    """What a run that Ctrl-C ended says: where its checkpoint is."""
    return f"{INTERRUPTED}: checkpoint at step {step} written to {out / 'model.pt'}"


def combine_stats(per_update: list[dict]) -> dict:
    """One step's statistics from its inner updates': the mean of each key, except maxima (`*_max`),
    which stay maxima."""
    keys = dict.fromkeys(k for d in per_update for k in d)
    values = {k: [d[k] for d in per_update if k in d] for k in keys}
    return {k: max(v) if k.endswith("_max") else sum(v) / len(v) for k, v in values.items()}


def packed(per_update: list[dict], tag: str = "update") -> dict:
    """Inner updates' figures as one flat dict, update i's `name` under (tag, i, name) (P stacked
    runs' figures are read back in one go); `unpacked` gives the list back."""
    return {(tag, i, k): v for i, d in enumerate(per_update) for k, v in d.items()}


def unpacked(figures: dict, n: int, tag: str = "update") -> list[dict]:
    """The first n inner updates' figures tagged `tag` in figures (see `packed`), as the list of
    dicts."""
    return [
        {k[2]: v for k, v in figures.items() if isinstance(k, tuple) and k[:2] == (tag, i)}
        for i in range(n)
    ]


def flat(ev: dict) -> dict:
    """The numeric entries of an evaluation (what goes to metrics.jsonl)."""
    return {k: v for k, v in ev.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def against(value: float, bar: float, digits: int, higher: bool = False) -> str:
    """A figure beside the bar it is held to: '0.027≤0.03' within it, '0.033>0.03' beyond it (a
    bar to reach, `higher`: '0.986≥0.95', '0.505<0.95'); NaN is never within."""
    within = value >= bar if higher else value <= bar
    sign = ("≥" if within else "<") if higher else ("≤" if within else ">")
    return f"{value:.{digits}f}{sign}{bar:g}"


# the default progress line's legend (bookkeeping prints it under the opening lines)
PROGRESS_LEGEND = (
    "bars: a figure now against its end bar, max (the worst so far) against the every-step bar; "
    "x0.5: the trust region halved the step"
)


def watched_bars(ev: dict):
    """-> (name, the figure against its end bar, its running maximum against its every-step bar) of
    each watched figure of an evaluation (rl/stopping.BARS): the drift where the task has it, the
    malformed mass."""
    for name, key, digits in (("drift", "worst_drift", 3), ("malformed", "malformed", 4)):
        peak = f"peak_{key}"
        if key in ev and peak in ev:
            yield name, against(ev[key], BARS[key], digits), against(ev[peak], BARS[peak], digits)


def bars_line(ev: dict) -> str:
    """A run's closing verdict: each figure of its last evaluation beside the bar it is held to
    (BARS: final target, end and every-step drift where the task has it, end and every-step
    malformed mass), e.g. 'bars: final target 0.933<0.95 | drift end 0.015≤0.03, every step
    0.030≤0.05 | ...'."""
    parts = [f"final target {against(ev['target_rate'], BARS['final'], 3, higher=True)}"]
    parts += [f"{name} end {now}, every step {peak}" for name, now, peak in watched_bars(ev)]
    return "bars: " + " | ".join(parts)


def progress_line(step: int, steps: int, row: dict, evaluated: bool, verbose: bool = False) -> str:
    """One line per step, the exact figures only on the steps that evaluated them. By default what a
    person watches, in at most 140 characters: the step (`skipped` where every group had equal
    rewards, `x0.5` where the trust region halved it); the reward; the exact target rate; the drift
    and malformed mass now beside their end bars and their running maxima beside their every-step
    bars (rl/stopping.BARS: `drift 0.033>0.03 max 0.033≤0.05` is beyond the end bar and within the
    every-step bar); the time. `verbose` adds everything else (metrics.jsonl holds it all)."""
    if verbose:
        return full_progress_line(step, steps, row, evaluated)
    head = f"step {step:{len(str(steps))}d}/{steps}"
    if row.get("skipped"):  # every group had equal rewards: no policy update
        head += " skipped"
    if row.get("tr_scale", 1.0) < 1.0:  # the trust region shrank (or, at 0, rejected) this step
        head += f" x{row['tr_scale']:.3g}"
    parts = [head, f"reward {row['reward_mean']:.3f}"]
    if evaluated:
        parts.append(f"target {row['target_rate']:.3f}")
        parts += [f"{name} {now} max {peak}" for name, now, peak in watched_bars(row)]
        if "heldout_rate" in row:
            parts.append(f"held-out {row['heldout_rate']:.3f}")
    return " | ".join(parts + [f"{1000 * row['step_time']:.0f} ms"])


def full_progress_line(step: int, steps: int, row: dict, evaluated: bool) -> str:
    """--verbose's progress line: every figure a step reports."""
    line = (
        f"step {step:4d}/{steps} | reward {row['reward_mean']:.3f} (avg10 "
        f"{row['reward_rolling']:.3f})"
    )
    if evaluated:
        line += f" | exact target {row['target_rate']:.3f} E[r] {row['exact_reward']:.3f}"
        if "worst_drift" in row:  # tasks with off-target prompts (food: the other people)
            line += f" | drift {row['worst_drift']:.3f} (peak {row['peak_worst_drift']:.3f})"
        line += f" | malformed {row['malformed']:.4f} (peak {row['peak_malformed']:.4f})"
        if "heldout_rate" in row:  # tasks with held-out prompts (arithmetic)
            line += f" | held-out {row['heldout_rate']:.3f}"
        if "regret" in row:  # tasks scored against the exact optimum (food: frontier.py)
            line += f" | regret {row['regret']:.4f}"
    if row.get("skipped"):
        line += " | update skipped (every group had equal rewards)"
    else:
        line += f" | loss {row.get('policy_loss', float('nan')):+.4f}"
    if "kl_exact" in row:
        line += f" | KL {row['kl_exact']:.4f}"
    if row.get("tr_scale", 1.0) < 1.0:  # the trust region shrank (or, at 0, rejected) this step
        line += f" | step x{row['tr_scale']:.3g}"
    return line + f" | {1000 * row['step_time']:.0f} ms"


def write_samples(path: Path, batch) -> None:
    lines = [
        f"{r:+.3f}\t{p!r} -> {c!r}{'' if f else ' (unfinished)'}"
        for p, c, r, f in zip(
            batch.prompts, batch.completions, batch.rewards.tolist(), batch.gen.finished.tolist()
        )
    ]
    path.write_text(
        "reward\tprompt -> completion (last step's rollout)\n" + "\n".join(lines) + "\n"
    )


def run_title(config: dict) -> str:
    """metrics.png's title from a run's config.json: the preset or algorithm, the task, the reward,
    ..."""
    food = config["task"] == "food"
    return (
        f"{config.get('preset') or config['algo']}: {config['task']}, reward {config['reward']}"
        + ("" if config["preserve"] else ", --no-preserve")
        + (f", {config['person']}" if food else "")
    )


def draw_figure(folder: Path, panels: list) -> Path:
    """Draw the RL run in `folder` (its metrics.jsonl and config.json) as folder/metrics.png with
    `panels` ([(title, [metric keys][, [bar names]])], the algorithm's PANELS); -> the figure's
    path."""
    config = json.loads((folder / "config.json").read_text())
    panels = [(p[0], p[1], bar_lines(p[2], config)) if len(p) > 2 else p for p in panels]
    plot_panels(
        read_jsonl(folder / "metrics.jsonl"),
        panels,
        folder / "metrics.png",
        title=run_title(config),
    )
    return folder / "metrics.png"


def closing_hint(out: Path, prompt: str, others: list[str], plot: bool, preserve: bool) -> str:
    """The run's last lines: what it wrote and the command that looks at it: sampling its prompt, or
    after --no-preserve another person's (`others`: the task's off-target prompts), where the
    spill-over shows."""
    files = (
        f"wrote {out}/ (metrics.jsonl, {'metrics.png, ' * plot}summary.json, samples.txt, model.pt)"
    )
    look = lambda p: (
        f"  python -m minigrpo.sample --checkpoint {out / 'model.pt'} --prompt {p!r} --num 1000"
    )
    if preserve or not others:
        return f"{files}; look at it with:\n{look(prompt)}"
    return (
        f"{files}\nwithout preservation the other people drift too; see one of them "
        f"with:\n{look(others[0])}"
    )
