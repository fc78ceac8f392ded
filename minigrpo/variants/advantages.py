"""Advantage baselines and scales, one table each: what GRPO's update compares each reward with.

    A = scale(r − baseline)      --baseline group | rloo | batch | remax      --adv-scale group |
                                 batch | none | gpg

Baselines (the math: objectives/advantages.py): the group mean (GRPO), leave-one-out (RLOO
2402.14740), the batch mean (REINFORCE++ 2501.03262), the reward of π_old's greedy completion (ReMax
2310.10505). Scales: the group std (GRPO; the group baseline only), one batch std, none (Dr. GRPO
2503.20783), or GPG's α = N/#(A ≠ 0) on the unscaled advantages (2504.02546). With the group
baseline, "batch" divides by the std of the RAW rewards (TRL scale_rewards="batch"); with the
others, by the std of the centred values (REINFORCE++). Also here: what the update does with the
rewards before the baseline (the random-reward control of 2506.10947, --kl-in reward's penalty) and
after it (DAPO's and REINFORCE-Rej's filter of groups whose rewards are all equal), and `signal`,
GRPO's whole first stage, rewards -> advantages and their figures, pure for a population to map.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from minigrpo.objectives.advantages import (
    batch_scaled,
    equal_groups,
    gpg_scale,
    group_advantages,
    remax_advantages,
    rloo_advantages,
)
from minigrpo.util.cli import UsageError, flag
from minigrpo.variants.kl import kl_reward_penalty


def _then_batch_std(centre: Callable) -> Callable:
    """A baseline's (rewards, scale, cfg, greedy) -> advantages, from its centring: then none or the
    batch std."""

    def advantages(r, scale, cfg, greedy):
        adv = centre(r, greedy)
        return adv if scale == "none" else batch_scaled(adv, cfg.adv_std == "unbiased", cfg.adv_eps)

    return advantages


@dataclass(frozen=True)
class Baseline:
    # (rewards (P, G), scale, cfg, greedy (P,) or None) -> (P, G), for scale group|batch|none
    advantages: Callable
    scales: tuple[str, ...]  # the --adv-scale values it takes besides gpg
    # the reward of π_old's greedy completion of each prompt (one decode a prompt)
    needs_greedy: bool = False


BASELINES = {
    "group": Baseline(
        lambda r, scale, cfg, greedy: group_advantages(
            r, scale, cfg.adv_std == "unbiased", cfg.adv_eps
        ),
        ("group", "batch", "none"),
    ),
    "rloo": Baseline(_then_batch_std(lambda r, greedy: rloo_advantages(r)), ("batch", "none")),
    "batch": Baseline(
        _then_batch_std(lambda r, greedy: (r.flatten() - r.flatten().mean()).view_as(r)),
        ("batch", "none"),
    ),
    "remax": Baseline(_then_batch_std(remax_advantages), ("batch", "none"), needs_greedy=True),
}
SCALES = ("group", "batch", "none", "gpg")
PANELS = [
    ("advantage mean / std", ["adv_mean", "adv_std"]),
    (
        "rewards in the update: random control, greedy baseline",
        ["random_reward_mean", "greedy_reward_mean"],
    ),
    ("share of equal-reward groups (lower = more signal)", ["equal_groups"]),
]


@dataclass
class AdvantageFlags:
    """advantages: baselines, scales, group filters"""

    baseline: str = flag(
        "group",
        "reward baseline: group mean, leave-one-out (rloo), batch mean, or the reward of π_old's "
        "greedy completion (remax)",
        choices=list(BASELINES),
    )
    adv_scale: str = flag(
        "group",
        "divide advantages by the group std, the batch std, or nothing; gpg: nothing, times N/#(Â "
        "≠ 0)",
        choices=list(SCALES),
    )
    adv_std: str = flag(
        "unbiased",
        "std with Bessel's correction (paper, TRL) or the population std",
        choices=["unbiased", "population"],
    )
    adv_eps: float = flag(1e-4, "ε added to the std")
    skip_equal_groups: bool = flag(
        False,
        "drop groups whose rewards are all equal (they carry no signal; DAPO's and "
        "REINFORCE-Rej's filter); a step with none left takes its updates on the preservation "
        "anchor alone",
    )
    random_reward: bool = flag(
        False,
        "a control: replace every reward by a seeded Bernoulli(0.5) draw, blind to the completion "
        "(2506.10947)",
    )


def advantages(
    rewards: torch.Tensor, cfg, greedy_rewards: torch.Tensor | None = None
) -> torch.Tensor:
    """(N,) rewards grouped G by G -> (N,) advantages by --baseline and --adv-scale; greedy_rewards
    (prompts,): ReMax's baseline."""
    r, baseline = rewards.view(-1, cfg.group_size), BASELINES[cfg.baseline]  # (prompts, G)
    if cfg.adv_scale == "gpg":  # GPG: the unscaled advantages times α = N/#(Â ≠ 0) over the batch
        adv = baseline.advantages(r, "none", cfg, greedy_rewards)
        return (adv * gpg_scale(adv)).flatten()
    return baseline.advantages(r, cfg.adv_scale, cfg, greedy_rewards).flatten()


