"""The RL run shared by every algorithm (GRPO and its variants, PPO): set-up, the outer loop, exact
evaluation, the stop rule, metrics, checkpoints, resume and Ctrl-C. An algorithm supplies `update`.

Each step:  collect a rollout (rollout.py)  ->  algorithm.update (its inner updates)  ->  exact
evaluation (every --eval-every steps, default every step: one batched forward for all people)  ->
the stop rule (stopping.py: goal reached and stable, plateau, or the --steps cap). Checkpoints
(every --ckpt-every steps, at the end, and on Ctrl-C; rl/checkpoints.py) hold all the run, so
`--resume` gives the same metrics on CPU as an uninterrupted run. At the end: summary.json,
samples.txt and metrics.png (not with --no-plot; `python -m minigrpo.metrics <out>` draws it).

One random generator per purpose (rollout sampling, prompt draws, the anchor's construction, the
anchor's minibatches, PPO's shuffles), each seeded from (seed, purpose): turning preservation off or
changing μ leaves the sampled completions of a step unchanged, so A/B comparisons are paired.

Departure from the papers: a 5-step linear learning-rate warm-up (--warmup 0 turns it off). Adam's
first update moves every weight by about lr whatever its gradient, and on the food task that first
step alone moved other people's distributions far beyond the drift bar (docs/experiments.md). Over
the last 20 % of --steps the rate falls linearly to 0 (--lr-warmdown): at a constant rate to the
end, Adam kept the other people's drift swinging by about ±0.01 from step to step long after the
goal; a run that stops at its goal never gets there.
"""

from __future__ import annotations

import copy
import math
import textwrap
import time
import zlib
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import asdict
from pathlib import Path

import torch

from minigrpo.lm.checkpoint import CheckpointError, load_checkpoint, model_from_state
from minigrpo.lm.optim import AdamW, clip_grad_norm, scheduled_lr
from minigrpo.rl.algorithm import Algorithm, rollout_flags
from minigrpo.rl.checkpoints import RunCheckpoints
from minigrpo.rl.config import RLConfig, check_rl_config
from minigrpo.rl.preserve import anchor_loss, make_anchor
from minigrpo.rl.report import (
    StopOnCtrlC,
    batch_figures,
    closing_hint,
    draw_figure,
    flat,
    interrupted_line,
    progress_line,
    write_samples,
)
from minigrpo.rl.rollout import collect
from minigrpo.rl.stopping import Peaks, StopRule
from minigrpo.rl.trust_region import StepGuard
from minigrpo.util.cli import UsageError
from minigrpo.util.jsonl import JsonlLogger
from minigrpo.util.outputs import prepare_out, write_json
from minigrpo.util.runtime import setup_runtime
from toy_tasks import get_task
from toy_tasks.rewards import RewardError, make_reward
from toy_tasks.support import reward_table

# set in each member's thread by a population (minigrpo/population): the run's model work then joins
# one batch
BATCH: ContextVar = ContextVar("population_batch", default=None)
# where each generator lives: sampling happens on the run's device, index draws on the CPU
GENERATORS = {
    "rollout": "device",
    "prompts": "cpu",
    "anchor": "device",
    "anchor_rows": "cpu",
    "shuffle": "cpu",
}


def purpose_seed(seed: int, purpose: str) -> int:
    """A seed for one purpose's generator: different purposes never share a stream."""
    return (seed * 1_000_003 + zlib.crc32(purpose.encode())) % (2**63)


