"""A running RL job's set-up and state: Run, which every algorithm reads (policy, π_ref,
anchor, generators, config), built from --init (or a resumed run, or `like` another new run),
with what it measures and steps: the exact evaluation, the trust region's probes, the preservation
term and the clipped optimizer step. Its per-step bookkeeping is rl/bookkeeping.py, its checkpoints
rl/checkpoints.py; the loop that drives it is rl/loop.py.

One random generator per purpose (rollout sampling, prompt draws, the anchor's construction, the
anchor's minibatches, PPO's shuffles), each seeded from (seed, purpose): turning preservation off or
changing μ leaves the sampled completions of a step unchanged, so A/B comparisons are paired.
"""

from __future__ import annotations

import copy
import math
import zlib
from pathlib import Path

import torch

from minigrpo.lm.checkpoint import CheckpointError, load_checkpoint, model_from_state
from minigrpo.lm.optim import clip_grad_norm
from minigrpo.rl.bookkeeping import RunBookkeeping
from minigrpo.rl.checkpoints import RunCheckpoints
from minigrpo.rl.config import RLConfig, check_rl_config
from minigrpo.rl.preserve import anchor_loss, make_anchor
from minigrpo.rl.stopping import Peaks, StopRule
from minigrpo.util.cli import UsageError
from minigrpo.util.outputs import prepare_out
from minigrpo.util.runtime import setup_runtime
from toy_tasks import get_task
from toy_tasks.rewards import RewardError, make_reward
from toy_tasks.support import reward_table

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


def nonfinite_gradient(norm: float, step: int) -> str:
    """The line a run stops with when its gradient norm at `step` is not finite."""
    return (
        f"the gradient became {norm} at step {step}: a loss weight (e.g. --vf-coef, "
        "--preserve-coef) or --lr too large for float32; the run stopped, checkpoints intact"
    )


class Run(RunBookkeeping, RunCheckpoints):
    """Everything a running RL job holds; algorithms read policy, ref, anchor, gens and cfg from
    it."""

    def __init__(self, cfg: RLConfig, algo_name: str, log=print, like: "Run | None" = None):
        """like: a run set up from the same --init and flags (its seed and folder aside) and not yet
        trained: its model, tokenizer, tree anchor and baseline are taken, not built again, and its
        π_ref shared (read only)."""
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
            self.policy, self.tok = copy.deepcopy(like.ref).requires_grad_(), like.tok
            meta = {"task": cfg.task}
        else:
            try:
                self.policy, self.tok, meta = load_checkpoint(cfg.init, self.device)
            except CheckpointError as e:
                hint = (
                    "" if Path(cfg.init).exists() else " (run `python -m minigrpo.pretrain` first)"
                )
                raise UsageError(f"--init: {e}{hint}") from None
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
        self.ref = like.ref if like else copy.deepcopy(self.policy).eval().requires_grad_(False)
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
        """The exact evaluation now (`ev`: already made by the caller), with the running peaks of
        what must never break."""
        ev = ev or self.exact_evaluation()
        return {**ev, **self.peaks.update(ev)}

    def anchor_probe_rows(self) -> tuple:
        """The anchor rows the trust region measures -> (generation, weights, group), chosen once:
        the tree's rows, or a quarter of each person's samples; people only (group −1: the RL
        prompts' own states)."""
        if self.anchor_probe is None:
            a = self.anchor
            rows = (a.group >= 0).nonzero().flatten()
            if self.cfg.preserve_anchor == "sampled":
                k = self.cfg.preserve_per_prompt
                rows = rows[rows % k < max(1, k // 4)]
            self.anchor_probe = (a.gen.select(rows), a.weights[rows], a.group[rows])
        return self.anchor_probe

    def anchor_term(self) -> torch.Tensor | None:
        """The preservation loss on a fresh minibatch of anchor rows (None when off)."""
        if self.anchor is None:
            return None
        rows = None  # the tree: all its rows
        if self.cfg.preserve_anchor == "sampled":
            rows = torch.randperm(self.anchor.gen.ids.size(0), generator=self.gens["anchor_rows"])
            rows = rows[: self.cfg.preserve_batch].to(self.device)
        return self.cfg.preserve_coef * anchor_loss(
            self.policy, self.anchor, rows, self.cfg.preserve_kl
        )

    def clip_and_step(self, opt, loss: torch.Tensor, params) -> float:
        return float(clip_and_step(opt, loss, params, self.cfg.grad_clip, self.step))


def clip_and_step(opt, loss, params, grad_clip: float, step: int, active=None) -> torch.Tensor:
    """Backward, the gradient clipped to --grad-clip (0: none), the optimiser's step -> the norm
    before clipping. Losses (P,) of P runs' stacked weights: their sum's backward, each slice
    clipped on its own, the slices `active` ((P,) bool; None: all) stepped -> (P,) norms, a
    non-finite one left to the caller (lm/optim.clip_grad_norm per_slice, AdamW.step)."""
    opt.zero_grad(set_to_none=True)
    loss.sum().backward()
    clip = grad_clip if grad_clip > 0 else float("inf")
    norm = clip_grad_norm(params, clip, per_slice=loss.dim() > 0)
    # a clip of an inf norm zeroes the step: the run would freeze without a word
    if loss.dim() == 0 and not math.isfinite(norm):
        raise UsageError(nonfinite_gradient(float(norm), step + 1))
    opt.step(active)
    return norm
