"""Advantages: how much better than its baseline each completion (or token) did.

    group_advantages   GRPO (DeepSeekMath 2402.03300 §4.1.2), with Dr. GRPO's and TRL's variants
    rloo_advantages    RLOO (2402.14740): leave-one-out baseline
    gae                PPO's generalised advantage estimation (Schulman et al. 2015), per token
    whiten             masked normalisation to mean 0, variance 1 (PPO's advantage whitening)
    explained_variance the critic's diagnostic
Defaults follow the papers: Bessel-corrected std (DeepSeekMath, TRL) with ε = 1e-4 (TRL); the
population std is `unbiased=False`; no std at all is `scale="none"` (Dr. GRPO).
"""

from __future__ import annotations

import torch

SCALES = ("group", "batch", "none")


def _equal_rows(r: torch.Tensor) -> torch.Tensor:
    """(B, G) -> (B, 1) bool: every reward of the row is identical."""
    return (r == r[:, :1]).all(dim=1, keepdim=True)


def group_advantages(rewards: torch.Tensor, scale: str = "group", unbiased: bool = True,
                     eps: float = 1e-4) -> torch.Tensor:
    """A_i = (r_i − mean_group(r)) / (std + eps), rewards (B, G) -> (B, G).

    scale "group": std within each group (DeepSeekMath); "batch": one std over all B·G rewards, the
    mean still per group (TRL scale_rewards="batch"); "none": no division (Dr. GRPO 2503.20783 §3.1).
    unbiased: Bessel's correction (divide by G−1) or the population std (divide by G).
    A group whose rewards are all equal gets exactly 0 (never NaN, whatever its magnitude), and a
    group of one (G = 1) gets 0.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    B, G = rewards.shape
    if G < 2:  # a group of one has no baseline to compare with
        return torch.zeros_like(rewards)
    r = rewards.double()  # float64: differences of 1e-9 at 1e6 must survive the centring
    centered = r - r.mean(dim=1, keepdim=True)  # (B, G)
    equal = _equal_rows(r)  # (B, 1)
    if scale == "none":
        adv = centered
    else:
        std = (r.std(dim=1, keepdim=True, unbiased=unbiased) if scale == "group"  # (B, 1)
               else r.std(unbiased=unbiased).reshape(1, 1))  # (1, 1)
        adv = centered / (std + eps)
    return torch.where(equal, torch.zeros_like(adv), adv).to(rewards.dtype)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """A_i = r_i − mean_{j≠i} r_j = G/(G−1)·(r_i − r̄), rewards (B, G) -> (B, G); G = 1 gives 0."""
    B, G = rewards.shape
    if G < 2:
        return torch.zeros_like(rewards)
    loo_mean = (rewards.sum(dim=1, keepdim=True) - rewards) / (G - 1)  # (B, G)
    adv = rewards - loo_mean
    return torch.where(_equal_rows(rewards), torch.zeros_like(adv), adv)


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over completion tokens; all (B, T), mask right-padded.

        δ_t = r_t + γ·V_{t+1} − V_t,   A_t = δ_t + γλ·A_{t+1},   returns R_t = A_t + V_t
    with V and A taken as 0 past the last valid token (no bootstrapping: the episode ends there).
    Masked positions are 0 in both outputs, whatever `rewards`/`values` hold there.
    """
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    r = torch.where(mask, rewards, zero)
    v = torch.where(mask, values, zero)
    B, T = r.shape
    adv = torch.zeros_like(v)
    next_value = torch.zeros(B, dtype=v.dtype, device=v.device)
    next_adv = torch.zeros(B, dtype=v.dtype, device=v.device)
    for t in reversed(range(T)):  # reverse scan over time; vectorised over the batch
        delta = r[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lam * next_adv
        a = torch.where(mask[:, t], a, zero)
        adv[:, t] = a
        next_value = torch.where(mask[:, t], v[:, t], zero)
        next_adv = a
    returns = torch.where(mask, adv + v, zero)
    return adv, returns


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x − mean) / std over the valid entries of x (any shape, mask the same shape); masked -> 0.

    shift_mean=False divides by the std only (keeps the mean, as TRL's PPO does for rewards).
    A single valid entry or zero variance stays finite (the std is floored by eps).
    """
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    xv = torch.where(mask, x, zero)
    n = mask.sum().clamp(min=1)
    mean = xv.sum() / n
    var = torch.where(mask, (xv - mean) ** 2, zero).sum() / n
    out = (xv - mean) if shift_mean else xv
    return torch.where(mask, out * torch.rsqrt(var + eps), zero)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 − Var[R − V] / Var[R] over valid entries (1 = perfect critic, 0 = no better than the mean).

    0-dim tensor; 0 when Var[R] = 0 (nothing to explain)."""
    zero = torch.zeros((), dtype=returns.dtype, device=returns.device)
    n = mask.sum().clamp(min=1)
    def var(x):
        xv = torch.where(mask, x, zero)
        m = xv.sum() / n
        return torch.where(mask, (xv - m) ** 2, zero).sum() / n
    var_r = var(returns)
    return torch.where(var_r > 0, 1 - var(returns - values) / var_r.clamp(min=1e-12), zero).detach()
