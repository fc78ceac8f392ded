"""Loss terms: the clipped surrogate and its diagnostics, the aggregation over tokens, entropy,
value loss.

    clipped_surrogate  PPO's clipped objective per token (Schulman et al. 2017, 1707.06347 eq. 7),
                       with DAPO's clip-higher (2503.14476 §3.1), verl's dual clip (Ye et al. 2019,
                       1912.09729, "Mastering complex control in MOBA games") and GSPO's
                       sequence-level ratio (2507.18071 §4.1)
    surrogate_stats    clip fractions, ratio statistics and the KL(π_old‖π_θ) estimate, for logging
    aggregate          the four reductions seen in practice (GRPO paper, DAPO, seq-sum, Dr. GRPO)
    entropy            per-position entropy of the next-token distribution
    value_loss         PPO's (optionally clipped) value loss

Masks: every masked quantity goes through torch.where, never a multiplication by the mask (0·NaN =
NaN, and a NaN in the unused branch of a product poisons the gradient): NaN or ±1e4 in a masked slot
reaches neither a value nor a gradient.

Departures: the log-ratio log π_θ − log π_old is clamped to ±kl.LOG_RATIO_CLAMP = 20 before exp so ρ
stays finite (set it to math.inf to remove; beyond ±20 the gradient is 0). eps_high defaults to
eps_low (the symmetric PPO/GRPO clip; DAPO uses 0.28). dual_clip is off by default (verl uses c =
3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minigrpo.objectives.kl import LOG_RATIO_CLAMP, k3  # one clamp for every log-ratio (kl.py)

LEVELS = ("token", "sequence")


def zero_like(x: torch.Tensor) -> torch.Tensor:
    """A 0-dim zero of x's dtype and device: the masked value of every torch.where here."""
    return torch.zeros((), dtype=x.dtype, device=x.device)


