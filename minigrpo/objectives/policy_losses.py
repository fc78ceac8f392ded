"""Policy losses beside PPO's clip, one signature (the table that names them:
variants/policy_losses.py):

    loss(logp, old_logp, advantages, mask, **hyper) -> per-token loss (B, T) to MINIMISE

    "ppo_clip"  losses.clipped_surrogate itself: −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A) (PPO, GRPO,
                DAPO, GSPO)
    "cispo"     −sg(clip(ρ, 1−ε_low, 1+ε_high))·A·log π_θ: clipped tokens keep a gradient
                (MiniMax-M1 2506.13585)
    "gmpo"      −exp(mean_t clipped log ρ_t)·A, the geometric mean of the ratios, per sequence (GMPO
                2507.20673)
    "sapo"      −(4/τ)·σ(τ(ρ − 1))·A, a soft sigmoid gate instead of the hard clip (SAPO 2511.20347)

logp, old_logp: (B, T) log-probs of the sampled tokens under π_θ and π_old; advantages (B,), (B, 1)
or (B, T); mask (B, T) bool, None = all valid. ρ = exp(log π_θ − log π_old) per token, its log
clamped to ±kl.LOG_RATIO_CLAMP before exp as everywhere in minigrpo. Masked slots: loss 0 and no
gradient, whatever they hold (every masked quantity goes through torch.where, never a product with
the mask).

Aggregation: "ppo_clip", "cispo" and "sapo" are per-token losses for losses.aggregate in any mode.
"gmpo" is a SEQUENCE loss spread evenly over the row's valid tokens (−J_i/|o_i| on each), so that
aggregate(…, "seq-mean-token-sum") gives the paper's (1/B)·Σ_i −J_i; see `gmpo`.
"""

from __future__ import annotations

import math

import torch

from minigrpo.objectives.losses import masked_inputs


def cispo(logp, old_logp, advantages, mask=None, eps_low=None, eps_high=4.0) -> torch.Tensor:
    """CISPO per-token loss  L_t = −sg(clip(ρ_t, 1−ε_low, 1+ε_high))·A_t·log π_θ(o_t),  (B, T).

    Source: MiniMax-M1 (arXiv 2506.13585 §3.1, eq. 4); ScaleRL (2510.13786) picks it as its loss.
    The importance weight is clipped and DETACHED, and multiplies a REINFORCE term: every token
    keeps a gradient, clipped ones included (PPO's clip zeroes theirs). Per token
        d L / d log π_θ(o_t) = −clip(ρ_t, 1−ε_low, 1+ε_high)·A_t,
    so without clipping it is the plain importance-weighted policy gradient (= ∇ of −ρ·A), and at ρ
    = 1 REINFORCE's −A·∇log π. The loss's VALUE (−w·A·log π) means nothing; only its gradient does.
    eps_low=None: no lower clamp (TRL clamps only above); a number clamps below too (verl).
    eps_high=4.0: ρ capped at 5, as TRL's epsilon_high=5.0 (TRL passes the cap itself, not 1 + ε).
    """
    mask, adv, log_ratio = masked_inputs(logp, old_logp, advantages, mask)
    low = -math.inf if eps_low is None else 1 - eps_low
    weight = log_ratio.exp().clamp(low, 1 + eps_high).detach()  # sg(clip(ρ)) (B, T)
    # masked junk never enters the product
    safe_logp = torch.where(mask, logp, torch.zeros_like(logp))
    return torch.where(mask, -weight * adv * safe_logp, torch.zeros_like(logp))


