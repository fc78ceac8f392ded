"""Policy losses, one table: the per-token term L_t that GRPO's --policy-loss names.

    ppo_clip  −min(ρ·Â, clip(ρ, 1−ε_low, 1+ε_high)·Â); --ratio sequence: GSPO's one ratio per
              sequence (2507.18071); --dual-clip c: verl's bound for Â < 0
              (objectives/losses.py)
    cispo     −sg(clip(ρ, 1−ε_low, 1+ε_high))·Â·log π (MiniMax-M1 2506.13585):
              --clip-low/--clip-high clamp its weight
    gmpo      −exp(mean_t clipped log ρ_t)·Â, a sequence loss (2507.20673): always reduced as the
              paper's (1/B)·Σ_i −J_i, whatever --loss-agg (which still reduces the KL and entropy
              terms)
    sapo      −(4/τ)·σ(τ(ρ − 1))·Â, a soft gate instead of the clip (2511.20347)
The math: objectives/losses.py and objectives/policy_losses.py. Each entry reads its own
hyper-parameters from the flags; the token filters and Clip-Cov / KL-Cov (variants/entropy.py) act
on the chosen loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from minigrpo.objectives.losses import clipped_surrogate
from minigrpo.objectives.policy_losses import cispo, gmpo, sapo
from minigrpo.util.cli import UsageError, flag, require
from minigrpo.variants.entropy import COV_CONTROLS, top_entropy


@dataclass(frozen=True)
class PolicyLoss:
    fn: Callable  # (logp, old_logp, adv (N, 1), mask, **hyper) -> per-token loss (N, T) to minimise
    hyper: Callable[..., dict]  # cfg -> its keyword hyper-parameters
    reduction: str | None = None  # a sequence loss's own aggregation (None: --loss-agg)


POLICY_LOSSES = {
    "ppo_clip": PolicyLoss(
        clipped_surrogate,
        lambda c: {
            "eps_low": c.clip_low,
            "eps_high": c.clip_high,
            "dual_clip": c.dual_clip,
            "level": c.ratio,
        },
    ),
    "cispo": PolicyLoss(
        cispo,
        lambda c: {
            "eps_low": c.clip_low,
            "eps_high": c.clip_low if c.clip_high is None else c.clip_high,
        },
    ),
    "gmpo": PolicyLoss(gmpo, lambda c: {"eps": c.gmpo_eps}, reduction="seq-mean-token-sum"),
    "sapo": PolicyLoss(sapo, lambda c: {"tau_pos": c.sapo_tau_pos, "tau_neg": c.sapo_tau_neg}),
}
PANELS = [
    ("clip fractions", ["clip_frac_low", "clip_frac_high"]),
    ("ratio π/π_old", ["ratio_mean", "ratio_max"]),
]


@dataclass
class PolicyLossFlags:
    """the policy loss and its clip"""

    policy_loss: str = flag(
        "ppo_clip",
        "the per-token policy loss (variants/policy_losses.py): PPO's clip, CISPO, GMPO or SAPO",
        choices=list(POLICY_LOSSES),
    )
    clip_low: float = flag(
        0.2, "ε_low: ratio clipped below at 1−ε_low (cispo: its weight's lower clamp, 1 = none)"
    )
    clip_high: float | None = flag(
        None,
        "ε_high: ratio clipped above at 1+ε_high (default ε_low; DAPO 0.28; cispo: its weight's "
        "cap, preset 4)",
    )
    dual_clip: float | None = flag(
        None, "dual-clip constant c > 1 bounding the loss for negative advantages (ppo_clip only)"
    )
    ratio: str = flag(
        "token",
        "importance ratio per token, or one per sequence (GSPO; not GSPO-token; ppo_clip only)",
        choices=["token", "sequence"],
    )
    gmpo_eps: float = flag(0.4, "GMPO: each log ρ_t clipped to (−ε, ε) (the paper's 0.4)")
    sapo_tau_pos: float = flag(1.0, "SAPO: the gate's temperature τ where Â > 0")
    sapo_tau_neg: float = flag(1.05, "SAPO: the gate's temperature τ where Â ≤ 0")


def policy_loss_per_token(logp, old_logp, adv, mask, ent, cfg, generator=None) -> torch.Tensor:
    """L_t of --policy-loss over the tokens that carry it, (N, T): `mask` narrowed by --top-entropy
    (from the entropies `ent` (N, T)), then Clip-Cov or KL-Cov when --cov-control is on (drawing
    from `generator`)."""
    mask = top_entropy(ent, mask, cfg)
    loss = POLICY_LOSSES[cfg.policy_loss]
    control = COV_CONTROLS.get(cfg.cov_control)
    hyper = {**loss.hyper(cfg), **(control.hyper if control else {})}
    per_token = loss.fn(logp, old_logp, adv[:, None], mask, **hyper)
    if control is None:
        return per_token
    return control.apply(per_token, logp, old_logp, adv, mask, cfg, generator)


def reduction(cfg) -> str:
    """How the policy loss is aggregated: the loss's own reduction, else --loss-agg."""
    return POLICY_LOSSES[cfg.policy_loss].reduction or cfg.loss_agg


def check(cfg) -> None:
    require(cfg, "dual_clip", cfg.dual_clip is None or cfg.dual_clip > 1, "> 1")
    if cfg.policy_loss != "ppo_clip" and (cfg.ratio != "token" or cfg.dual_clip is not None):
        raise UsageError(
            "--ratio sequence and --dual-clip belong to --policy-loss ppo_clip, not "
            f"{cfg.policy_loss}"
        )
