"""The configuration every RL command shares (GRPO and PPO add their own fields), how its defaults
are layered, and the checks that refuse harmful values with one line before anything runs."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from minigrpo.rl.resume_config import RESUMABLE, check_resume_flags, check_saved_config
from minigrpo.util.cli import UsageError, check_positive, check_ranges, flag, parse_config, require
from toy_tasks import task_defaults


@dataclass
class RLConfig:
    """the run: task, reward, budget, stop rule, preservation, trust region, outputs (every RL
    command)"""

    task: str = flag("food", "toy task (food, arithmetic, sums)")
    init: str = flag(
        "runs/pretrain/model.pt",
        "pretrained checkpoint to start from, also π_ref (runs/pretrain-<task>/model.pt for other "
        "tasks)",
    )
    out: str | None = flag(None, "output folder (default runs/<algo>-<reward>)")
    resume: str | None = flag(
        None,
        "continue the run in this folder from its last checkpoint (--steps stays the total, "
        "counted from step 0)",
    )
    overwrite: bool = flag(False, "replace a finished run already in --out (refused otherwise)")
    reward: str = flag(
        "pizza",
        "reward spec: a task reward (food: pizza, food:<food>, graded[:<food>]; arithmetic: "
        "correct, format, correct+format, strict; sums: correct, format, correct+format, worked), "
        "exact:<text>, regex:<pattern>, length, NAME=W,... or file.py:function, a function "
        "(prompt, completion) -> float\n"
        "e.g. a file my.py of the two lines\n"
        "    def reward(prompt, completion):\n"
        '        return float(completion == "pizza")\n'
        "and --reward my.py:reward",
    )
    person: str = flag("ravin", "food task: whose prompt RL trains on")
    unfinished_reward: float | None = flag(
        None,
        "reward for completions cut off before their end token (default: score them like the rest)",
    )
    steps: int = flag(
        200,
        "most RL steps (one rollout each); the run stops earlier at its goal or a plateau (see "
        "stopping.py)",
    )
    goal: float = flag(
        0.95,
        "stop once the exact target rate (P(a best completion)) is >= goal, stably (0 = run all "
        "--steps)",
    )
    goal_patience: int = flag(3, "consecutive evaluations at the goal that count as stable")
    goal_malformed: float = flag(0.01, "the goal also needs malformed mass <= this")
    goal_drift: float = flag(0.03, "... and every other person's drift <= this (food)")
    plateau: int = flag(
        60,
        "stop when the best exact target rate has not risen by 0.01 in this many steps (0 = never)",
    )
    prompts_per_step: int = flag(
        4, "prompts drawn per step (with replacement from the task's RL prompts)"
    )
    group_size: int = flag(
        16,
        "completions sampled per prompt (G; 16: a rare target, p = 0.02, is in 28 % of groups, "
        "not 15 %)",
    )
    max_new_tokens: int = flag(14, "longest completion")
    temperature: float = flag(1.0, "sampling temperature (log-probs use the same)")
    lr: float = flag(6e-4, "AdamW learning rate")
    warmup: int = flag(
        5, "linear learning-rate warm-up over the first N steps (0 = off; see rl/loop.py)"
    )
    lr_warmdown: float = flag(
        0.2,
        "the learning rate falls linearly to 0 over this share of --steps at their end (0 = off, "
        "1 = over the whole run; see rl/loop.py)",
    )
    grad_clip: float = flag(1.0, "gradient norm clip (0 = off)")
    preserve: bool = flag(
        True,
        "anchor off-target prompts to π_ref (food: the other people); --no-preserve shows the "
        "spill-over",
    )
    preserve_coef: float = flag(
        20.0, "weight of the preservation KL, per optimiser step (see preserve.py)"
    )
    preserve_kl: str = flag(
        "forward",
        "preservation KL direction: forward KL(π_ref‖π) or reverse KL(π‖π_ref)",
        choices=["forward", "reverse"],
    )
    preserve_anchor: str = flag(
        "tree",
        "the anchor's completions: tree = every one with π_ref >= 1e-4, weighted by it, all each "
        "step; sampled = --preserve-per-prompt samples, a minibatch each step (preserve.py)",
        choices=["tree", "sampled"],
    )
    preserve_per_prompt: int = flag(
        64,
        "anchor sequences per off-target prompt: sampled ones, or at most this many of the tree's",
    )
    preserve_forced: float = flag(
        0.1,
        "the tree anchor also holds the RL prompts' own completions, only at states where π_ref's "
        "entropy is below this (nats): their spelling, never their choice (preserve.py; 0 = off, "
        "e.g. for a reward that asks for new spellings)",
    )
    preserve_forced_weight: float = flag(
        1.0, "the weight of those rows together, where all other people together weigh 1"
    )
    preserve_batch: int = flag(56, "--preserve-anchor sampled: anchor sequences per update")
    trust_region: float = flag(
        0.05,
        "largest KL(π_old‖π_new) per completion a step may take on its own rollout, in nats; "
        "larger steps are halved (0 = off; see trust_region.py)",
    )
    trust_region_anchor: float = flag(
        0.003, "the same limit on the anchor sequences of each off-target prompt (0 = off)"
    )
    ref_update_every: int = flag(
        0, "π_ref <- π_θ every N steps (0 = never: the reference stays the pretrained model)"
    )
    eval_every: int = flag(
        1,
        "exact evaluation every N steps (and at the end); the stop rule and the peaks see only "
        "these",
    )
    ckpt_every: int = flag(50, "checkpoint every N steps (and at the end)")
    seed: int = flag(0, "random seed")
    threads: int = flag(1, "torch CPU threads (1 is fastest for models this small)")
    device: str = flag("auto", "auto, cpu or cuda", choices=["auto", "cpu", "cuda"])
    quiet: bool = flag(False, "no progress lines")
    verbose: bool = flag(
        False,
        "every figure in the progress line (by default at most 120 characters: the reward, the "
        "exact target rate, drift and malformed mass, the time; metrics.jsonl holds every figure "
        "either way)",
    )
    plot: bool = flag(
        True,
        "draw metrics.png at the end (--no-plot: later, on request: python -m minigrpo.metrics "
        "<out>)",
    )


def check_rl_config(cfg: RLConfig) -> None:
    """Refuse values that would silently wreck a run, with one line naming the value and what is
    allowed."""
    finite = lambda x: x is not None and math.isfinite(x)
    check_positive(
        cfg,
        "steps",
        "prompts_per_step",
        "max_new_tokens",
        "eval_every",
        "ckpt_every",
        "preserve_per_prompt",
        "preserve_batch",
        "goal_patience",
    )
    for name in ("warmup", "plateau", "ref_update_every", "trust_region", "trust_region_anchor"):
        require(cfg, name, getattr(cfg, name) >= 0, ">= 0")
    require(cfg, "lr", finite(cfg.lr) and 0 < cfg.lr <= 1, "a number in (0, 1]")
    check_ranges(
        cfg,
        {
            "temperature": (1e-3, None),
            "grad_clip": (0, None),
            "preserve_coef": (0, None),
            "preserve_forced": (0, None),
            "preserve_forced_weight": (0, None),
            "goal": (0, 1),
            "goal_malformed": (0, 1),
            "goal_drift": (0, 1),
            "lr_warmdown": (0, 1),
            "unfinished_reward": (None, None),
        },
    )
    require(cfg, "group_size", cfg.group_size >= 2, ">= 2 (group baselines need two samples)")


def default_out(cfg, algo_name: str, changed: list[tuple[str, object]] = ()) -> str:
    """runs/<preset or algo>-<reward>[-<person>][-no-preserve][-<flag>-<value>…]: different
    experiments get different folders, e.g. runs/grpo-pizza, runs/dapo-food-sushi-bob,
    runs/grpo-pizza-no-preserve, runs/grpo-pizza-policy-loss-cispo. `changed`: the other settings
    that differ from their defaults (their values, a short hash of them past 60 characters). A
    reward file adds a short hash of its absolute path, so two files of one name (a/r.py:f,
    b/r.py:f) never share a folder."""
    slug = "".join(c if c.isalnum() else "-" for c in cfg.reward.split("/")[-1]).strip("-")[:40]
    reward_file = cfg.reward.rpartition(":")[0]
    if reward_file.endswith(".py"):
        slug += "-" + hashlib.sha256(str(Path(reward_file).resolve()).encode()).hexdigest()[:6]
    person = getattr(cfg, "person", "ravin")
    tail = (
        f"-{person}" if person != "ravin" and getattr(cfg, "task", "food") == "food" else ""
    ) + ("" if getattr(cfg, "preserve", True) else "-no-preserve")
    # --online -> "-online"
    word = lambda k, v: k if v is True else f"no-{k}" if v is False else f"{k}-{v}"
    flags = "".join("-" + word(k.replace("_", "-"), v) for k, v in changed)
    flags = "".join(c if c.isalnum() or c in ".-" else "-" for c in flags)
    if len(flags) > 60:
        flags = flags[:40] + "-" + hashlib.sha256(flags.encode()).hexdigest()[:6]
    return f"runs/{getattr(cfg, 'preset', None) or algo_name}-{slug}{tail}{flags}"


# settings default_out names on its own (reward, person, preserve, preset); with RESUMABLE, left out
# of its flag list
NAMED = {"reward", "person", "preserve", "preset"}


def changed_settings(cfg, defaults: dict) -> list[tuple[str, object]]:
    """The (name, value) of every setting of `cfg` that defines the experiment and differs from its
    default (the dataclass's, under the task's, the preset's and a resumed run's `defaults`), in
    declaration order."""
    base = {f.name: f.default for f in fields(cfg) if f.default is not MISSING} | defaults
    return [
        (f.name, getattr(cfg, f.name))
        for f in fields(cfg)
        if f.name not in RESUMABLE | NAMED
        and getattr(cfg, f.name) != base.get(f.name, getattr(cfg, f.name))
    ]


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
            raise UsageError(
                f"unknown --preset {known.preset!r} (available: {', '.join(sorted(presets or {}))})"
            )
        defaults.update(presets[known.preset])
    saved_cfg = None
    if known.resume is not None:
        saved = Path(known.resume) / "config.json"
        if not known.resume or not Path(known.resume).is_dir():
            raise UsageError(f"--resume {known.resume!r}: no such folder")
        if not saved.is_file():
            raise UsageError(
                f"--resume {known.resume!r} has no config.json (not a {algo_name} run folder)"
            )
        names = {f.name for f in fields(cls)}
        try:
            saved_json = json.loads(saved.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UsageError(
                f"--resume {known.resume!r}: its config.json is not readable JSON ({e}); the run "
                "cannot be continued as the same experiment (start a new one with --out)"
            ) from None
        except OSError as e:  # no permission to read it, an I/O error
            raise UsageError(
                f"--resume {known.resume!r}: its config.json cannot be read ({e.strerror or e}); "
                "make it readable, or start a new run with --out"
            ) from None
        if not isinstance(saved_json, dict):
            raise UsageError(f"--resume {known.resume!r}: its config.json holds no settings object")
        saved_cfg = {k: v for k, v in saved_json.items() if k in names}
        check_saved_config(cls, saved_cfg, saved)
        if not (Path(known.resume) / "metrics.jsonl").is_file():
            raise UsageError(
                f"--resume {known.resume!r}: its metrics.jsonl is gone, so the steps run so far "
                "would be missing from the record; restore it, or start a new run with --out"
            )
        defaults.update(saved_cfg)
    cfg, _ = parse_config(cls, argv, description, defaults)
    if saved_cfg is not None:
        check_resume_flags(cfg, saved_cfg, known.resume, argv)
    if any(a == "--person" or a.startswith("--person=") for a in argv or []) and cfg.task != "food":
        raise UsageError(
            f"--person is the food task's (whose prompt RL trains on); task {cfg.task!r} has no "
            "people"
        )
    if cfg.resume is not None:
        cfg.out = cfg.resume
    elif cfg.out is None:
        cfg.out = default_out(cfg, algo_name, changed_settings(cfg, defaults))
    check_rl_config(cfg)
    return cfg