def masked_inputs(logp, old_logp, advantages, mask, level="token"):
    """The inputs every ratio-based loss shares: (mask, A, log ρ), each (B, T) with masked slots 0.

    mask None = all valid; advantages (B,), (B, 1) or (B, T). log ρ is log π_θ − log π_old per
    token, or with level="sequence" GSPO's per-row mean of it over the valid tokens, broadcast to
    each valid token (the gradient reaches every token through the mean); clamped to
    ±LOG_RATIO_CLAMP so exp stays finite.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if mask is None:
        mask = torch.ones_like(logp, dtype=torch.bool)
    if advantages.dim() == 1:
        advantages = advantages[:, None]  # (B,) -> (B, 1)
    adv = torch.where(mask, advantages.expand_as(logp), zero_like(logp))  # (B, T)
    log_ratio = torch.where(mask, logp - old_logp, zero_like(logp))  # (B, T)
    if level == "sequence":
        n_valid = mask.sum(dim=1, keepdim=True).clamp(min=1)  # (B, 1); an empty row stays 0
        seq_log_ratio = log_ratio.sum(dim=1, keepdim=True) / n_valid  # (B, 1): log s_i
        log_ratio = torch.where(mask, seq_log_ratio.expand_as(log_ratio), zero_like(logp))
    return mask, adv, log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _bounds(eps_low, eps_high):
    """(1 − ε_low, 1 + ε_high), ε_high defaulting to ε_low."""
    return 1 - eps_low, 1 + (eps_low if eps_high is None else eps_high)


def clipped_surrogate(
    logp, old_logp, advantages, mask=None, eps_low=0.2, eps_high=None, dual_clip=None, level="token"
) -> torch.Tensor:
    """Per-token loss to MINIMISE  L = −min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A),  (B, T).

    logp, old_logp: (B, T) log-probs of the sampled tokens under π_θ and π_old; advantages (B,), (B,
    1) or (B, T); mask (B, T) bool, None = all valid.
    ρ = exp(log π_θ − log π_old) per token (PPO eq. 7, GRPO eq. 3), or with level="sequence" GSPO's
    s_i = exp((1/|o_i|) Σ_t log ρ_i,t), the same for every token of row i (GSPO §4.1).
    eps_high: upper clip, defaults to eps_low; larger = DAPO's clip-higher.
    dual_clip = c > 1: for A < 0 the objective becomes max(min(ρA, clip(ρ)A), c·A), so the loss is
    at most c·|A| however large ρ grows (verl's dual-clip PPO).
    The gradient is exactly 0 where the clip acts: A > 0 and ρ > 1+ε_high, or A < 0 and ρ < 1−ε_low.
    At ρ = 1 it is −A per token. Masked positions: loss 0 and no gradient.
    """
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1 (verl uses 3), got {dual_clip}")
    mask, adv, log_ratio = masked_inputs(logp, old_logp, advantages, mask, level)
    low, high = _bounds(eps_low, eps_high)
    ratio = log_ratio.exp()  # ρ (B, T)
    pg_obj1 = ratio * adv  # unclipped
    pg_obj2 = ratio.clamp(low, high) * adv  # clipped to [1 − ε_low, 1 + ε_high]
    objective = torch.minimum(pg_obj1, pg_obj2)  # pessimistic bound
    if dual_clip is not None:
        objective = torch.where(adv < 0, torch.maximum(objective, dual_clip * adv), objective)
    return torch.where(mask, -objective, zero_like(objective))


@torch.no_grad()
def surrogate_stats(
    logp, old_logp, advantages, mask=None, eps_low=0.2, eps_high=None, level="token"
) -> dict[str, torch.Tensor]:
    """Diagnostics of clipped_surrogate over the valid tokens, as 0-dim tensors (no grad).

    clip_frac_low   share of valid tokens with A < 0 and ρ < 1−ε_low  (clipped from below)
    clip_frac_high  share of valid tokens with A > 0 and ρ > 1+ε_high (clipped from above)
                    together: exactly the tokens whose gradient the clip sets to 0
    ratio_mean, ratio_max   of ρ (the sequence ratio s_i with level="sequence")
    approx_kl       mean of k3 with π_old as the sampler: (ρ − 1) − log ρ, an unbiased, non-negative
                    estimate of KL(π_old‖π_θ) (cleanrl's approx_kl); always per token, whatever
                    level.
    A batch with no valid token gives 0 everywhere.
    """
    mask, adv, log_ratio = masked_inputs(logp, old_logp, advantages, mask, level)
    low, high = _bounds(eps_low, eps_high)
    ratio = log_ratio.exp()
    n_valid = mask.sum().clamp(min=1).to(ratio.dtype)
    clipped_low = mask & (adv < 0) & (ratio < low)
    clipped_high = mask & (adv > 0) & (ratio > high)
    valid_ratio = torch.where(mask, ratio, zero_like(ratio))
    old_v = torch.where(mask, old_logp, zero_like(ratio))
    new_v = torch.where(mask, logp, zero_like(ratio))
    return {
        "clip_frac_low": clipped_low.sum() / n_valid,
        "clip_frac_high": clipped_high.sum() / n_valid,
        "ratio_mean": valid_ratio.sum() / n_valid,
        "ratio_max": valid_ratio.max(),
        "approx_kl": k3(old_v, new_v).sum() / n_valid,
    }  # k3(sampler=π_old, reference=π_θ)


# ---- aggregation: per-token (B, T) -> scalar. x arrives with masked slots already 0. ----


def _seq_mean_token_mean(x, mask, max_len):  # GRPO paper eq. 3: (1/B) Σ_i (1/|o_i|) Σ_t x_it
    return (x.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()


def _token_mean(x, mask, max_len):  # DAPO §3.3: Σ_it x_it / Σ_i |o_i|
    return x.sum() / mask.sum().clamp(min=1)


def _seq_mean_token_sum(x, mask, max_len):  # (1/B) Σ_i Σ_t x_it
    return x.sum(dim=1).mean()


def _seq_mean_token_sum_norm(x, mask, max_len):  # Dr. GRPO: Σ_it x_it / (B · max_len)
    return x.sum() / (x.size(0) * max_len)


_AGGREGATORS = {
    "seq-mean-token-mean": _seq_mean_token_mean,
    "token-mean": _token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}
AGG_MODES = tuple(_AGGREGATORS)


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, mode: str, max_len: int | None = None
) -> torch.Tensor:
    """Reduce a per-token loss (B, T) over its valid tokens (mask (B, T) bool) to a scalar.

    mode                       formula                      source; per-token gradient weight
    "seq-mean-token-mean"      (1/B) Σ_i (1/|o_i|) Σ_t x    GRPO (DeepSeekMath eq. 3); 1/(B·|o_i|)
    "token-mean"               Σ_i Σ_t x / Σ_i |o_i|        DAPO §3.3; 1/Σ|o| (every token equal)
    "seq-mean-token-sum"       (1/B) Σ_i Σ_t x              1/B
    "seq-mean-token-sum-norm"  Σ_i Σ_t x / (B · max_len)    Dr. GRPO §3.1; 1/(B·max_len), constant
    max_len defaults to T (the padded width): pass the generation limit to make it a true constant.
    A fully masked row sums to 0 and still counts as one of the B rows (|o_i| is floored at 1 so it
    gives no 0/0); in "token-mean" it adds no tokens, and an all-masked batch gives 0.
    """
    if mode not in _AGGREGATORS:
        raise ValueError(
            f"unknown aggregation mode {mode!r}; choose one of: {', '.join(AGG_MODES)}"
        )
    x = torch.where(mask, per_token, zero_like(per_token))
    return _AGGREGATORS[mode](x, mask, per_token.size(1) if max_len is None else max_len)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = −Σ_v p_v log p_v with p = softmax(logits), (..., V) -> (...).

    0 ≤ H ≤ log V (= log V for uniform logits); from log_softmax, so finite at logits ±1e4.
    """
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def value_loss(values, old_values, returns, mask, clip=None) -> torch.Tensor:
    """PPO's value loss per token, (B, T) -> (B, T); aggregate it with `aggregate`.

    clip=None:  ½ (V − R)²
    clip=c:     ½ max((V − R)², (clip(V, V_old − c, V_old + c) − R)²)   (PPO2 baselines, cleanrl)
    The max makes it pessimistic: clipping only ever increases the loss. Masked positions: 0, no
    grad.
    """
    zero = zero_like(values)
    v = torch.where(mask, values, zero)
    ret = torch.where(mask, returns, zero)
    loss_unclipped = (v - ret) ** 2
    if clip is None:
        loss = loss_unclipped
    else:
        v_old = torch.where(mask, old_values, zero)
        v_clipped = v_old + (v - v_old).clamp(-clip, clip)  # = clip(V, V_old − c, V_old + c)
        loss = torch.maximum(loss_unclipped, (v_clipped - ret) ** 2)
    return torch.where(mask, 0.5 * loss, zero)
