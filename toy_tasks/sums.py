"""The sums task, a world where thinking pays: prompts "3+4+2=" answered at once ("9.") or by worked
steps ("(3+4=7,7+2=9)9."), from a declared student that rarely works the steps although working is
more often right (sums_world.py). Every figure of a run is exact over the declared support
(sums_exact.py): accuracy, think rate, lengths, pass@k, entropy and the malformed mass, on the RL
prompts and on the held-out ones.

This module is the task (toy_tasks/contract.py): its defaults, its rewards and its RL interface.
"""

from __future__ import annotations

import re

from toy_tasks.sums_exact import (
    BAR,
    PASS_AT,
    WORKED_RIGHT,
    exact_figures_many,
    format_report,
    pretrain_report,
    support_probs_many,
)
from toy_tasks.sums_world import (
    ALPHABET,
    BLOCK_SIZE,
    DIRECT_FORMAT,
    DIRECT_OFFSETS,
    DIRECT_RIGHT,
    EXPRESSIONS,
    HELDOUT,
    P_WORKED,
    PROMPTS,
    STEP_RIGHT,
    WORKED_FORMAT,
    completions,
    entropy_floor,
    make_corpus,
    outcomes,
    value,
)
from toy_tasks.support import peak_text, reward_figures_many

__all__ = [
    "ALPHABET",
    "BAR",
    "BLOCK_SIZE",
    "DIRECT_OFFSETS",
    "DIRECT_RIGHT",
    "EXPRESSIONS",
    "HELDOUT",
    "NAME",
    "OFF_SUPPORT_PROBES",
    "PASS_AT",
    "PRETRAIN_DEFAULTS",
    "PROMPTS",
    "P_WORKED",
    "REWARDS",
    "REWARD_HELP",
    "REWARD_RANGES",
    "RL_DEFAULTS",
    "STEP_RIGHT",
    "WORKED_RIGHT",
    "anchor_prompts",
    "completions",
    "entropy_floor",
    "format_report",
    "format_rl_eval",
    "make_corpus",
    "outcomes",
    "pretrain_report",
    "rl_baseline",
    "rl_evaluate",
    "rl_evaluate_many",
    "rl_prompts",
    "support",
    "value",
]

NAME = "sums"
# 64 wide, not 48: RL multiplies the worked chains' leakage off the support (mostly a "+" after a
# first digit that is not the first operand) by the think rate, and the 48-wide model leaks about
# 3 % of its chains against the 64-wide one's 1 %. The validation loss every 500 steps, not 100:
# evaluating draws no random numbers, so only the run's time changes (docs/worlds.md, sums).
PRETRAIN_DEFAULTS = {
    "steps": 3000,
    "batch_size": 128,
    "n_embd": 64,
    "n_head": 4,
    "lr": 1e-2,
    "n_lines": 56700,
    "eval_every": 500,
}
# 128 prompts a step at lr 3e-4 (was 32 at 6e-4): each step's exact evaluation (every completion
# of 567 prompts) costs more than its rollout, so four times the prompts cost little, and the think
# rate rises more slowly, with a lower malformed peak; still not always under the every-step bar,
# nor the held-out think rate over 0.8 (docs/worlds.md, sums). Thinking takes over in about 20
# steps: at most 60.
RL_DEFAULTS = {
    "prompts_per_step": 128,
    "group_size": 8,
    "steps": 60,
    "lr": 3e-4,
    "reward": "correct",
    "max_new_tokens": 28,
}
OFF_SUPPORT_PROBES = ("",)  # a completion with no answer at all
_ANSWER = re.compile(r"(?:^|\))([0-9]{1,3})\.$")  # the final answer: "9." alone or after ")"


# ---- rewards: f(prompt, completion) -> float; never raise on any completion ----------------------


def final_answer(completion: str) -> int | None:
    """The integer of the completion's answer format ("v." alone or ")v." at its end); None if
    it has none."""
    m = _ANSWER.search(completion)
    return None if m is None else int(m.group(1))


