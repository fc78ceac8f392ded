"""The verifiable-arithmetic task: lines "<expression>=<answer>." from a declared, noisy solver.

Expressions are 2 or 3 single-digit operands joined by + - * with the usual precedence (* first,
then + and - left to right): "3+2*2=" -> 7, "3-2-1=" -> 0. The pretraining corpus answers them like
an unreliable student whose error model is declared, so everything a run is judged by is known
exactly:
  EXPRESSIONS, PROMPTS, HELDOUT  every prompt (543); the RL prompts; a fixed seeded tenth never used
                                 in RL
  OUTCOMES                       the error model, NUMBERS x WRITINGS: (kind, probability, offset,
                                 template)
  make_corpus(n, seed)           lines uniform over EXPRESSIONS (HELDOUT included) with the error
                                 model applied: exact per expression when n is a multiple of
                                 N * CORPUS_UNIT
  entropy_floor()                the corpus entropy in nats per predicted token: the best loss
                                 possible
  exact_outcomes(...)            the model's exact probability of every declared completion
                                 (teacher-forced, batched forwards), so 1 - sum = mass off the
                                 declared support
Completion FORMAT: the integer (optional "-", no leading zeros) then "." then the end token: "11.".
PRETRAIN_DEFAULTS pass `pretrain_report` (86880 = N * CORPUS_UNIT lines: an exact corpus).

This module is the task (toy_tasks/contract.py): its defaults, its rewards and its RL interface;
the world and its corpus are arithmetic_world.py, the exact measurements and the pretraining report
arithmetic_exact.py, their names importable from here too.
"""

from __future__ import annotations

import re

from toy_tasks.arithmetic_exact import (
    BAR,
    exact_accuracy,
    exact_accuracy_many,
    exact_figures,
    exact_outcomes,
    exact_outcomes_many,
    format_report,
    pretrain_report,
    sampled_accuracy,
)
from toy_tasks.arithmetic_world import (
    ALPHABET,
    BLOCK_SIZE,
    CORPUS_UNIT,
    DIGITS_2,
    DIGITS_3,
    EXPRESSIONS,
    FORMAT,
    HELDOUT,
    HELDOUT_FRACTION,
    HELDOUT_SEED,
    KINDS,
    NUMBERS,
    OPS,
    OUTCOMES,
    P_CORRECT,
    P_DOUBLE_DOT,
    P_MINUS_1,
    P_NO_DOT,
    P_PLUS_1,
    P_RIGHT_NUMBER,
    P_SPACE,
    P_WELL_FORMED,
    PROMPTS,
    VALUES,
    WRITINGS,
    answer,
    completions,
    entropy_floor,
    evaluate,
    line_distribution,
    make_corpus,
    value,
)
from toy_tasks.support import peak_text, reward_figures_many

# the task's contract (toy_tasks/contract.py) and the world's names, importable from here
__all__ = [
    "ALPHABET",
    "BAR",
    "BLOCK_SIZE",
    "CORPUS_UNIT",
    "DIGITS_2",
    "DIGITS_3",
    "EXPRESSIONS",
    "FORMAT",
    "HELDOUT",
    "HELDOUT_FRACTION",
    "HELDOUT_SEED",
    "KINDS",
    "NAME",
    "NUMBERS",
    "OFF_SUPPORT_PROBES",
    "OPS",
    "OUTCOMES",
    "PRETRAIN_DEFAULTS",
    "PROMPTS",
    "P_CORRECT",
    "P_DOUBLE_DOT",
    "P_MINUS_1",
    "P_NO_DOT",
    "P_PLUS_1",
    "P_RIGHT_NUMBER",
    "P_SPACE",
    "P_WELL_FORMED",
    "REWARDS",
    "REWARD_HELP",
    "REWARD_RANGES",
    "RL_DEFAULTS",
    "VALUES",
    "WRITINGS",
    "anchor_prompts",
    "answer",
    "completions",
    "entropy_floor",
    "evaluate",
    "exact_accuracy",
    "exact_outcomes",
    "first_int_is",
    "format_report",
    "format_rl_eval",
    "line_distribution",
    "make_corpus",
    "pretrain_report",
    "reward_correct",
    "reward_format",
    "reward_strict",
    "rl_baseline",
    "rl_evaluate",
    "rl_evaluate_many",
    "rl_prompts",
    "sampled_accuracy",
    "support",
    "value",
]

