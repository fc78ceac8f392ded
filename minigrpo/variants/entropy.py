"""Token filters and entropy controls: which tokens carry the policy loss, and how the entropy is
held up.

    --fork-entropy h    only tokens where π_ref's entropy is >= h
                        (objectives/entropy_control.forking_token_mask)
    --top-entropy ρ     only the top ρ share by the CURRENT policy's entropy, chosen at every update
                        (Wang et al. 2506.01939, the 80/20 rule; TRL top_entropy_quantile)
    --cov-control       Clip-Cov: detach a random share of the high-covariance tokens the clip does
                        not already stop; KL-Cov: the unclipped −ρ·Â plus k·|log ρ_t| on the top
                        share by covariance (Cui et al. 2505.22617, verl; COV_CONTROLS). Detaching
                        keeps the token in the loss value with gradient 0, where verl multiplies by
                        0 (the same gradient).
    --entropy-coef c    an entropy bonus −c·H; with --entropy-target, Skywork-OR1's adaptive
                        coefficient (2505.22312; EntropyBonus)
The math: objectives/entropy_control.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from minigrpo.objectives.entropy_control import (
    applied_coef,
    clip_cov_mask,
    forking_token_mask,
    kl_cov_penalty,
    next_coef,
    token_covariance,
    top_entropy_mask,
)
from minigrpo.objectives.losses import aggregate, entropy
from minigrpo.util.cli import UsageError, flag


def _clip_cov(per_token, logp, old_logp, adv, mask, cfg, generator):
    """Detach the policy loss of a random --cov-ratio share of the tokens with c_t in
    [--clip-cov-low, -high] that the clip does not already stop (verl's clip_by_origin)."""
    cov = token_covariance(logp, adv, mask)
    ratio, a = (logp - old_logp).detach().exp(), adv[:, None]
    high = 1 + (cfg.clip_low if cfg.clip_high is None else cfg.clip_high)
    stopped = ((a > 0) & (ratio > high)) | ((a < 0) & (ratio < 1 - cfg.clip_low))
    chosen = clip_cov_mask(
        cov, mask, cfg.cov_ratio, cfg.clip_cov_low, cfg.clip_cov_high, generator, stopped
    )
    return torch.where(chosen, per_token.detach(), per_token)


def _kl_cov(per_token, logp, old_logp, adv, mask, cfg, generator):
    """+ k·|log ρ_t| on the top --cov-ratio share of tokens by c_t."""
    cov = token_covariance(logp, adv, mask)
    return per_token + kl_cov_penalty(logp, old_logp, cov, mask, cfg.cov_ratio, cfg.kl_cov_coef)


@dataclass(frozen=True)
class CovControl:
    apply: object  # (per_token, logp, old_logp, adv (N,), mask, cfg, generator) -> per_token (N, T)
    hyper: dict  # overrides of the policy loss's hyper-parameters (KL-Cov drops the clip)


COV_CONTROLS = {
    "clip_cov": CovControl(_clip_cov, {}),
    "kl_cov": CovControl(_kl_cov, {"eps_low": math.inf, "eps_high": math.inf, "dual_clip": None}),
}
PANELS = [
    ("entropy per token", ["entropy", "entropy_rollout"]),
    ("adaptive entropy coefficient", ["entropy_coef", "entropy_coef_applied"]),
]


@dataclass
class EntropyFlags:
    """token filters and entropy controls"""

    entropy_coef: float = flag(
        0.0, "entropy bonus weight (with --entropy-target: the adaptive coefficient's start)"
    )
    entropy_target: float | None = flag(
        None,
        "adaptive entropy control (Skywork-OR1), a target token entropy in nats: the bonus "
        "coefficient rises by --entropy-step each step the rollout's entropy is below it, falls "
        "while above, acts only at or below it (default off)",
    )
    entropy_step: float = flag(
        1e-4,
        "adaptive entropy control: the coefficient's change per step (Skywork-OR1's script: 1e-4)",
    )
    entropy_coef_max: float = flag(
        0.005,
        "adaptive entropy control: the coefficient stays in [0, this] (Skywork-OR1's script: "
        "0.005)",
    )
    fork_entropy: float = flag(
        0.0,
        "only tokens where π_ref's entropy is >= this (nats) carry the policy loss (0 = all; "
        "entropy_control.forking_token_mask)",
    )
    top_entropy: float = flag(
        1.0,
        "ρ: only the top ρ share of tokens by the CURRENT policy's entropy carry the policy loss "
        "(80/20 rule: 0.2; 1 = all)",
    )
    cov_control: str = flag(
        "none",
        "Clip-Cov (detach a random share of high-covariance tokens) or KL-Cov (unclipped loss + "
        "k·|log ρ| on the top share by covariance) (ppo_clip, token ratio)",
        choices=["none", *COV_CONTROLS],
    )
    cov_ratio: float = flag(
        2e-4,
        "Clip-Cov / KL-Cov: the share of valid tokens selected (at least one; the paper's 2e-4)",
    )
    clip_cov_low: float = flag(1.0, "Clip-Cov: candidates have covariance >= this")
    clip_cov_high: float = flag(5.0, "Clip-Cov: candidates have covariance <= this")
    kl_cov_coef: float = flag(1.0, "KL-Cov: k, the weight of |log ρ| on the selected tokens")


def fork_mask(ref_logits: torch.Tensor, mask: torch.Tensor, cfg) -> torch.Tensor:
    """--fork-entropy: the valid tokens where π_ref had a real choice (all of `mask` when off)."""
    if not cfg.fork_entropy:
        return mask
    return forking_token_mask(entropy(ref_logits), mask, cfg.fork_entropy)


def top_entropy(ent: torch.Tensor, mask: torch.Tensor, cfg) -> torch.Tensor:
    """--top-entropy ρ < 1: the top ρ share of `mask` by the current policy's entropy (all of it at
    ρ = 1)."""
    return top_entropy_mask(ent.detach(), mask, cfg.top_entropy) if cfg.top_entropy < 1 else mask


class EntropyBonus:
    """The coefficient of the entropy bonus: --entropy-coef, or with --entropy-target Skywork-OR1's
    adaptive c_k (2505.22312): step k's bonus α_k = c_k·1[e_k ≤ target] from the rollout's mean
    token entropy e_k under π_old, then c_{k+1} = clip(c_k ± Δ, 0, max) toward the target. Its state
    (c_k) goes into the checkpoint."""

    def __init__(self, cfg):
        self.cfg, self.coef = cfg, cfg.entropy_coef

    @torch.no_grad()
    def for_step(self, logits: torch.Tensor, mask: torch.Tensor) -> tuple:
        """-> (the config this step's loss uses (entropy_coef α_k), the figures e_k, c_k, α_k)."""
        cfg = self.cfg
        if cfg.entropy_target is None:
            return cfg, {}
        e = aggregate(entropy(logits), mask, "token-mean").item()
        alpha = applied_coef(self.coef, e, cfg.entropy_target)
        figures = dict(entropy_rollout=e, entropy_coef=self.coef, entropy_coef_applied=alpha)
        self.coef = next_coef(
            self.coef, e, cfg.entropy_target, cfg.entropy_step, 0.0, cfg.entropy_coef_max
        )
        return replace(cfg, entropy_coef=alpha), figures


def check(cfg) -> None:
    if cfg.cov_control != "none" and (cfg.policy_loss != "ppo_clip" or cfg.ratio != "token"):
        raise UsageError(
            f"--cov-control {cfg.cov_control} acts on --policy-loss ppo_clip with --ratio token "
            f"(Cui et al.'s loss), got {cfg.policy_loss} with --ratio {cfg.ratio}"
        )
    if cfg.clip_cov_low > cfg.clip_cov_high:
        raise UsageError(
            f"--clip-cov-low {cfg.clip_cov_low} is above --clip-cov-high {cfg.clip_cov_high}"
        )
