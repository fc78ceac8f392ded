"""Loss terms: the clipped surrogate, its aggregation over tokens and sequences, entropy, value loss.

    clipped_surrogate  PPO's clipped objective (Schulman et al. 2017, eq. 7) per token, with DAPO's
                       clip-higher (2503.14476 §3.1), dual-clip (Ye et al. 2019; verl) and GSPO's
                       sequence-level ratio (2507.18071 §4)
    aggregate          the four reductions seen in practice (REFERENCE.md §3)
    entropy, value_loss
Masked positions never reach a value or a gradient, even if they hold NaN or ±1e4: every masked
quantity goes through torch.where, never a multiplication by the mask (0 · NaN = NaN).
Departure: the log-ratio is clamped to ±20 before exp so ρ stays finite.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOG_RATIO_CLAMP = 20.0
AGG_MODES = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def _zero(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def _log_ratio(logp, old_logp, mask, level: str) -> torch.Tensor:
    """log ρ (B, T): per token log π_θ − log π_old, or GSPO's per-sequence mean of it over valid tokens
    broadcast to every token of the row. Masked positions are 0."""
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    if mask is None:
        mask = torch.ones_like(logp, dtype=torch.bool)
    lr = torch.where(mask, logp - old_logp, _zero(logp))  # (B, T)
    if level == "sequence":
        n = mask.sum(dim=1, keepdim=True).clamp(min=1)  # (B, 1)
        lr = torch.where(mask, (lr.sum(dim=1, keepdim=True) / n).expand_as(lr), _zero(lr))
    return lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _broadcast_adv(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if advantages.dim() == 1:
        advantages = advantages[:, None]  # (B,) -> (B, 1)
    return advantages.expand_as(like)


def clipped_surrogate(logp, old_logp, advantages, mask=None, eps_low=0.2, eps_high=None, dual_clip=None,
                      level="token") -> torch.Tensor:
    """Per-token loss to MINIMISE:  −min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A)   (B, T).

    ρ = exp(log π_θ − log π_old) per token, or with level="sequence" GSPO's s_i = exp(mean_t log ρ_i,t)
    for every token of row i. logp, old_logp (B, T); advantages (B,), (B, 1) or (B, T); mask (B, T)
    bool. eps_high defaults to eps_low (DAPO's clip-higher when larger). dual_clip = c > 1: for A < 0
    the objective is max(min(ρA, clip(ρ)A), c·A), so the loss is at most c·|A| (Ye et al. 2019).
    Gradient is exactly 0 where the clip is active (A > 0, ρ > 1+ε_high; A < 0, ρ < 1−ε_low).
    Masked positions: loss 0 and no gradient.
    """
    eps_high = eps_low if eps_high is None else eps_high
    mask = torch.ones_like(logp, dtype=torch.bool) if mask is None else mask
    adv = torch.where(mask, _broadcast_adv(advantages, logp), _zero(logp))
    ratio = torch.exp(_log_ratio(logp, old_logp, mask, level))  # (B, T)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * adv
    objective = torch.minimum(unclipped, clipped)
    if dual_clip is not None:
        objective = torch.where(adv < 0, torch.maximum(objective, dual_clip * adv), objective)
    return torch.where(mask, -objective, _zero(objective))


@torch.no_grad()
def surrogate_stats(logp, old_logp, advantages, mask=None, eps_low=0.2, eps_high=None, level="token") -> dict:
    """Diagnostics over valid tokens (0-dim tensors): clip_frac_low (A < 0, ρ < 1−ε_low), clip_frac_high
    (A > 0, ρ > 1+ε_high) — exactly the tokens whose gradient the clip zeroes —, ratio_mean, ratio_max,
    and approx_kl = mean of ½(log ρ)² (the k2 estimate of KL(π_old‖π_θ), as cleanrl logs)."""
    eps_high = eps_low if eps_high is None else eps_high
    mask = torch.ones_like(logp, dtype=torch.bool) if mask is None else mask
    adv = _broadcast_adv(advantages, logp)
    log_ratio = _log_ratio(logp, old_logp, mask, level)
    ratio = log_ratio.exp()
    n = mask.sum().clamp(min=1).to(ratio.dtype)
    low = mask & (adv < 0) & (ratio < 1 - eps_low)
    high = mask & (adv > 0) & (ratio > 1 + eps_high)
    return {"clip_frac_low": low.sum() / n, "clip_frac_high": high.sum() / n,
            "ratio_mean": torch.where(mask, ratio, _zero(ratio)).sum() / n,
            "ratio_max": torch.where(mask, ratio, _zero(ratio)).max(),
            "approx_kl": torch.where(mask, 0.5 * log_ratio ** 2, _zero(ratio)).sum() / n}


def _seq_mean_token_mean(x, mask, max_len):  # GRPO paper: (1/B) Σ_i (1/|o_i|) Σ_t x_it
    per_seq = x.sum(1) / mask.sum(1).clamp(min=1)
    return per_seq.mean()


def _token_mean(x, mask, max_len):  # DAPO: Σ_it x_it / Σ_i |o_i|
    return x.sum() / mask.sum().clamp(min=1)


def _seq_mean_token_sum(x, mask, max_len):  # (1/B) Σ_i Σ_t x_it
    return x.sum(1).mean()


def _seq_mean_token_sum_norm(x, mask, max_len):  # Dr. GRPO: Σ_it x_it / (B · max_len)
    return x.sum() / (x.size(0) * max_len)


_AGGREGATORS = dict(zip(AGG_MODES, (_seq_mean_token_mean, _token_mean, _seq_mean_token_sum, _seq_mean_token_sum_norm)))


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, max_len: int | None = None) -> torch.Tensor:
    """Reduce a per-token loss (B, T) over its valid tokens (mask (B, T) bool) to a scalar.

    "seq-mean-token-mean"      (1/B) Σ_i (1/|o_i|) Σ_t x    GRPO paper (DeepSeekMath eq. 3)
    "token-mean"               Σ x / Σ_i |o_i|             DAPO §3.3 (every token weighs the same)
    "seq-mean-token-sum"       (1/B) Σ_i Σ_t x
    "seq-mean-token-sum-norm"  Σ x / (B · max_len)         Dr. GRPO §3.2 (max_len defaults to T)
    A fully masked row contributes 0 to every sum; it still counts in B (no NaN: |o_i| is floored at 1).
    """
    if mode not in _AGGREGATORS:
        raise ValueError(f"unknown loss aggregation {mode!r} (available: {', '.join(AGG_MODES)})")
    x = torch.where(mask, per_token, _zero(per_token))
    return _AGGREGATORS[mode](x, mask, max_len if max_len is not None else per_token.size(1))


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = −Σ_v p_v log p_v per position: (..., V) -> (...); 0 ≤ H ≤ log V, finite at logits ±1e4."""
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def value_loss(values, old_values, returns, mask, clip=None) -> torch.Tensor:
    """PPO's value loss per token (B, T): ½(V − R)², or with clip = c
    ½·max((V − R)², (clip(V, V_old − c, V_old + c) − R)²)   (PPO2 / cleanrl; InstructGPT's critic).
    Masked positions: 0 and no gradient."""
    zero = _zero(values)
    v = torch.where(mask, values, zero)
    r = torch.where(mask, returns, zero)
    loss = (v - r) ** 2
    if clip is not None:
        v_old = torch.where(mask, old_values, zero)
        v_clipped = v_old + (v - v_old).clamp(-clip, clip)
        loss = torch.maximum(loss, (v_clipped - r) ** 2)
    return torch.where(mask, 0.5 * loss, zero)