def random_rewards(rewards: torch.Tensor, cfg, generator: torch.Generator) -> torch.Tensor | None:
    """--random-reward's rewards, which replace the sampled ones: Bernoulli(0.5) draws from their
    own stream, blind to the completions (the control of 2506.10947), shaped and typed as rewards;
    None without the flag."""
    if not cfg.random_reward:
        return None
    return torch.bernoulli(torch.full(rewards.shape, 0.5), generator=generator).to(rewards)


def kept_rows(equal: torch.Tensor, cfg) -> torch.Tensor | None:
    """--skip-equal-groups: the rows (..., N) bool of the groups whose rewards differ, from equal
    (..., prompts) bool: the groups whose rewards are all equal (leading dims: members); None
    without the flag (every row)."""
    if not cfg.skip_equal_groups:
        return None
    return (~equal).repeat_interleave(cfg.group_size, -1)


def signal(rewards, cfg, drawn, greedy, old_logp, ref_logp, mask):
    """GRPO's rewards -> (advantages (N,), equal (prompts,) bool: the groups whose rewards are all
    equal, figures {name: 0-dim tensor}). rewards (N,) grouped G by G; drawn (N,): --random-reward's
    rewards, which replace them; greedy (prompts,): ReMax's baseline; old_logp, ref_logp, mask (N,
    T): for --kl-in reward's β·Σ_t k(π_old, π_ref) off each reward (β: cfg.beta). Pure,
    the draws and the greedy decodes made by the caller: mappable over a leading member dim
    (population/grpo_update.py). GRPO.update's first stage."""
    figures = {}
    if drawn is not None:
        rewards = drawn
        figures["random_reward_mean"] = drawn.mean()
    if greedy is not None:
        figures["greedy_reward_mean"] = greedy.mean()
    if cfg.beta > 0 and cfg.kl_in == "reward":
        penalty = kl_reward_penalty(old_logp, ref_logp, mask, cfg)
        rewards = rewards - penalty
        figures["kl_reward_penalty"] = penalty.mean()
    equal = equal_groups(rewards.view(-1, cfg.group_size))
    figures["equal_groups"] = equal.float().mean()
    adv = advantages(rewards, cfg, greedy)
    figures.update(adv_mean=adv.mean(), adv_std=adv.std())
    return adv, equal, figures


def check(cfg) -> None:
    scales = BASELINES[cfg.baseline].scales
    if cfg.adv_scale != "gpg" and cfg.adv_scale not in scales:
        raise UsageError(
            f"--adv-scale {cfg.adv_scale} needs --baseline group (got {cfg.baseline}); "
            f"use --adv-scale {' or '.join(scales)}"
        )
    if cfg.random_reward and BASELINES[cfg.baseline].needs_greedy:
        raise UsageError(
            "--random-reward replaces the sampled rewards; --baseline remax would compare them "
            "with a real greedy reward: use another baseline"
        )
