"""compare's algorithms by name: `default` (minigrpo.grpo without a preset), every grpo --preset,
the trainers of their own (ppo, ppo_oracle, dpo, online_dpo), and variants of any of them with
trainer flags of their own:

    default@lr=0.003              minigrpo.grpo --lr 0.003
    grpo@beta=0.1@group_size=4    minigrpo.grpo --preset grpo --beta 0.1 --group-size 4
    ppo@critic=head               minigrpo.ppo --critic head
    default@no_preserve           minigrpo.grpo --no-preserve (a flag without a value)

A variant's flags come after every flag compare passes to all runs, so they win. A variant is a row
of compare's table and the name of its runs' folders (<variant>-s<seed>): letters, digits and `_ . =
@ + -` only. It may not set what compare sets itself or what every row of one table shares (FIXED):
the task, the reward and its person, --init, the device, the budget.
"""

from __future__ import annotations

import re

from minigrpo.util.cli import UsageError
from minigrpo.variants.presets import PRESETS

# Algorithms with a trainer of their own: its name (the command minigrpo.<name>, which compare's
# TRAINERS map it to: the tools sit below the commands) and flags (ppo_oracle: PPO with the exact
# critic). Every other algorithm's trainer is grpo.
OWN_TRAINERS = {
    "ppo": ("ppo", []),
    "ppo_oracle": ("ppo", ["--critic", "oracle"]),
    "dpo": ("dpo", []),
    "online_dpo": ("dpo", ["--online"]),
}
PPO_ALGOS = [a for a, (trainer, _) in OWN_TRAINERS.items() if trainer == "ppo"]
ALGOS = ["default"] + sorted(PRESETS) + list(OWN_TRAINERS)
SET_BY_COMPARE = ("seed", "out", "preset", "resume", "goal", "plateau")  # no run may be given these
# nor a variant these
FIXED = {*SET_BY_COMPARE, "steps", "task", "reward", "person", "init", "device", "online"}


def run_of(folder_name: str) -> tuple[str, int] | None:
    """(algorithm, seed) of a compare run's folder, named <algorithm>-s<seed>; None for another
    name."""
    algo, _, seed = folder_name.rpartition("-s")
    return (algo, int(seed)) if algo and seed.isdigit() else None


def base_of(name: str) -> str:
    """'grpo@beta=0.1' -> 'grpo'."""
    return name.split("@", 1)[0]


def trainer_of(name: str) -> str:
    """The name of an algorithm's trainer: 'ppo_oracle@lr=1e-3' -> 'ppo', 'gspo' -> 'grpo'."""
    return OWN_TRAINERS[base_of(name)][0] if base_of(name) in OWN_TRAINERS else "grpo"


def variant_flags(name: str) -> list[str]:
    """A name's own trainer flags: 'grpo@beta=0.1@no_preserve' -> ['--beta', '0.1',
    '--no-preserve']; [] for a plain algorithm. UsageError (one line) for an unknown algorithm, a
    character a folder name should not hold, an empty or repeated flag, or one of FIXED."""
    base, *parts = name.split("@")
    if base not in ALGOS:
        raise UsageError(
            f"unknown algorithm {base!r} in --algos (available: {', '.join(ALGOS)}; a variant: "
            f"NAME@flag=value, e.g. default@lr=0.003)"
        )
    if not re.fullmatch(r"[A-Za-z0-9_.=@+-]+", name):
        raise UsageError(
            f"--algos {name!r}: a variant names its runs' folders: letters, digits and _ . = @ + "
            "- only"
        )
    flags, seen = [], set()
    for part in parts:
        key, eq, value = part.partition("=")
        key = key.replace("_", "-")
        if not key or (eq and not value) or key in seen:
            raise UsageError(
                f"--algos {name!r}: {part!r} is not flag=value or flag (each flag once), e.g. "
                "lr=0.003"
            )
        if key.replace("-", "_") in FIXED:
            raise UsageError(
                f"--algos {name!r}: a variant may not set --{key} (compare sets it, or every row "
                "of the table shares it)"
            )
        if key == "critic" and base != "ppo":
            raise UsageError(
                f"--algos {name!r}: --critic only in a variant of ppo (ppo_oracle is ppo "
                "--critic oracle)"
            )
        seen.add(key)
        flags += [f"--{key}", value] if eq else [f"--{key}"]
    return flags