NAME = "arithmetic"
# Flags that differ from the CLIs' food-tuned defaults (why, and PPO's lr: docs/experiments.md, the
# arithmetic world).
PRETRAIN_DEFAULTS = {
    "steps": 3000,
    "batch_size": 128,
    "n_embd": 32,
    "n_head": 2,
    "lr": 1e-2,
    "n_lines": 86880,
}
RL_DEFAULTS = {
    "prompts_per_step": 64,
    "group_size": 8,
    "steps": 300,
    "reward": "correct+format",
    "lr": 6e-4,
}
# a completion with no answer at all (support.py; the off-support value is a bound here)
OFF_SUPPORT_PROBES = ("",)
# lenient parse: the first integer anywhere (ASCII digits only)
_FIRST_INT = re.compile(r"-?[0-9]+")


# ---- rewards: f(prompt, completion) -> float; never raise on any completion ----------------------


def first_int_is(completion: str, value: int) -> bool:
    """Lenient check: the first integer in `completion` (ASCII digits, optional "-") equals
    `value`."""
    m = _FIRST_INT.search(completion)
    # bounded: no giant ints
    return m is not None and len(m.group()) <= 24 and int(m.group()) == value


def reward_correct(prompt: str, completion: str) -> float:
    return float(first_int_is(completion, value(prompt)))


def reward_format(prompt: str, completion: str) -> float:
    return float(FORMAT.fullmatch(completion) is not None)


def reward_strict(prompt: str, completion: str) -> float:
    return float(completion == answer(prompt))


_REWARD_FNS = {
    "correct": reward_correct,
    "format": reward_format,
    "strict": reward_strict,
    "correct+format": lambda p, c: reward_correct(p, c) + reward_format(p, c),
}
REWARD_RANGES = {
    "correct": (0.0, 1.0),
    "format": (0.0, 1.0),
    "strict": (0.0, 1.0),
    "correct+format": (0.0, 2.0),
}
REWARDS = {"arith": _REWARD_FNS.get}  # factory(name) -> reward function, or None if not ours
REWARD_HELP = {
    "correct": "1 iff the first integer in the completion is the true value (format slips still "
    "count)",
    "format": "1 iff the completion is well-formed: an integer then '.', e.g. '11.'",
    "correct+format": "correct + format (0..2)",
    "strict": "1 iff the completion is exactly the right, well-formed answer",
}


# ---- RL interface: prompts, rewards and exact evaluation for minigrpo.grpo / minigrpo.ppo --------


def rl_prompts(cfg) -> list[str]:  # RL trains on PROMPTS, never on HELDOUT
    return list(PROMPTS)


# no off-target prompts: nothing to preserve, no drift to measure
def anchor_prompts(cfg) -> list[str]:
    return []


def rl_baseline(model, tokenizer, cfg) -> None:  # nothing to remember before RL
    return None


support = completions  # toy_tasks/support.py: exact E[r] on these 12; best_reward is a lower bound


def rl_evaluate(model, tokenizer, baseline: None, cfg, rewards) -> dict:
    """Exact metrics on PROMPTS (heldout_rate: on HELDOUT), one batched forward: under
    `rewards.support` (P, 12) the exact E[r] on the declared support, its best reward and
    target_rate = P(a best declared completion) (for correct+format, P(right, well-formed "v."));
    correct_rate = P(the right number in a declared writing) and format_rate = P(well-formed v-1, v
    or v+1), both lower bounds; malformed = 1 - format_rate, an upper bound (the declared slips and
    anything off the declared support)."""
    return rl_evaluate_many([model], tokenizer, baseline, cfg, rewards)[0]


def rl_evaluate_many(models, tokenizer, baseline: None, cfg, rewards) -> list[dict]:
    """rl_evaluate of each model (GPTs, or their weights stacked: contract.py), its forwards one for
    all."""
    probs = exact_outcomes_many(models, tokenizer, PROMPTS)  # (M, P, 12)
    heldout = exact_accuracy_many(models, tokenizer, HELDOUT)
    out = []
    for p, h, figures in zip(probs, heldout, reward_figures_many(probs, rewards.support)):
        f = exact_figures(None, tokenizer, PROMPTS, p)
        out.append(
            {
                **figures,
                "heldout_rate": h,
                "correct_rate": f["right_number"],
                "format_rate": f["well_formed"],
                "malformed": max(0.0, 1 - f["well_formed"]),
            }
        )
    return out


def format_rl_eval(ev: dict, cfg) -> str:
    return (
        f"exact P(best declared answer) prompts {ev['target_rate']:.3f} | exact E[r] "
        f"{ev['exact_reward']:.3f} (best {ev['best_reward']:.3g}) | heldout "
        f"{ev['heldout_rate']:.3f} | right number {ev['correct_rate']:.3f} | well-formed "
        f"{ev['format_rate']:.3f} | malformed {ev['malformed']:.3f}{peak_text(ev, 'malformed', 3)}"
    )