def reward_correct(prompt: str, completion: str) -> float:
    try:
        v = value(prompt)
    except ValueError:
        return 0.0
    return float(final_answer(completion) == v)


def reward_format(prompt: str, completion: str) -> float:
    well = DIRECT_FORMAT.fullmatch(completion) or WORKED_FORMAT.fullmatch(completion)
    return float(well is not None)


def reward_worked(prompt: str, completion: str) -> float:
    return float(WORKED_FORMAT.fullmatch(completion) is not None)


_REWARD_FNS = {
    "correct": reward_correct,
    "format": reward_format,
    "correct+format": lambda p, c: reward_correct(p, c) + reward_format(p, c),
    "worked": reward_worked,
}
REWARD_RANGES = {"correct": (0.0, 1.0), "format": (0.0, 1.0), "correct+format": (0.0, 2.0)}
REWARD_RANGES["worked"] = (0.0, 1.0)
REWARDS = {"sums": _REWARD_FNS.get}  # factory(name) -> reward function, or None if not ours
REWARD_HELP = {
    "correct": "1 iff the completion ends in the true sum in the answer format ('9.' or ')9.')",
    "format": "1 iff the completion is a well-formed direct ('9.') or worked answer "
    "('(3+4=7,7+2=9)9.')",
    "correct+format": "correct + format (0..2)",
    "worked": "1 iff the completion is a well-formed worked answer, right or wrong",
}


# ---- RL interface --------------------------------------------------------------------------------


def rl_prompts(cfg) -> list[str]:  # RL trains on PROMPTS, never on HELDOUT
    return list(PROMPTS)


def anchor_prompts(cfg) -> list[str]:  # no off-target prompts: no drift
    return []


def rl_baseline(model, tokenizer, cfg) -> None:
    return None


def support(prompt: str) -> list[str]:
    """The declared completions of a prompt (53 to 77: every direct answer 0-49, every worked slip):
    toy_tasks/support.py takes exact E[r] over them."""
    return completions(prompt)


def rl_evaluate(model, tokenizer, baseline: None, cfg, rewards) -> dict:
    """Exact metrics on PROMPTS (the *_heldout figures and heldout_rate, the held-out accuracy: on
    HELDOUT) from one teacher-forced pass over every declared completion: support.py's figures
    under the run's reward (target_rate, exact_reward, best_reward, pass_at_8, off_support) and
    sums_exact's (exact_accuracy, exact_think_rate, the lengths, pass@k, entropy, malformed)."""
    return rl_evaluate_many([model], tokenizer, baseline, cfg, rewards)[0]


def rl_evaluate_many(models, tokenizer, baseline: None, cfg, rewards) -> list[dict]:
    """rl_evaluate of each model (GPTs, or their weights stacked: contract.py)."""
    probs = support_probs_many(models, tokenizer, PROMPTS + HELDOUT)  # (M, P + H, K)
    train, held = probs[:, : len(PROMPTS)], probs[:, len(PROMPTS) :]
    K = rewards.support.size(1)
    out = []
    for figures, here, there in zip(
        reward_figures_many(train[..., :K], rewards.support),
        exact_figures_many(train, PROMPTS),
        exact_figures_many(held, HELDOUT),
    ):
        held_figures = {f"{k}_heldout": v for k, v in there.items()}
        out.append({**figures, **here, **held_figures, "heldout_rate": there["exact_accuracy"]})
    return out


def format_rl_eval(ev: dict, cfg) -> str:
    return (
        f"exact accuracy {ev['exact_accuracy']:.3f} (held-out {ev['heldout_rate']:.3f}) | think "
        f"rate {ev['exact_think_rate']:.3f} (held-out {ev['exact_think_rate_heldout']:.3f}) | "
        f"length {ev['exact_len_mean']:.1f} | pass@64 {ev['exact_pass_at_64']:.3f} | E[r] "
        f"{ev['exact_reward']:.3f} | malformed {ev['malformed']:.4f}"
        f"{peak_text(ev, 'malformed', 4)}"
    )
