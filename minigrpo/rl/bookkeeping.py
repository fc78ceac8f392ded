"""The parts of an RL step that are not the algorithm's: Run's bookkeeping (rl/run_state.py) before
the first step (config.json, the opening lines, the first evaluation), at each step (the learning
rate, the step's prompts, whether π_ref is renewed, the losses' check, the exact evaluation, the
stop rule, the metrics row and the progress line, the checkpoint when due) and after the last
(metrics.png, samples.txt, summary.json, the closing lines), and on Ctrl-C. run() (rl/loop.py) calls
them around the algorithm's update, and so may any caller that steps several runs at once.

Departure from the papers: a 5-step linear learning-rate warm-up (--warmup 0 turns it off). Adam's
first update moves every weight by about lr whatever its gradient, and on the food task that first
step alone moved other people's distributions far beyond the drift bar (docs/experiments.md). Over
the last 20 % of --steps the rate falls linearly to 0 (--lr-warmdown): at a constant rate to the
end, Adam kept the other people's drift swinging by about ±0.01 from step to step long after the
goal; a run that stops at its goal never gets there.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import asdict

import torch

from minigrpo.lm.optim import scheduled_lr
from minigrpo.rl.report import (
    PROGRESS_LEGEND,
    bars_line,
    batch_figures,
    closing_hint,
    draw_figure,
    flat,
    interrupted_line,
    progress_line,
    write_samples,
)
from minigrpo.util.cli import UsageError
from minigrpo.util.jsonl import JsonlLogger
from minigrpo.util.outputs import write_json


def finite_losses(stats: dict) -> bool:
    """Whether every loss of a step's figures is finite (else end_step stops the run)."""
    return all(math.isfinite(v) for k, v in stats.items() if k.endswith("loss"))


