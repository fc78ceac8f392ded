"""Sampler-trainer mismatch: the sampling engine's π_sampler is not quite the trainer's π_old.

The completions come from π_sampler (another kernel, another precision, top-p/top-k truncation),
while the loss treats them as samples of π_old, the trainer's own log-probs of the same tokens. An
importance weight w = π_old/π_sampler per token (or per sequence) corrects the expectation; the two
corrections in use bound it:

    tis_weights   truncated IS: min(w, C)                        (Yao et al. 2025, "Your efficient
                  RL framework
                                                                  secretly brings you off-policy RL
                                                                  training")
    mis_weights   masked IS: w·1[C_min ≤ w ≤ C_max], tokens (or    (IcePop, Ring-1T 2510.18855;
                  verl's rollout whole sequences) outside the band are dropped    correction, TRL
                  vllm_importance_sampling_mode)

level="token": w_t = π_old(o_t)/π_sampler(o_t) per token. level="sequence": w = Π_t w_t over the
row's valid tokens, computed in log space (Σ_t log w_t, then exp and cap; MIS tests the band on the
logs), and put on every valid token of the row. Shapes: old_logp, sampler_logp (B, T), mask (B, T)
bool, None = all valid -> weights (B, T), masked slots 0. The weights carry no gradient (they
multiply a per-token loss as constants), and NaN or ±1e4 in masked slots reach nothing. Equal
sampler and trainer log-probs give weights of exactly 1.

`correction` is what GRPO's --is-correction calls (a table of the two, no if/elif): the weights and
the figures a run logs (the mean weight, the share of tokens capped or masked, the sampler's KL).
"""

from __future__ import annotations

import math

import torch

LEVELS = ("token", "sequence")


def _log_weights(old_logp, sampler_logp, mask, level):
    """(mask, log w) with log w (B, T): log π_old − log π_sampler per token, or its row sum on each
    valid token."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if mask is None:
        mask = torch.ones_like(old_logp, dtype=torch.bool)
    zero = torch.zeros((), dtype=old_logp.dtype, device=old_logp.device)
    log_w = torch.where(mask, old_logp.detach() - sampler_logp.detach(), zero)  # (B, T)
    if level == "sequence":
        # log Π_t w_t
        log_w = torch.where(mask, log_w.sum(dim=1, keepdim=True).expand_as(log_w), zero)
    return mask, log_w


def tis_weights(old_logp, sampler_logp, mask=None, cap=2.0, level="token") -> torch.Tensor:
    """Truncated importance weights  min(π_old/π_sampler, C),  (B, T) -> (B, T), masked slots 0.

    Token level: min(w_t, C). Sequence level: min(Π_t w_t, C) over the row's valid tokens, on each
    of them. The product is a sum of logs; its exp may overflow to inf, which the min then turns
    into exactly C (an underflow gives 0): never inf or NaN, and never above C. cap ≥ 1 (verl's
    default 2); a cap below 1 would down-weight tokens the two policies agree on, and is refused.
    """
    if not cap >= 1:
        raise ValueError(f"cap must be >= 1 (a weight of 1 must pass), got {cap}")
    mask, log_w = _log_weights(old_logp, sampler_logp, mask, level)
    capped = log_w.exp().clamp(max=cap)  # exp(Σ log w_t) = Π w_t; inf -> C
    return torch.where(mask, capped, torch.zeros_like(capped))


def mis_weights(
    old_logp, sampler_logp, mask=None, low=0.5, high=2.0, level="token"
) -> torch.Tensor:
    """Masked importance weights  w·1[C_min ≤ w ≤ C_max],  (B, T) -> (B, T), masked slots 0.

    w = π_old/π_sampler per token, or Π_t w_t for the whole row (level="sequence"). Outside [low,
    high] the token (or the whole sequence) gets weight 0: IcePop's masking of mismatched tokens
    (Ring-1T, arXiv 2510.18855), verl's rollout rejection sampling. The band test is done on the
    logs, so a huge product is rejected without ever being exponentiated. Defaults [0.5, 2],
    symmetric in log space; low ≤ 1 ≤ high keeps a weight of 1.
    """
    if not 0 <= low <= high:
        raise ValueError(f"need 0 <= low <= high, got low={low}, high={high}")
    mask, log_w = _log_weights(old_logp, sampler_logp, mask, level)
    log_low = math.log(low) if low > 0 else -math.inf
    keep = mask & (log_w >= log_low) & (log_w <= math.log(high))
    zero = torch.zeros_like(log_w)
    # exp only of kept, finite log-weights
    return torch.where(keep, torch.where(keep, log_w, zero).exp(), zero)


def _band_share(log_w, mask, low, high):
    """Share of the valid tokens whose (token or sequence) weight lies outside [low, high] (no cap:
    high = inf)."""
    log_low = math.log(low) if low > 0 else -math.inf
    out = mask & ((log_w < log_low) | (log_w > math.log(high)))
    return out.sum() / mask.sum().clamp(min=1)


# kind -> (its weights from (old_logp, sampler_logp, mask, level, cap, band), the logged share, that
# share's test)
CORRECTIONS = {
    "tis": (
        lambda o, s, m, level, cap, band: tis_weights(o, s, m, cap, level),
        "is_capped",
        lambda log_w, m, cap, band: _band_share(log_w, m, 0.0, cap),
    ),
    "mis": (
        lambda o, s, m, level, cap, band: mis_weights(o, s, m, band[0], band[1], level),
        "is_masked",
        lambda log_w, m, cap, band: _band_share(log_w, m, *band),
    ),
}


@torch.no_grad()
def correction(kind, old_logp, sampler_logp, mask, level="token", cap=2.0, band=(0.5, 2.0)):
    """--is-correction `kind` ("none", "tis" or "mis") -> (weights (B, T) or None for "none",
    stats).

    stats (floats): sampler_kl = the token mean of log π_sampler − log π_old, the sampled (k1)
    estimate of KL(π_sampler‖π_old) per token, logged with every kind; with a correction,
    is_weight_mean = the mean weight over the valid tokens and is_capped (tis: the raw weight above
    C) or is_masked (mis: outside the band) = the share of valid tokens (of the tokens of whole rows
    at level "sequence") it changed.
    """
    n = mask.sum().clamp(min=1)
    stats = {"sampler_kl": (torch.where(mask, sampler_logp - old_logp, 0.0).sum() / n).item()}
    if kind == "none":
        return None, stats
    weights_fn, share_name, share_fn = CORRECTIONS[kind]
    w = weights_fn(old_logp, sampler_logp, mask, level, cap, band)
    _, log_w = _log_weights(old_logp, sampler_logp, mask, level)
    stats.update(
        {
            "is_weight_mean": (w.sum() / n).item(),
            share_name: share_fn(log_w, mask, cap, band).item(),
        }
    )
    return w, stats
