"""What compare runs: its own flags (CompareConfig, python -m minigrpo.compare --help) and the flags
each run's trainer gets from them (trainer_args; compare.command puts the trainer's module in
front): its preset or flags, its seed, one thread, no plot, the budget (--budget fixed: --steps with
the stop rule off and one checkpoint, its last), the flags passed through to the trainers, and a
variant's own flags last, so they win.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minigrpo.tools.algorithms import ALGOS, OWN_TRAINERS, base_of, variant_flags
from minigrpo.util.cli import meta


@dataclass
class CompareConfig:
    algos: str = field(
        default="default,grpo,dr_grpo,dapo,gspo,rloo,reinforce,ppo,ppo_oracle",
        metadata=meta(
            f"comma-separated, of {', '.join(ALGOS)} (default = minigrpo.grpo without "
            f"a preset; ppo_oracle = ppo --critic oracle, the ideal-critic bound; dpo, "
            f"online_dpo = minigrpo.dpo [--online]), each with flags of its own if you "
            f"like: NAME@flag=value[@flag=value...], e.g. default@lr=0.003, a row of its "
            f"own (minigrpo/tools/algorithms.py)"
        ),
    )
    seeds: int = field(default=5, metadata=meta("seeds per algorithm (0, 1, ...)"))
    budget: str = field(
        default="fixed",
        metadata=meta(
            "fixed: every run takes --steps steps (equal work); goal: each run stops at its goal",
            choices=["fixed", "goal"],
        ),
    )
    steps: int | None = field(
        default=None,
        metadata=meta(
            "steps per run (default: 60 on food with --budget fixed, else the trainers' own cap)"
        ),
    )
    reward: str | None = field(
        default=None,
        metadata=meta("reward spec passed to every run (default: the task's, food: pizza)"),
    )
    out: str | None = field(
        default=None,
        metadata=meta("output folder (default runs/compare-<reward>, or runs/compare-<task>)"),
    )
    overwrite: bool = field(
        default=False,
        metadata=meta(
            "replace the runs in --out that another compare command made (refused otherwise)"
        ),
    )
    jobs: int = field(
        default=0,
        metadata={
            "help": "worker processes: with --engine pool each runs one run at a "
            "time, with population each one population; then the table's "
            "bootstraps in as many threads (0 = the cores)"
        },
    )
    members: int = field(
        default=128,
        metadata=meta(
            "most runs in one population (--engine population): more runs make more "
            "populations, each worker process running one at a time (0 = no limit)"
        ),
    )
    engine: str = field(
        default="auto",
        metadata=meta(
            "pool: worker processes, a few runs at a time; population: populations of at most "
            "--members runs, one per worker process at a time, a GRPO or PPO algorithm's seeds in "
            "lockstep (GRPO's presets of one μ together), other runs alone as the pool runs them "
            "(minigrpo/population); auto: population when the runs' device is a GPU, else pool",
            choices=["auto", "pool", "population"],
        ),
    )


def trainer_args(
    algo: str, seed: int, cfg: CompareConfig, passthrough: list[str], task: str
) -> list[str]:
    """The trainer's flags for one run (without the module and --out)."""
    base = base_of(algo)
    preset = (
        OWN_TRAINERS[base][1]
        if base in OWN_TRAINERS
        else []
        if base == "default"
        else ["--preset", base]
    )
    reward = ["--reward", cfg.reward] if cfg.reward else []
    steps = cfg.steps or (60 if cfg.budget == "fixed" and task == "food" else None)
    budget = (["--goal", "0", "--plateau", "0"] if cfg.budget == "fixed" else []) + (
        ["--steps", str(steps), "--ckpt-every", str(steps)] if steps else []
    )  # its last checkpoint alone
    return [
        *preset,
        *reward,
        "--seed",
        str(seed),
        "--threads",
        "1",
        "--quiet",
        "--no-plot",
        *budget,
        *passthrough,
        *variant_flags(algo),
    ]  # a variant's own flags last: they win