class RunBookkeeping:
    """rl/run_state.Run's per-step bookkeeping (a base class: it reads and sets the run's own
    attributes)."""

    def begin(self, evaluation: dict | None = None) -> JsonlLogger:
        """Before step 1 (or the resumed step, once restored: rl/checkpoints.py): write config.json,
        open metrics.jsonl, say what runs, and evaluate (logged as step 0 on a fresh run;
        `evaluation`: already made) -> the metrics logger."""
        cfg = self.cfg
        write_json(self.out / "config.json", {"algo": self.algo_name, **asdict(cfg)})
        logger = JsonlLogger(
            self.out / "metrics.jsonl", truncate_after_step=self.step if self.resume_state else None
        )
        self.log(
            f"{self.algo_name} on {cfg.task} | reward {cfg.reward} | {len(self.prompts)} RL "
            f"prompt(s) | G={cfg.group_size} x {cfg.prompts_per_step} prompts | preservation "
            f"{'on' if self.anchor is not None else 'off'} | "
            + (f"resuming at step {self.step}" if self.resume_state else f"from {cfg.init}")
            + "\nat most "
            f"{cfg.steps} steps"
            + (f", stops at exact target >= {cfg.goal:g}" if cfg.goal else "")
            + ("" if cfg.verbose else f" | --verbose: every figure\n{PROGRESS_LEGEND}")
        )
        self.last_eval = self.evaluate(evaluation)
        if not self.resume_state:
            logger.log({"step": 0, **flat(self.last_eval)})
        return logger

    def lr_now(self) -> float:
        """This step's learning rate: --lr after a linear warm-up over --warmup steps, falling to 0
        over the last --lr-warmdown share of --steps (lm/optim.scheduled_lr)."""
        cfg = self.cfg
        return scheduled_lr(cfg.lr, self.step, cfg.steps, cfg.warmup, cfg.lr_warmdown)

    def step_prompts(self) -> list[str]:
        """The step's --prompts-per-step prompts, drawn with replacement from the run's prompts."""
        idx = torch.randint(
            len(self.prompts), (self.cfg.prompts_per_step,), generator=self.gens["prompts"]
        )
        return [self.prompts[i] for i in idx.tolist()]

    def evaluating(self) -> bool:
        """Whether the step about to end is evaluated: every --eval-every steps, and the last."""
        return (self.step + 1) % self.cfg.eval_every == 0 or self.step + 1 == self.cfg.steps

    def renews_ref(self) -> bool:
        """Whether π_ref ← π_θ after the step about to end (--ref-update-every; iterative GRPO)."""
        return bool(self.cfg.ref_update_every) and (self.step + 1) % self.cfg.ref_update_every == 0

    def end_step(
        self,
        trained,
        batch,
        stats: dict,
        step_time: float,
        logger: JsonlLogger,
        evaluation: dict | None = None,
        figures: list | None = None,
    ) -> None:
        """After the update, the trust region and π_ref's renewal (`renews_ref`): check the losses,
        count the step, evaluate (every --eval-every steps), apply the stop rule, log the row and
        the progress line, checkpoint when due (trained() -> what `save` takes: Run.trained's,
        made only then). `evaluation` and `figures` (batch_figures'): the step's exact evaluation
        and its batch's figures where the caller already made them (several runs' at once)."""
        cfg = self.cfg
        if not finite_losses(stats):
            raise UsageError(
                f"the loss became non-finite at step {self.step + 1} (lr {cfg.lr:g}): "
                f"the run stopped; checkpoints already written are intact"
            )
        evaluated = self.evaluating()
        self.step += 1
        if figures is None:
            # one read, not four
            figures = batch_figures(batch.rewards, batch.mask.sum(1).float()).tolist()
        mean, std, length, tokens = figures
        self.rewards_window = (self.rewards_window + [mean])[-10:]
        row = {
            "step": self.step,
            "reward_mean": mean,
            "reward_std": std,
            "reward_rolling": sum(self.rewards_window) / len(self.rewards_window),
            **stats,
            "completion_len": length,
            "tokens_per_s": tokens / step_time,
            "step_time": step_time,
        }
        if evaluated:
            self.last_eval = self.evaluate(evaluation)
            row.update(flat(self.last_eval))
            self.stop_reason = self.stop_rule.update(self.step, self.last_eval)
        if self.stop_reason is None and self.step == cfg.steps:
            self.stop_reason = f"cap: --steps {cfg.steps} reached"
        logger.log(row)
        self.log(progress_line(self.step, cfg.steps, row, evaluated, cfg.verbose))
        if self.step % cfg.ckpt_every == 0 or self.stop_reason is not None:
            self.save(trained())

    def interrupted(self, trained: dict) -> None:
        """Ctrl-C: the step in flight was finished: a consistent checkpoint, then exit 130."""
        self.save(trained)
        print(
            f"\n{interrupted_line(self.step, self.out)}; continue with --resume {self.out}",
            flush=True,
        )
        raise SystemExit(130)

    def finish(self, last_batch, panels) -> dict:
        """After the last step: metrics.png (not with --no-plot), samples.txt, summary.json, the
        closing lines -> the summary."""
        cfg, last_eval, numbers = self.cfg, self.last_eval, flat(self.last_eval)
        # --no-plot (compare's runs): python -m minigrpo.metrics <out> draws it on request
        if cfg.plot:
            draw_figure(self.out, panels)
        if last_batch is not None:
            write_samples(self.out / "samples.txt", last_batch)
        self.log(
            textwrap.fill(
                f"stopped at step {self.step}: {self.stop_reason}", 120, subsequent_indent="  "
            )
        )
        self.log(self.task.format_rl_eval(last_eval, cfg))
        self.log(bars_line(last_eval))
        # e.g. food: every person's shares
        details = {k: v for k, v in last_eval.items() if k not in numbers}
        summary = {
            "step": self.step,
            "stop_reason": self.stop_reason,
            **numbers,
            **details,
            "baseline": self.baseline,
        }
        write_json(self.out / "summary.json", summary)
        self.log(
            closing_hint(
                self.out, self.prompts[0], self.task.anchor_prompts(cfg), cfg.plot, cfg.preserve
            )
        )
        return summary
