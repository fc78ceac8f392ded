"""What a task module must provide, written down (toy_tasks/food.py and arithmetic.py implement it).

A task is a module, not a class; `Task` lists the module-level names the CLIs use, so a type checker
(and a reader) can see the whole contract in one place.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch


class Task(Protocol):
    NAME: str
    BLOCK_SIZE: int  # longest sequence a model of this task must handle (BOS + line + EOS)
    ALPHABET: str  # every character the task's text uses
    # pretrain flags whose defaults differ for this task (explicit flags win)
    PRETRAIN_DEFAULTS: dict
    RL_DEFAULTS: dict  # likewise for grpo and ppo
    # prefix -> factory(name)
    REWARDS: dict[str, Callable[[str], Callable[[str, str], float] | None]]
    REWARD_HELP: dict[str, str]  # reward name -> one line for --help and error messages
    # completions outside the support that value its off-support mass
    OFF_SUPPORT_PROBES: tuple[str, ...]

    def make_corpus(self, n_lines: int, seed: int) -> list[str]:
        """Pretraining lines drawn from the declared distribution."""

    def entropy_floor(self) -> float:
        """The best loss any model can reach, nats per predicted token."""

    def pretrain_report(self, model, tokenizer) -> dict:
        """Exact quality figures after pretraining; must hold a bool under "ok" (the bar is met)."""

    def format_report(self, report: dict) -> str: ...

    def rl_prompts(self, cfg) -> list[str]:
        """The prompts RL trains on (food: the target person's; arithmetic: all but the
        held-out)."""

    def anchor_prompts(self, cfg) -> list[str]:
        """Off-target prompts whose behaviour preservation keeps ([] = none)."""

    def support(self, prompt: str) -> list[str]:
        """The enumerable well-formed completions of a prompt: exact E[r] is taken over them
        (toy_tasks/support.py)."""

    def rl_baseline(self, model, tokenizer, cfg) -> Any:
        """Measured once before RL on π_ref (food: every person's distribution); saved in
        checkpoints."""

    def rl_evaluate(self, model, tokenizer, baseline: Any, cfg, rewards: torch.Tensor) -> dict:
        """Exact metrics now. Numbers go to metrics.jsonl; required: target_rate, exact_reward,
        best_reward, off_support, malformed; worst_drift only where the task has off-target prompts;
        heldout_rate where it has held-out prompts. Non-numbers (e.g. food's "shares") go to
        summary.json."""

    def rl_evaluate_many(
        self, models: Any, tokenizer, baseline: Any, cfg, rewards: torch.Tensor
    ) -> list[dict]:
        """Optional: rl_evaluate of each of M models as one computation, one dict each. models: a
        list of GPTs, or the M models' weights stacked (lm/model.Weights of (M, ...) tensors:
        scored by lm/logprobs.completion_logprobs in one forward). Without it, a caller calls
        rl_evaluate model by model."""

    def format_rl_eval(self, ev: dict, cfg) -> str:
        """The last line of an RL run."""