def gmpo(logp, old_logp, advantages, mask=None, eps=0.4, eps_high=None) -> torch.Tensor:
    """GMPO: a sequence loss −J_i spread as −J_i/|o_i| over the valid tokens of row i,  (B, T).

        J_i = exp( (1/|o_i|) Σ_t sgn(A_i)·min(sgn(A_i)·log ρ_t, sgn(A_i)·clip(log ρ_t, −ε, ε_high))
        ) · A_i

    Source: Geometric-Mean Policy Optimization (arXiv 2507.20673, eq. 3-4): the geometric mean of
    the token ratios, with PPO's pessimistic clip applied to each log ρ_t (for A > 0 min(log ρ,
    clip), for A < 0 max(log ρ, clip)); ε = 0.4 (the paper's (e^−0.4, e^0.4)); eps_high defaults to
    eps. Reduction: aggregate(loss, mask, "seq-mean-token-sum") = (1/B)·Σ_i −J_i, the paper's loss
    (and verl's geo_mean, which ignores its loss_agg_mode). Other modes rescale rows:
    "seq-mean-token-mean" divides each row by |o_i| a second time.
    A_i is the row's advantage: (B,)/(B, 1) as given, or the mean of (B, T) advantages over the
    valid tokens (verl). Gradient: at ρ ≡ 1, d(Σ_t L_it)/d log π(o_t) = −A_i/|o_i|; with ε = ∞
    (math.inf), J_i = exp(mean_t log ρ_t)·A_i, the geometric-mean ratio times A; a token whose clip
    binds gets none. A row with no valid token gives 0.
    """
    mask, adv, log_ratio = masked_inputs(logp, old_logp, advantages, mask)
    n_valid = mask.sum(dim=1, keepdim=True)  # (B, 1)
    row_adv = adv.sum(dim=1, keepdim=True) / n_valid.clamp(min=1)  # (B, 1): A_i
    sign = torch.sign(row_adv)
    high = eps if eps_high is None else eps_high
    clipped = log_ratio.clamp(-eps, high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)  # (B, T), 0 where A_i = 0
    mean_log = torch.where(mask, pessimistic, torch.zeros_like(logp)).sum(
        dim=1, keepdim=True
    ) / n_valid.clamp(min=1)
    objective = mean_log.exp() * row_adv  # J_i (B, 1)
    per_token = -objective / n_valid.clamp(min=1)  # spread evenly over the |o_i| valid tokens
    return torch.where(mask, per_token.expand_as(logp), torch.zeros_like(logp))


def sapo_gate(ratio: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """SAPO's soft gate f(ρ) = (4/τ)·σ(τ(ρ − 1)), any shape (2511.20347 eq. 5).

    f(1) = 2/τ and f'(1) = (4/τ)·τ·σ'(0) = 1, so at ρ = 1 its gradient is that of ρ itself. d f/d
    log ρ = 4·σ(x)(1 − σ(x))·ρ with x = τ(ρ − 1): at most ρ, and ≤ 4ρ·e^{−τ|ρ−1|}, so it vanishes
    off a window of width ~1/τ around ρ = 1 as τ grows.
    """
    return 4.0 / tau * torch.sigmoid(tau * (ratio - 1.0))


def sapo(logp, old_logp, advantages, mask=None, tau_pos=1.0, tau_neg=1.05) -> torch.Tensor:
    """SAPO per-token loss  L_t = −f_τ(ρ_t)·A_t,  f_τ(ρ) = (4/τ)·σ(τ(ρ_t − 1)),  (B, T).

    Source: Soft Adaptive Policy Optimization (arXiv 2511.20347 eq. 4-6); τ = tau_pos where A > 0
    and tau_neg where A ≤ 0 (1.0 and 1.05: the paper, TRL, verl). Checked against TRL, verl,
    ms-swift and AReaL: the gate is the OBJECTIVE, f(ρ)·A with the gradient through ρ (not a
    detached weight), so
        d L / d log π_θ(o_t) = −4·σ(x)(1 − σ(x))·ρ_t·A_t,   x = τ(ρ_t − 1)
    (the paper's eq. 6 weight w = 4σ(x)(1−σ(x))). At ρ = 1 it is −A (PPO's and REINFORCE's); it
    never exceeds the unclipped |ρ·A|; it is smooth and nonzero for every finite ρ, and as τ → ∞ it
    vanishes outside a shrinking window around ρ = 1 on BOTH sides, where PPO's clip zeroes only the
    side the clip acts on (A > 0 and ρ > 1+ε, or A < 0 and ρ < 1−ε).
    """
    mask, adv, log_ratio = masked_inputs(logp, old_logp, advantages, mask)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    objective = sapo_gate(log_ratio.exp(), tau) * adv
    return torch.where(mask, -objective, torch.zeros_like(logp))