class Run(RunCheckpoints):
    """Everything a running RL job holds; algorithms read policy, ref, anchor, gens and cfg from
    it."""

    def __init__(self, cfg: RLConfig, algo_name: str, log=print, like: "Run | None" = None):
        """like: a run set up from the same --init and flags (its seed and folder aside) and not yet
        trained (a lockstep population's first member): its model, tokenizer, tree anchor and
        baseline are taken, not built again, and its π_ref shared (read only: a population's π_ref
        is its stack's, lockstep.py)."""
        check_rl_config(cfg)
        self.cfg, self.algo_name, self.log = cfg, algo_name, (lambda *a: None) if cfg.quiet else log
        try:
            self.task = get_task(cfg.task)
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.device = setup_runtime(cfg.threads, cfg.device, cfg.seed)
        self.resume_state = self._read_resume() if cfg.resume else None
        # the run's own checkpoint holds the model, π_ref and the tokenizer
        if self.resume_state is not None:
            self.policy, self.tok = model_from_state(self.resume_state, self.device)
            meta = {"task": self.resume_state["task"]}
        elif like is not None:
            self.policy, self.tok, meta = (
                copy.deepcopy(like.ref).requires_grad_(),
                like.tok,
                {"task": cfg.task},
            )
        else:
            try:
                self.policy, self.tok, meta = load_checkpoint(cfg.init, self.device)
            except CheckpointError as e:
                hint = (
                    " (run `python -m minigrpo.pretrain` first)"
                    if not Path(cfg.init).exists()
                    else ""
                )
                raise UsageError(f"--init: {e}{hint}") from None
        if BATCH.get() is not None:  # π_ref and any critic, deep copies of the policy, join with it
            self.policy = BATCH.get().adopt(self.policy)
        if meta["task"] != cfg.task:
            raise UsageError(
                f"--init {cfg.init!r} was pretrained on task {meta['task']!r}, not {cfg.task!r}"
            )
        try:
            self.reward = make_reward(cfg.reward, self.task.REWARDS, self.task.REWARD_HELP)
            self.prompts = self.task.rl_prompts(cfg)
            for p in self.prompts:
                self.tok.check(p)
            slow = lambda k, n: self.log(
                f"  before step 1: scored the reward on {k}/{n} of the task's completions"
            )
            # exact E[r] needs it
            self.rewards = reward_table(
                self.reward, self.prompts, self.task.support, self.task.OFF_SUPPORT_PROBES, slow
            )
        except (RewardError, ValueError) as e:
            raise UsageError(str(e)) from None
        room = self.policy.cfg.block_size - 1 - max(len(self.tok.encode(p)) for p in self.prompts)
        if cfg.max_new_tokens > room:
            self.log(
                f"note: --max-new-tokens {cfg.max_new_tokens} is cut to {room}: the model's block "
                f"({self.policy.cfg.block_size} tokens) holds BOS, the prompt and the completion"
            )
        self.ref = (
            like.ref
            if like is not None
            else copy.deepcopy(self.policy).eval().requires_grad_(False)
        )
        self.policy.train()
        self.out = prepare_out(cfg.out, overwrite=cfg.overwrite, resume=cfg.resume is not None)
        self.gens = {
            name: torch.Generator(device=self.device if where == "device" else "cpu").manual_seed(
                purpose_seed(cfg.seed, name)
            )
            for name, where in GENERATORS.items()
        }
        self.step, self.anchor, self.baseline, self.anchor_probe = 0, None, None, None
        # the last 10 steps' mean rewards (for reward_rolling)
        self.rewards_window: list[float] = []
        self.stop_rule = StopRule(
            cfg.goal, cfg.goal_patience, cfg.plateau, cfg.goal_malformed, cfg.goal_drift
        )
        self.peaks = Peaks()
        self.stop_reason: str | None = None
        # π_ref's and the flags' alone: any seed's
        if like is not None and cfg.preserve_anchor != "sampled":
            self.anchor, self.baseline = like.anchor, like.baseline
        # on resume, `restore` brings these back from the checkpoint
        elif self.resume_state is None:
            anchor_prompts = self.task.anchor_prompts(cfg) if cfg.preserve else []
            self.anchor = make_anchor(
                self.ref, self.tok, anchor_prompts, self.prompts, cfg, self.gens["anchor"]
            )
            self.baseline = self.task.rl_baseline(self.ref, self.tok, cfg)

    def exact_evaluation(self) -> dict:
        """The task's exact evaluation of the policy now (toy_tasks/contract.py: rl_evaluate)."""
        return self.task.rl_evaluate(self.policy, self.tok, self.baseline, self.cfg, self.rewards)

    def evaluate(self, ev: dict | None = None) -> dict:
        """The exact evaluation now (`ev`: already made, a lockstep population's), with the running
        peaks of what must never break."""
        ev = ev or self.exact_evaluation()
        return {**ev, **self.peaks.update(ev)}

    def probes(self, batch) -> list:
        """What the step's trust region measures (trust_region.py): the rollout, the anchor set."""
        out = (
            [("rollout", batch.gen, self.cfg.trust_region, None, None)]
            if self.cfg.trust_region > 0
            else []
        )
        if self.anchor is not None and self.cfg.trust_region_anchor > 0:
            gen, weights, group = self.anchor_probe_rows()
            out.append(("anchor", gen, self.cfg.trust_region_anchor, weights, group))
        return out

    def anchor_probe_rows(self) -> tuple:
        """The anchor rows the trust region measures -> (generation, weights, group), chosen once:
        the tree's rows, or a quarter of each person's samples; people only (group −1: the RL
        prompts' own states)."""
        if self.anchor_probe is None:
            a = self.anchor
            rows = (a.group >= 0).nonzero().flatten()
            if self.cfg.preserve_anchor == "sampled":
                rows = rows[
                    rows % self.cfg.preserve_per_prompt < max(1, self.cfg.preserve_per_prompt // 4)
                ]
            self.anchor_probe = (a.gen.select(rows), a.weights[rows], a.group[rows])
        return self.anchor_probe

    def anchor_term(self) -> torch.Tensor | None:
        """The preservation loss on a fresh minibatch of anchor rows (None when off)."""
        if self.anchor is None:
            return None
        m = self.anchor.gen.ids.size(0)
        rows = (
            None
            if self.cfg.preserve_anchor == "tree"
            else torch.randperm(m, generator=self.gens["anchor_rows"])[
                : self.cfg.preserve_batch
            ].to(self.device)
        )
        return self.cfg.preserve_coef * anchor_loss(
            self.policy, self.anchor, rows, self.cfg.preserve_kl
        )

    def clip_and_step(self, opt, loss: torch.Tensor, params) -> float:
        opt.zero_grad(set_to_none=True)
        # a member's: with the others'
        loss.backward() if BATCH.get() is None else self.policy.backward(loss)
        norm = float(
            clip_grad_norm(params, self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf"))
        )
        # a clip of an inf norm zeroes the step: the run would freeze without a word
        if not math.isfinite(norm):
            raise UsageError(
                f"the gradient became {norm} at step {self.step + 1}: a loss weight (e.g. "
                "--vf-coef, "
                "--preserve-coef) or --lr too large for float32; the run stopped, checkpoints "
                "intact"
            )
        opt.step()
        return norm

    # ---- the parts of a step that are not the algorithm's (run() below; a lockstep population's
    # members) ------
    def begin(self, algo, opt, evaluation: dict | None = None) -> JsonlLogger:
        """Before step 1 (or the resumed step): restore a resumed run, write config.json, open
        metrics.jsonl, say what runs, and evaluate (logged as step 0 on a fresh run; `evaluation`:
        already made) -> the metrics logger."""
        cfg = self.cfg
        if self.resume_state:
            self.restore(algo, opt)
        write_json(self.out / "config.json", {"algo": self.algo_name, **asdict(cfg)})
        logger = JsonlLogger(
            self.out / "metrics.jsonl", truncate_after_step=self.step if self.resume_state else None
        )
        self.log(
            f"{self.algo_name} on {cfg.task} | reward {cfg.reward} | {len(self.prompts)} RL "
            "prompt(s) | "
            f"G={cfg.group_size} x {cfg.prompts_per_step} prompts | preservation "
            f"{'on' if self.anchor is not None else 'off'} | "
            + (f"resuming at step {self.step}" if self.resume_state else f"from {cfg.init}")
            + "\nat most "
            f"{cfg.steps} steps"
            + (f", stops at exact target >= {cfg.goal:g}" if cfg.goal else "")
            + ("" if cfg.verbose else " | max: the worst so far; --verbose: every figure")
        )
        self.last_eval = self.evaluate(evaluation)
        if not self.resume_state:
            logger.log({"step": 0, **flat(self.last_eval)})
        self.stop_reason = None
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

    def end_step(
        self,
        algo,
        opt,
        batch,
        stats: dict,
        step_time: float,
        logger: JsonlLogger,
        evaluation: dict | None = None,
        figures: list | None = None,
    ) -> None:
        """After the update (and the trust region): check the losses, count the step, renew π_ref
        when due (--ref-update-every), evaluate (every --eval-every steps), apply the stop rule, log
        the row and the progress line, checkpoint when due. A lockstep population's member gets its
        step's exact `evaluation` and its batch's `figures` (batch_figures') already made, every
        member's at once."""
        cfg = self.cfg
        if not all(math.isfinite(v) for k, v in stats.items() if k.endswith("loss")):
            raise UsageError(
                f"the loss became non-finite at step {self.step + 1} (lr {cfg.lr:g}): "
                f"the run stopped; checkpoints already written are intact"
            )
        self.step += 1
        if cfg.ref_update_every and self.step % cfg.ref_update_every == 0:  # iterative GRPO
            self.renew_ref()
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
        evaluated = self.step % cfg.eval_every == 0 or self.step == cfg.steps
        if evaluated:
            self.last_eval = self.evaluate(evaluation)
            row.update(flat(self.last_eval))
            self.stop_reason = self.stop_rule.update(self.step, self.last_eval)
        if self.stop_reason is None and self.step == cfg.steps:
            self.stop_reason = f"cap: --steps {cfg.steps} reached"
        logger.log(row)
        self.log(progress_line(self.step, cfg.steps, row, evaluated, cfg.verbose))
        if self.step % cfg.ckpt_every == 0 or self.stop_reason is not None:
            self.save(algo, opt)

    def renew_ref(self) -> None:
        """π_ref ← π_θ (--ref-update-every)."""
        self.ref.load_state_dict(self.policy.state_dict())

    def interrupted(self, algo, opt) -> None:
        """Ctrl-C: the step in flight was finished: a consistent checkpoint, then exit 130."""
        self.save(algo, opt)
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


def run(
    cfg: RLConfig, algo_factory: Callable[[Run], Algorithm], algo_name: str, panels, log=print
) -> dict:
    """Train with the algorithm built by `algo_factory(run)` (minigrpo/rl/algorithm.py); returns the
    summary."""
    r = Run(cfg, algo_name, log)
    algo = algo_factory(r)
    opt = AdamW(algo.parameters(), lr=cfg.lr)
    logger = r.begin(algo, opt)
    last_batch, guard = None, None
    try:
        with StopOnCtrlC() as stop:
            while r.step < cfg.steps and not stop.requested and r.stop_reason is None:
                t0 = time.perf_counter()
                opt.param_groups[0]["lr"] = r.lr_now()
                batch = collect(
                    r.policy,
                    r.ref,
                    r.tok,
                    r.step_prompts(),
                    cfg.group_size,
                    r.reward,
                    r.gens["rollout"],
                    cfg.max_new_tokens,
                    cfg.temperature,
                    cfg.unfinished_reward,
                    progress=lambda k, n: r.log(
                        f"  step {r.step + 1}: scored {k}/{n} completions (the reward is slow)"
                    ),
                    **rollout_flags(algo),
                )
                probes = r.probes(batch)
                # the trust region's snapshot
                guard = StepGuard(r.policy, probes, previous=guard) if probes else None
                stats = algo.update(batch, opt)
                if guard is not None:
                    stats.update(guard.enforce(r.policy))
                r.end_step(algo, opt, batch, stats, time.perf_counter() - t0, logger)
                last_batch = batch
    # a user reward raised or returned a non-finite value: one line, no traceback
    except RewardError as e:
        raise UsageError(
            f"{e} (stopped at step {r.step}; checkpoints already written are intact)"
        ) from None
    finally:
        logger.close()
    # Ctrl-C: the step in flight was finished: a consistent checkpoint
    if stop.requested and r.stop_reason is None:
        r.interrupted(algo, opt)
    return r.finish(last_batch, panels)
