"""PPO's minibatch objective and the figures a run logs of it: one definition, which a single run
calls on its tensors and P stacked runs map over their leading dim with torch.func.vmap (both in
ppo.PPO.figures).

    loss, figures = ppo_objective(logp, old_logp, adv, logits, ref_logits, mask, cfg)
    loss, figures = ppo_objective(..., cfg, values, old_values, returns)  # a critic's fit too
    # cfg: clip ε, entropy_coef c_H, vf_clip c_V (None: unclipped), vf_coef c_v (ppo.PPOConfig)

    L = token-mean(−min(ρ·A, clip(ρ, 1 ± ε)·A)) − c_H · token-mean(H(π_θ(·|s_t)))
        + c_v · token-mean(½ max((V − R)², (clip(V, V_old ± c_V) − R)²))        (with values)

Shapes: logp, old_logp, adv, mask, values, old_values, returns (N, T); logits, ref_logits (N, T, V).
The figures are 0-dim tensors, so the function maps over a leading member dim (no .item(), no
branch on data): policy_loss, entropy, kl_exact (the exact per-token KL(π_θ‖π_ref), token mean),
the surrogate's clip fractions, approx KL and max ratio (losses.surrogate_stats), and with values
value_loss and value_clip_frac (the share of real tokens whose value moved past ±c_V, in float64 as
a Python division of two counts). Sources: Schulman et al. 2017 (PPO); the value clip as PPO2's
baselines and cleanrl.
"""

from __future__ import annotations

import torch

from minigrpo.objectives.kl import exact
from minigrpo.objectives.losses import (
    aggregate,
    clipped_surrogate,
    entropy,
    surrogate_stats,
    value_loss,
)


def ppo_objective(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    mask: torch.Tensor,
    cfg,
    values: torch.Tensor | None = None,
    old_values: torch.Tensor | None = None,
    returns: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-> (the minibatch's loss L, its figures). See the module docstring."""
    mean = lambda x: aggregate(x, mask, "token-mean")
    pg_loss = mean(clipped_surrogate(logp, old_logp, adv, mask, cfg.clip))
    ent = mean(entropy(logits))
    loss = pg_loss - cfg.entropy_coef * ent
    if values is not None:
        vf_loss = mean(value_loss(values, old_values, returns, mask, cfg.vf_clip))
        loss = loss + cfg.vf_coef * vf_loss
    with torch.no_grad():
        figures = {
            "policy_loss": pg_loss,
            "entropy": ent,
            "kl_exact": mean(exact(logits, ref_logits)),
            **surrogate_stats(logp, old_logp, adv, mask, cfg.clip),
        }
        if values is not None:
            limit = float("inf") if cfg.vf_clip is None else cfg.vf_clip
            moved = ((values - old_values).abs() > limit) & mask
            figures["value_loss"] = vf_loss
            figures["value_clip_frac"] = moved.sum().double() / mask.sum().clamp(min=1)
    return loss, figures
