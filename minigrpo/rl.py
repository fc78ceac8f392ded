"""The RL run shared by every algorithm (GRPO and its variants, PPO): set-up, the outer loop, exact
evaluation, metrics, checkpoints, resume and Ctrl-C. An algorithm only supplies `update(batch)`.

Each step:  collect a rollout (rollout.py)  ->  algorithm.update (μ inner updates)  ->  metrics
Every --eval-every steps and at the end: the task's exact evaluation (target rate, each other
person's drift from the pretrained model, malformed mass). Checkpoints (every --ckpt-every steps, at
the end, and on Ctrl-C) hold the policy, the reference, the optimiser, the algorithm's own state (e.g.
PPO's critic), the sampling generator's state, the anchor set and the baseline, so `--resume` gives the
same metrics on CPU as an uninterrupted run.

Departure from the papers: a 5-step linear learning-rate warm-up (--warmup 0 turns it off). Adam's
first update moves every weight by about lr whatever its gradient, and on the food task that first
step alone moved other people's distributions by TV 0.11; with the warm-up the worst drift during
the whole run stayed below 0.04 (seeds 0 and 1), at the same number of steps to 0.95.
"""

from __future__ import annotations

import argparse
import copy
import json
import signal
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from minigrpo.checkpoint import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from minigrpo.cli import UsageError, check_positive, parse_config, prepare_out, setup_runtime, write_json
from minigrpo.metrics import JsonlLogger, plot_panels, read_jsonl
from minigrpo.optim import AdamW
from minigrpo.preserve import Anchor, anchor_loss, build_anchor
from minigrpo.rewards import RewardError, make_reward
from minigrpo.rollout import RolloutBatch, collect
from toy_tasks import get_task, task_defaults


