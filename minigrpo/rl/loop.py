"""The RL run shared by every algorithm (GRPO and its variants, PPO): set-up, the outer loop, exact
evaluation, the stop rule, metrics, checkpoints, resume and Ctrl-C. An algorithm supplies `update`.

Each step:  collect a rollout (rollout.py)  ->  algorithm.update (its inner updates)  ->  exact
evaluation (every --eval-every steps, default every step: one batched forward for all people)  ->
the stop rule (stopping.py: goal reached and stable, plateau, or the --steps cap).
Checkpoints (every --ckpt-every steps, at the end, and on Ctrl-C) hold the policy, π_ref, the optimiser, the
algorithm's own state, every generator's state (the global ones a reward may draw from too), the anchor, the
baseline and the stop rule, so `--resume` gives the same metrics on CPU as an uninterrupted run. At the end:
summary.json, samples.txt and metrics.png (not with --no-plot; `python -m minigrpo.metrics <out>` draws it).

One random generator per purpose (rollout sampling, prompt draws, the anchor's construction, the anchor's
minibatches, PPO's shuffles), each seeded from (seed, purpose): turning preservation off or changing μ leaves
the sampled completions of a step unchanged, so A/B comparisons are paired.

Departure from the papers: a 5-step linear learning-rate warm-up (--warmup 0 turns it off). Adam's
first update moves every weight by about lr whatever its gradient, and on the food task that first step
alone moved other people's distributions far beyond the drift bar (docs/experiments.md).
"""

from __future__ import annotations

import copy
import math
from contextvars import ContextVar
from collections.abc import Callable
import textwrap
import time
import zlib
from dataclasses import asdict
from pathlib import Path

import torch

from minigrpo.rl.algorithm import Algorithm, rollout_flags
from minigrpo.lm.checkpoint import (CheckpointError, load_checkpoint, model_from_state, read_checkpoint,
                                 save_checkpoint)
from minigrpo.util.cli import UsageError
from minigrpo.util.outputs import prepare_out, write_json
from minigrpo.util.jsonl import JsonlLogger
from minigrpo.lm.optim import AdamW, clip_grad_norm
from minigrpo.rl.preserve import Anchor, anchor_loss, make_anchor
from toy_tasks.rewards import RewardError, make_reward
from minigrpo.rl.config import RLConfig, check_rl_config
from minigrpo.rl.report import StopOnCtrlC, closing_hint, draw_figure, flat, progress_line, write_samples
from minigrpo.rl.rollout import collect
from minigrpo.util.runtime import global_rng_state, set_global_rng_state, setup_runtime
from minigrpo.rl.stopping import Peaks, StopRule
from minigrpo.rl.trust_region import StepGuard
from toy_tasks import get_task
from toy_tasks.support import reward_table

# set in each member's thread by a population (minigrpo/population): the run's model work then joins one batch
BATCH: ContextVar = ContextVar("population_batch", default=None)
# where each generator lives: sampling happens on the run's device, index draws on the CPU
GENERATORS = {"rollout": "device", "prompts": "cpu", "anchor": "device", "anchor_rows": "cpu", "shuffle": "cpu"}


def purpose_seed(seed: int, purpose: str) -> int:
    """A seed for one purpose's generator: different purposes never share a stream."""
    return (seed * 1_000_003 + zlib.crc32(purpose.encode())) % (2 ** 63)