@dataclass
class RLConfig:
    """Fields every RL command shares (GRPO and PPO add their own)."""
    task: str = field(default="food", metadata={"help": "toy task (food, arithmetic)"})
    init: str = field(default="runs/pretrain/model.pt", metadata={"help": "pretrained checkpoint to start from, also π_ref (runs/pretrain-<task>/model.pt for other tasks)"})
    out: str | None = field(default=None, metadata={"help": "output folder (default runs/<algo>-<reward>)"})
    resume: str | None = field(default=None, metadata={"help": "continue the run in this folder from its last checkpoint"})
    reward: str = field(default="pizza", metadata={"help": "reward spec: a name, NAME=W,... or file.py:function (see rewards.py)"})
    person: str = field(default="ravin", metadata={"help": "food task: whose prompt RL trains on"})
    unfinished_reward: float | None = field(default=None, metadata={"help": "reward for completions cut off before their end token (default: score them like the rest)"})
    steps: int = field(default=40, metadata={"help": "RL steps (one rollout each)"})
    prompts_per_step: int = field(default=4, metadata={"help": "prompts drawn per step (with replacement from the task's RL prompts)"})
    group_size: int = field(default=8, metadata={"help": "completions sampled per prompt (G)"})
    max_new_tokens: int = field(default=14, metadata={"help": "longest completion"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature (log-probs use the same)"})
    lr: float = field(default=1e-3, metadata={"help": "AdamW learning rate"})
    warmup: int = field(default=5, metadata={"help": "linear learning-rate warm-up over the first N steps (0 = off; see rl.py)"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient norm clip (0 = off)"})
    preserve: bool = field(default=True, metadata={"help": "anchor off-target prompts to π_ref (food: the other people); --no-preserve shows the spill-over"})
    preserve_coef: float = field(default=20.0, metadata={"help": "weight of the preservation KL"})
    preserve_kl: str = field(default="forward", metadata={"help": "preservation KL direction: forward KL(π_ref‖π) or reverse KL(π‖π_ref)", "choices": ["forward", "reverse"]})
    preserve_per_prompt: int = field(default=64, metadata={"help": "anchor sequences sampled once from π_ref per off-target prompt"})
    preserve_batch: int = field(default=56, metadata={"help": "anchor sequences used per update"})
    ref_update_every: int = field(default=0, metadata={"help": "π_ref <- π_θ every N steps (0 = never: the reference stays the pretrained model)"})
    eval_every: int = field(default=5, metadata={"help": "exact evaluation every N steps (and at the end)"})
    ckpt_every: int = field(default=50, metadata={"help": "checkpoint every N steps (and at the end)"})
    seed: int = field(default=0, metadata={"help": "random seed"})
    threads: int = field(default=1, metadata={"help": "torch CPU threads (1 is fastest for models this small)"})
    device: str = field(default="auto", metadata={"help": "auto, cpu or cuda", "choices": ["auto", "cpu", "cuda"]})
    quiet: bool = field(default=False, metadata={"help": "no progress lines"})


# Panels of metrics.png that every algorithm shares: what the run achieved (first) and what it cost (last).
OUTCOME_PANELS = [
    ("reward (higher is better)", ["reward_mean", "reward_rolling"]),
    ("exact target rate (higher is better)", ["target_rate"]),
    ("worst other-person drift, TV (lower is better)", ["worst_drift"]),
    ("malformed mass (lower is better)", ["malformed"]),
    ("policy loss", ["policy_loss"]),
]
COST_PANELS = [
    ("step time, s (lower is better)", ["step_time"]),
    ("preservation loss", ["preserve_loss"]),
]


class Run:
    """Everything a running RL job holds; algorithms read policy, ref, anchor and cfg from it."""

    def __init__(self, cfg: RLConfig, algo_name: str, log=print):
        check_positive(cfg, "steps", "prompts_per_step", "max_new_tokens", "temperature", "lr", "eval_every",
                       "ckpt_every", "preserve_per_prompt", "preserve_batch")
        if cfg.group_size < 2:
            raise UsageError(f"--group-size must be >= 2 (group baselines need two samples), got {cfg.group_size}")
        self.cfg, self.algo_name, self.log = cfg, algo_name, (lambda *a: None) if cfg.quiet else log
        try:
            self.task = get_task(cfg.task)
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.device = setup_runtime(cfg.threads, cfg.device, cfg.seed)
        self.resume_state = self._read_resume() if cfg.resume else None
        try:
            self.policy, self.tok, meta = load_checkpoint(cfg.init, self.device)
        except CheckpointError as e:
            hint = " (run `python -m minigrpo.pretrain` first)" if not Path(cfg.init).exists() else ""
            raise UsageError(f"--init: {e}{hint}") from None
        if meta["task"] != cfg.task:
            raise UsageError(f"--init {cfg.init!r} was pretrained on task {meta['task']!r}, not {cfg.task!r}")
        try:
            self.reward = make_reward(cfg.reward, self.task.REWARDS, self.task.REWARD_HELP)
            self.prompts = self.task.rl_prompts(cfg)
            for p in self.prompts:
                self.tok.check(p)
        except (RewardError, ValueError) as e:
            raise UsageError(str(e)) from None
        self.ref = copy.deepcopy(self.policy).eval().requires_grad_(False)
        self.policy.train()
        self.out = prepare_out(cfg.out)
        self.generator = torch.Generator(device="cpu").manual_seed(cfg.seed)
        self.step, self.anchor, self.baseline = 0, None, None
        self.rewards_window: list[float] = []  # the last 10 steps' mean rewards (for reward_rolling)
        if self.resume_state is None:  # on resume, `restore` brings all three back from the checkpoint
            anchor_prompts = self.task.anchor_prompts(cfg) if cfg.preserve else []
            if anchor_prompts:
                self.anchor = build_anchor(self.ref, self.tok, anchor_prompts, cfg.preserve_per_prompt,
                                           cfg.max_new_tokens, self.generator)
            self.baseline = self.task.rl_baseline(self.ref, self.tok, cfg)

    def _read_resume(self) -> dict:
        path = Path(self.cfg.resume) / "model.pt"
        if not Path(self.cfg.resume).is_dir():
            raise UsageError(f"--resume {self.cfg.resume!r} is not a folder")
        try:
            state = read_checkpoint(path)
        except CheckpointError as e:
            raise UsageError(f"--resume {self.cfg.resume!r} has no usable checkpoint: {e}") from None
        if "rl" not in state.get("extra", {}):
            raise UsageError(f"--resume {self.cfg.resume!r}: {path} is not an RL checkpoint")
        return state

    def anchor_term(self) -> torch.Tensor | None:
        """The preservation loss on a fresh minibatch of anchor rows (None when off)."""
        if self.anchor is None:
            return None
        m = self.anchor.gen.ids.size(0)
        rows = torch.randperm(m, generator=self.generator)[: self.cfg.preserve_batch].to(self.device)
        return self.cfg.preserve_coef * anchor_loss(self.policy, self.anchor, rows, self.cfg.preserve_kl)

    def clip_and_step(self, opt: torch.optim.Optimizer, loss: torch.Tensor, params) -> float:
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf"))
        opt.step()
        return float(norm)

    # ---- checkpoints -------------------------------------------------------------------------
    def save(self, algo, opt) -> None:
        """A regular checkpoint (loadable by sample.py, usable as --init) plus the run's state under
        extra["rl"], so --resume continues exactly."""
        rl_state = {
            "algo": self.algo_name, "config": asdict(self.cfg),
            "ref": {k: v.detach().cpu() for k, v in self.ref.state_dict().items()},
            "algo_state": algo.state_dict(), "generator": self.generator.get_state(),
            "anchor": self.anchor.state_dict() if self.anchor is not None else None,
            "baseline": self.baseline, "rewards_window": self.rewards_window,
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
        self.generator.set_state(rl["generator"])
        self.anchor = Anchor.from_state_dict(rl["anchor"], self.device) if rl["anchor"] is not None else None
        self.baseline = rl["baseline"]
        self.rewards_window = list(rl["rewards_window"])
        self.step = state["step"]


def run(cfg: RLConfig, algo_factory, algo_name: str, panels, log=print) -> dict:
    """Train with the algorithm built by `algo_factory(run)`; returns the final summary."""
    r = Run(cfg, algo_name, log)
    algo = algo_factory(r)
    opt = AdamW(algo.parameters(), lr=cfg.lr)
    if r.resume_state:
        r.restore(algo, opt)
    write_json(r.out / "config.json", {"algo": algo_name, **asdict(cfg)})
    logger = JsonlLogger(r.out / "metrics.jsonl", truncate_after_step=r.step if r.resume_state else None)
    r.log(f"{algo_name} on {cfg.task} | reward {cfg.reward} | {len(r.prompts)} RL prompt(s) | G={cfg.group_size} "
          f"x {cfg.prompts_per_step} prompts | preservation {'on' if r.anchor is not None else 'off'} | "
          f"{'resuming at step ' + str(r.step) if r.resume_state else 'from ' + cfg.init}")
    last_eval = r.task.rl_evaluate(r.policy, r.tok, r.baseline, cfg)
    if not r.resume_state:
        logger.log({"step": 0, **_flat(last_eval)})
    last_batch = None
    try:
        with StopOnCtrlC() as stop:
            while r.step < cfg.steps and not stop.requested:
                t0 = time.perf_counter()
                opt.param_groups[0]["lr"] = cfg.lr * min(1.0, (r.step + 1) / cfg.warmup) if cfg.warmup else cfg.lr
                idx = torch.randint(len(r.prompts), (cfg.prompts_per_step,), generator=r.generator).tolist()
                batch = collect(r.policy, r.ref, r.tok, [r.prompts[i] for i in idx], cfg.group_size, r.reward,
                                r.generator, cfg.max_new_tokens, cfg.temperature, cfg.unfinished_reward,
                                keep_ref_logits=algo.needs_ref_logits, old_logp=algo.needs_old_logp)
                stats = algo.update(batch, opt)
                step_time = time.perf_counter() - t0
                r.step += 1
                if cfg.ref_update_every and r.step % cfg.ref_update_every == 0:  # iterative GRPO
                    r.ref.load_state_dict(r.policy.state_dict())
                last_batch = batch
                r.rewards_window = (r.rewards_window + [batch.rewards.mean().item()])[-10:]
                row = {"step": r.step, "reward_mean": batch.rewards.mean().item(), "reward_std": batch.rewards.std().item(),
                       "reward_rolling": sum(r.rewards_window) / len(r.rewards_window), **stats,
                       "completion_len": batch.mask.sum(1).float().mean().item(),
                       "tokens_per_s": batch.num_tokens / step_time, "step_time": step_time}
                if r.step % cfg.eval_every == 0 or r.step == cfg.steps:
                    last_eval = r.task.rl_evaluate(r.policy, r.tok, r.baseline, cfg)
                    row.update(_flat(last_eval))
                logger.log(row)
                r.log(_progress(r.step, cfg.steps, row, last_eval))
                if r.step % cfg.ckpt_every == 0 or r.step == cfg.steps:
                    r.save(algo, opt)
    except RewardError as e:  # a user reward raised or returned a non-finite value: one line, no traceback
        logger.close()
        raise UsageError(f"{e} (stopped at step {r.step}; checkpoints already written are intact)") from None
    logger.close()
    if stop.requested and r.step < cfg.steps:  # Ctrl-C: the step in flight was finished: a consistent checkpoint
        r.save(algo, opt)
        print(f"\ninterrupted: checkpoint at step {r.step} written to {r.out / 'model.pt'}; "
              f"continue with --resume {r.out}", flush=True)
        raise SystemExit(130)
    rows = read_jsonl(r.out / "metrics.jsonl")
    plot_panels(rows, panels, r.out / "metrics.png", title=f"{algo_name}: {cfg.task}, reward {cfg.reward}")
    if last_batch is not None:
        _write_samples(r.out / "samples.txt", last_batch)
    r.log(r.task.format_rl_eval(last_eval, cfg))
    summary = {"step": r.step, **_flat(last_eval)}
    write_json(r.out / "summary.json", {**summary, "pizza_shares": last_eval.get("pizza_shares"),
                                        "baseline_pizza_shares": _pizza_shares(r.baseline)})
    return summary


class StopOnCtrlC:
    """Turn the first Ctrl-C into a request to stop at the end of the current step (a second one stops
    at once), so the checkpoint written on the way out never holds a half-applied update."""

    def __enter__(self):
        self.requested, self.previous = False, None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _flat(ev: dict) -> dict:
    return {k: v for k, v in ev.items() if isinstance(v, (int, float))}


def _pizza_shares(baseline):
    if isinstance(baseline, dict) and all(isinstance(v, dict) and "pizza" in v for v in baseline.values()):
        return {p: d["pizza"] for p, d in baseline.items()}
    return None


def _progress(step, steps, row, ev) -> str:
    target = ev.get("target_rate", float("nan"))
    line = f"step {step:4d}/{steps} | reward {row['reward_mean']:.3f} (avg10 {row['reward_rolling']:.3f}) | exact target {target:.3f}"
    if any(k.startswith("drift_") for k in ev):  # tasks with off-target prompts (food: the other people)
        line += f" | worst drift {ev['worst_drift']:.3f}"
    if "heldout_rate" in ev:  # tasks with held-out prompts (arithmetic)
        line += f" | held-out {ev['heldout_rate']:.3f}"
    line += f" | loss {row.get('policy_loss', float('nan')):+.4f}"
    if "kl_exact" in row:
        line += f" | KL {row['kl_exact']:.4f}"
    if "clip_frac_low" in row:
        line += f" | clip {row['clip_frac_low'] + row['clip_frac_high']:.3f}"
    return line + f" | {1000 * row['step_time']:.0f} ms"


def _write_samples(path: Path, batch: RolloutBatch) -> None:
    lines = [f"{r:+.3f}\t{p!r} -> {c!r}{'' if f else ' (unfinished)'}"
             for p, c, r, f in zip(batch.prompts, batch.completions, batch.rewards.tolist(), batch.gen.finished.tolist())]
    path.write_text("reward\tprompt -> completion (last step's rollout)\n" + "\n".join(lines) + "\n")


def default_out(cfg: RLConfig, algo_name: str) -> str:
    """runs/<preset or algo>-<reward>, e.g. runs/grpo-pizza, runs/dapo-food-sushi."""
    slug = "".join(c if c.isalnum() else "-" for c in cfg.reward.split("/")[-1]).strip("-")[:40]
    return f"runs/{getattr(cfg, 'preset', None) or algo_name}-{slug}"


def parse_rl_config(cls, argv, description: str, algo_name: str, presets: dict | None = None):
    """Parse argv into `cls`. Defaults come from, in rising priority: the dataclass, the task
    (toy_tasks' RL_DEFAULTS), the --preset, the saved config of a --resume folder; explicit flags
    override all of them."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--preset")
    pre.add_argument("--resume")
    known, _ = pre.parse_known_args(argv)
    defaults = task_defaults(argv, "RL")  # e.g. arithmetic: 64 prompts per step, 300 steps
    if known.preset is not None:
        if known.preset not in (presets or {}):
            raise UsageError(f"unknown --preset {known.preset!r} (available: {', '.join(sorted(presets or {}))})")
        defaults.update(presets[known.preset])
    if known.resume is not None:
        saved = Path(known.resume) / "config.json"
        if not saved.is_file():
            raise UsageError(f"--resume {known.resume!r} has no config.json (not a {algo_name} run folder)")
        names = {f.name for f in fields(cls)}
        defaults.update({k: v for k, v in json.loads(saved.read_text()).items() if k in names})
    cfg, _ = parse_config(cls, argv, description, defaults)
    if cfg.resume is not None:
        cfg.out = cfg.resume
    elif cfg.out is None:
        cfg.out = default_out(cfg, algo_name)
    return cfg