class Run:
    """Everything a running RL job holds; algorithms read policy, ref, anchor, gens and cfg from it."""

    def __init__(self, cfg: RLConfig, algo_name: str, log=print):
        check_rl_config(cfg)
        self.cfg, self.algo_name, self.log = cfg, algo_name, (lambda *a: None) if cfg.quiet else log
        try:
            self.task = get_task(cfg.task)
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.device = setup_runtime(cfg.threads, cfg.device, cfg.seed)
        self.resume_state = self._read_resume() if cfg.resume else None
        if self.resume_state is not None:  # the run's own checkpoint holds the model, π_ref and the tokenizer
            self.policy, self.tok = model_from_state(self.resume_state, self.device)
            meta = {"task": self.resume_state["task"]}
        else:
            try:
                self.policy, self.tok, meta = load_checkpoint(cfg.init, self.device)
            except CheckpointError as e:
                hint = " (run `python -m minigrpo.pretrain` first)" if not Path(cfg.init).exists() else ""
                raise UsageError(f"--init: {e}{hint}") from None
        if BATCH.get() is not None:  # π_ref and any critic, deep copies of the policy, join with it
            self.policy = BATCH.get().adopt(self.policy)
        if meta["task"] != cfg.task:
            raise UsageError(f"--init {cfg.init!r} was pretrained on task {meta['task']!r}, not {cfg.task!r}")
        try:
            self.reward = make_reward(cfg.reward, self.task.REWARDS, self.task.REWARD_HELP)
            self.prompts = self.task.rl_prompts(cfg)
            for p in self.prompts:
                self.tok.check(p)
            slow = lambda k, n: self.log(f"  before step 1: scored the reward on {k}/{n} of the task's completions")
            self.rewards = reward_table(self.reward, self.prompts, self.task.support,  # exact E[r] needs it
                                        self.task.OFF_SUPPORT_PROBES, slow)
        except (RewardError, ValueError) as e:
            raise UsageError(str(e)) from None
        room = self.policy.cfg.block_size - 1 - max(len(self.tok.encode(p)) for p in self.prompts)
        if cfg.max_new_tokens > room:
            self.log(f"note: --max-new-tokens {cfg.max_new_tokens} is cut to {room}: the model's block "
                     f"({self.policy.cfg.block_size} tokens) holds BOS, the prompt and the completion")
        self.ref = copy.deepcopy(self.policy).eval().requires_grad_(False)
        self.policy.train()
        self.out = prepare_out(cfg.out, overwrite=cfg.overwrite, resume=cfg.resume is not None)
        self.gens = {name: torch.Generator(device=self.device if where == "device" else "cpu")
                     .manual_seed(purpose_seed(cfg.seed, name)) for name, where in GENERATORS.items()}
        self.step, self.anchor, self.baseline, self.anchor_probe = 0, None, None, None
        self.rewards_window: list[float] = []  # the last 10 steps' mean rewards (for reward_rolling)
        self.stop_rule = StopRule(cfg.goal, cfg.goal_patience, cfg.plateau, cfg.goal_malformed, cfg.goal_drift)
        self.peaks = Peaks()
        self.stop_reason: str | None = None
        if self.resume_state is None:  # on resume, `restore` brings these back from the checkpoint
            anchor_prompts = self.task.anchor_prompts(cfg) if cfg.preserve else []
            self.anchor = make_anchor(self.ref, self.tok, anchor_prompts, self.prompts, cfg, self.gens["anchor"])
            self.baseline = self.task.rl_baseline(self.ref, self.tok, cfg)

    def _read_resume(self) -> dict:
        path = Path(self.cfg.resume) / "model.pt"
        if not Path(self.cfg.resume).is_dir():
            raise UsageError(f"--resume {self.cfg.resume!r}: no such folder")
        try:
            state = read_checkpoint(path)
        except CheckpointError as e:
            raise UsageError(f"--resume {self.cfg.resume!r} has no usable checkpoint: {e}") from None
        rl = state.get("extra", {}).get("rl", {})
        if "gens" not in rl or (rl.get("anchor") is not None and "weights" not in rl["anchor"]):  # older minigrpo
            raise UsageError(f"--resume {self.cfg.resume!r}: {path} is not an RL checkpoint of this version")
        return state

    def evaluate(self) -> dict:
        """The task's exact evaluation now, with the running peaks of what must never break."""
        ev = self.task.rl_evaluate(self.policy, self.tok, self.baseline, self.cfg, self.rewards)
        return {**ev, **self.peaks.update(ev)}

    def probes(self, batch) -> list:
        """What the step's trust region measures (trust_region.py): the rollout, the anchor set."""
        out = [("rollout", batch.gen, self.cfg.trust_region, None, None)] if self.cfg.trust_region > 0 else []
        if self.anchor is not None and self.cfg.trust_region_anchor > 0:
            if self.anchor_probe is None:  # chosen once: the tree's rows, or a quarter of each person's samples
                a = self.anchor
                rows = (a.group >= 0).nonzero().flatten()  # people only (group −1: the RL prompts' own states)
                if self.cfg.preserve_anchor == "sampled":
                    rows = rows[rows % self.cfg.preserve_per_prompt < max(1, self.cfg.preserve_per_prompt // 4)]
                self.anchor_probe = (a.gen.select(rows), a.weights[rows], a.group[rows])
            gen, weights, group = self.anchor_probe
            out.append(("anchor", gen, self.cfg.trust_region_anchor, weights, group))
        return out

    def anchor_term(self) -> torch.Tensor | None:
        """The preservation loss on a fresh minibatch of anchor rows (None when off)."""
        if self.anchor is None:
            return None
        m = self.anchor.gen.ids.size(0)
        rows = None if self.cfg.preserve_anchor == "tree" else \
            torch.randperm(m, generator=self.gens["anchor_rows"])[: self.cfg.preserve_batch].to(self.device)
        return self.cfg.preserve_coef * anchor_loss(self.policy, self.anchor, rows, self.cfg.preserve_kl)

    def clip_and_step(self, opt, loss: torch.Tensor, params) -> float:
        opt.zero_grad(set_to_none=True)
        loss.backward() if BATCH.get() is None else self.policy.backward(loss)  # a member's: with the others'
        norm = float(clip_grad_norm(params, self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")))
        if not math.isfinite(norm):  # a clip of an inf norm zeroes the step: the run would freeze without a word
            raise UsageError(f"the gradient became {norm} at step {self.step + 1}: a loss weight (e.g. --vf-coef, "
                             f"--preserve-coef) or --lr too large for float32; the run stopped, checkpoints intact")
        opt.step()
        return norm

    # ---- checkpoints -------------------------------------------------------------------------
    def save(self, algo, opt) -> None:
        """A regular checkpoint (loadable by sample.py, usable as --init) plus the run's state under
        extra["rl"], so --resume continues exactly."""
        rl_state = {
            "algo": self.algo_name, "config": asdict(self.cfg),
            "ref": {k: v.detach().cpu() for k, v in self.ref.state_dict().items()},
            "algo_state": algo.state_dict(), "gens": {k: g.get_state() for k, g in self.gens.items()},
            "anchor": self.anchor.state_dict() if self.anchor is not None else None,
            "baseline": self.baseline, "rewards_window": self.rewards_window,
            "stop_rule": self.stop_rule.state_dict(), "peaks": self.peaks.values, "stop_reason": self.stop_reason,
            "global_rng": global_rng_state(),  # what a user's reward may draw from
        }
        save_checkpoint(self.out / "model.pt", self.policy, self.tok, self.cfg.task, self.step, optimizer=opt,
                        extra={"rl": rl_state})

    def restore(self, algo, opt) -> None:
        state = self.resume_state
        rl = state["extra"]["rl"]
        if rl["algo"] != self.algo_name:
            raise UsageError(f"--resume {self.cfg.resume!r} holds a {rl['algo']} run, not {self.algo_name}")
        self.policy.load_state_dict(state["model"])
        self.ref.load_state_dict(rl["ref"])
        opt.load_state_dict(state["optimizer"])
        algo.load_state_dict(rl["algo_state"])
        for k, g in self.gens.items():
            g.set_state(rl["gens"][k])
        self.anchor = Anchor.from_state_dict(rl["anchor"], self.device) if rl["anchor"] is not None else None
        self.baseline = rl["baseline"]
        self.rewards_window = list(rl["rewards_window"])
        settings = ("goal", "patience", "plateau", "max_malformed", "max_drift")  # the new flags win
        self.stop_rule.load_state_dict({k: v for k, v in rl["stop_rule"].items() if k not in settings})
        self.peaks = Peaks(rl["peaks"])
        if "global_rng" in rl:  # a checkpoint of an older minigrpo holds none
            set_global_rng_state(rl["global_rng"])
        self.step = state["step"]
        ended = rl["stop_reason"]
        if self.step >= self.cfg.steps:
            raise UsageError(f"--resume {self.cfg.resume!r}: the run already took {self.step} steps; "
                             f"pass --steps N with N > {self.step} (the new cap, counted from step 0)")
        if ended and not ended.startswith("cap"):
            rule = self.stop_rule
            again = (rule.goal > 0 and rule.streak >= rule.patience) or \
                    (rule.plateau and self.step - rule.best_step >= rule.plateau)
            if again:
                raise UsageError(f"--resume {self.cfg.resume!r}: the run stopped at step {self.step} ({ended}); "
                                 f"to train on, pass --goal 0 --plateau 0 (or a higher --goal) with --steps N")
            self.log(f"resuming a run that had stopped ({ended}): the new --goal/--plateau let it continue")


def run(cfg: RLConfig, algo_factory: Callable[[Run], Algorithm], algo_name: str, panels, log=print) -> dict:
    """Train with the algorithm built by `algo_factory(run)` (minigrpo/rl/algorithm.py); returns the summary."""
    r = Run(cfg, algo_name, log)
    algo = algo_factory(r)
    opt = AdamW(algo.parameters(), lr=cfg.lr)
    if r.resume_state:
        r.restore(algo, opt)
    write_json(r.out / "config.json", {"algo": algo_name, **asdict(cfg)})
    logger = JsonlLogger(r.out / "metrics.jsonl", truncate_after_step=r.step if r.resume_state else None)
    r.log(f"{algo_name} on {cfg.task} | reward {cfg.reward} | {len(r.prompts)} RL prompt(s) | G={cfg.group_size} "
          f"x {cfg.prompts_per_step} prompts | preservation {'on' if r.anchor is not None else 'off'} | "
          f"{'resuming at step ' + str(r.step) if r.resume_state else 'from ' + cfg.init}\nat most {cfg.steps} "
          f"steps" + (f", stops at exact target >= {cfg.goal:g}" if cfg.goal else "") +
          ("" if cfg.verbose else " | max: the worst so far; --verbose: every figure"))
    last_eval = r.evaluate()
    if not r.resume_state:
        logger.log({"step": 0, **flat(last_eval)})
    r.stop_reason, last_batch, guard = None, None, None
    try:
        with StopOnCtrlC() as stop:
            while r.step < cfg.steps and not stop.requested and r.stop_reason is None:
                t0 = time.perf_counter()
                opt.param_groups[0]["lr"] = cfg.lr * min(1.0, (r.step + 1) / cfg.warmup) if cfg.warmup else cfg.lr
                idx = torch.randint(len(r.prompts), (cfg.prompts_per_step,), generator=r.gens["prompts"]).tolist()
                batch = collect(r.policy, r.ref, r.tok, [r.prompts[i] for i in idx], cfg.group_size, r.reward,
                                r.gens["rollout"], cfg.max_new_tokens, cfg.temperature, cfg.unfinished_reward,
                                progress=lambda k, n: r.log(f"  step {r.step + 1}: scored {k}/{n} completions (the "
                                                            f"reward is slow)"), **rollout_flags(algo))
                probes = r.probes(batch)
                guard = StepGuard(r.policy, probes, previous=guard) if probes else None  # the trust region's snapshot
                stats = algo.update(batch, opt)
                if guard is not None:
                    stats.update(guard.enforce(r.policy))
                if not all(math.isfinite(v) for k, v in stats.items() if k.endswith("loss")):
                    raise UsageError(f"the loss became non-finite at step {r.step + 1} (lr {cfg.lr:g}): "
                                     f"the run stopped; checkpoints already written are intact")
                step_time = time.perf_counter() - t0
                r.step += 1
                if cfg.ref_update_every and r.step % cfg.ref_update_every == 0:  # iterative GRPO
                    r.ref.load_state_dict(r.policy.state_dict())
                last_batch = batch
                mean, std, length = torch.stack([batch.rewards.mean(), batch.rewards.std(),  # one read, not three
                                                 batch.mask.sum(1).float().mean()]).tolist()
                r.rewards_window = (r.rewards_window + [mean])[-10:]
                row = {"step": r.step, "reward_mean": mean, "reward_std": std,
                       "reward_rolling": sum(r.rewards_window) / len(r.rewards_window), **stats,
                       "completion_len": length,
                       "tokens_per_s": batch.num_tokens / step_time, "step_time": step_time}
                evaluated = r.step % cfg.eval_every == 0 or r.step == cfg.steps
                if evaluated:
                    last_eval = r.evaluate()
                    row.update(flat(last_eval))
                    r.stop_reason = r.stop_rule.update(r.step, last_eval)
                if r.stop_reason is None and r.step == cfg.steps:
                    r.stop_reason = f"cap: --steps {cfg.steps} reached"
                logger.log(row)
                r.log(progress_line(r.step, cfg.steps, row, evaluated, cfg.verbose))
                if r.step % cfg.ckpt_every == 0 or r.stop_reason is not None:
                    r.save(algo, opt)
    except RewardError as e:  # a user reward raised or returned a non-finite value: one line, no traceback
        raise UsageError(f"{e} (stopped at step {r.step}; checkpoints already written are intact)") from None
    finally:
        logger.close()
    if stop.requested and r.stop_reason is None:  # Ctrl-C: the step in flight was finished: a consistent checkpoint
        r.save(algo, opt)
        print(f"\ninterrupted: checkpoint at step {r.step} written to {r.out / 'model.pt'}; "
              f"continue with --resume {r.out}", flush=True)
        raise SystemExit(130)
    if cfg.plot:  # --no-plot (compare's runs): python -m minigrpo.metrics <out> draws it on request
        draw_figure(r.out, panels)
    if last_batch is not None:
        write_samples(r.out / "samples.txt", last_batch)
    r.log(textwrap.fill(f"stopped at step {r.step}: {r.stop_reason}", 120, subsequent_indent="  "))
    r.log(r.task.format_rl_eval(last_eval, cfg))
    details = {k: v for k, v in last_eval.items() if k not in flat(last_eval)}  # e.g. food: every person's shares
    summary = {"step": r.step, "stop_reason": r.stop_reason, **flat(last_eval), **details, "baseline": r.baseline}
    write_json(r.out / "summary.json", summary)
    r.log(closing_hint(r.out, r.prompts[0], r.task.anchor_prompts(cfg), cfg.plot, cfg.preserve))
    return summary
