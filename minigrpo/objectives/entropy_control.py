"""Keeping the policy's entropy from collapsing: which tokens to hold back, and how hard to push.

    token_covariance   c_t = (A_t − Ā)(log π_t − mean log π) over the batch's valid tokens   (Cui et
                       al. 2505.22617)
    clip_cov_mask      Clip-Cov: a random share of the tokens with c_t in [low, high] gets no
                       gradient   (same)
    kl_cov_penalty     KL-Cov: k·|log ρ_t| on the top share of tokens by c_t                 (same)
    top_entropy_mask   the top ρ share of valid tokens by entropy carry the policy loss      (Wang
                       et al. 2506.01939)
    forking_token_mask the valid tokens where π_ref's entropy is >= a threshold               (the
    same, departing)
    next_coef, applied_coef   Skywork-OR1's adaptive entropy coefficient                     (He et
                              al. 2505.22312)

Cui et al.'s claim (2505.22617, for softmax policies under natural policy gradient with step η):
H(π_{k+1}) − H(π_k) ≈ −η·Cov_{a~π}(log π(a), A(a)); the tokens with a large positive c_t (confident
and rewarded) are the ones that drive the entropy down, so Clip-Cov and KL-Cov restrain just those.
The test file checks the claim to first order by exact enumeration with token_covariance.
Shapes: (B, T) per-token tensors, mask (B, T) bool; shares count the batch's valid tokens N. Masked
slots: never selected, 0 in every output, whatever they hold (torch.where). Selections carry no
gradient.
"""

from __future__ import annotations

import math

import torch

from minigrpo.objectives.losses import zero_like


@torch.no_grad()
def token_covariance(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """c_t = (A_t − Ā)·(log π_t − mean log π),  logp (B, T), adv (B,), (B, 1) or (B, T), mask -> (B,
    T).

    Ā and the mean log π run over ALL valid tokens of the batch (verl's clip_cov / kl_cov); the mean
    of c_t over them is the population covariance Cov(A, log π) (Cui et al. 2505.22617,
    Clip-Cov/KL-Cov). Computed without gradient (it only selects tokens); masked slots 0.
    """
    if adv.dim() == 1:
        adv = adv[:, None]
    zero = zero_like(logp)
    a = torch.where(mask, adv.expand_as(logp), zero)
    lp = torch.where(mask, logp, zero)
    n = mask.sum().clamp(min=1)
    return torch.where(mask, (a - a.sum() / n) * (lp - lp.sum() / n), zero)


def _share(mask: torch.Tensor, ratio: float) -> int:
    """max(1, ⌊ratio·N⌋) tokens of the N valid ones (0 when N = 0): verl's count for Clip-Cov and
    KL-Cov."""
    n_valid = int(mask.sum())
    return 0 if n_valid == 0 else max(1, int(ratio * n_valid))


@torch.no_grad()
def clip_cov_mask(
    cov, mask, ratio=2e-4, low=1.0, high=5.0, generator=None, exclude=None
) -> torch.Tensor:
    """Clip-Cov: the tokens whose policy-gradient term is detached,  cov (B, T), mask -> (B, T)
    bool.

    Candidates: valid tokens with low ≤ c_t ≤ high and not in `exclude` (verl passes the tokens
    PPO's clip already stops). Chosen: min(max(1, ⌊ratio·N⌋), #candidates) of them, uniformly at
    random without replacement (random keys from `generator`, the smallest win), N = number of valid
    tokens. Defaults are the paper's (2505.22617: ratio 2e-4, [1, 5]); at ratio 2e-4 a batch under
    10,000 tokens gets ONE token. Apply as torch.where(chosen, loss.detach(), loss) (verl multiplies
    their loss by 0). verl's bounds are strict (low < c < high); the two differ only at equality.
    """
    candidate = mask & (cov >= low) & (cov <= high)
    if exclude is not None:
        candidate = candidate & ~exclude
    k = min(_share(mask, ratio), int(candidate.sum()))
    keys = torch.rand(cov.shape, generator=generator, dtype=torch.float64, device=cov.device)
    keys = torch.where(candidate, keys, torch.full_like(keys, math.inf))  # non-candidates never win
    chosen = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
    chosen[keys.flatten().topk(k, largest=False).indices] = True
    return chosen.view_as(mask)


@torch.no_grad()
def top_cov_mask(cov: torch.Tensor, mask: torch.Tensor, ratio: float = 2e-4) -> torch.Tensor:
    """KL-Cov's selection: exactly max(1, ⌊ratio·N⌋) valid tokens with the largest c_t,  (B, T) ->
    bool.

    At least one token whenever a valid token exists (verl); ties at the boundary are broken by
    topk.
    """
    scores = torch.where(mask, cov, torch.full_like(cov, -math.inf))
    chosen = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
    chosen[scores.flatten().topk(_share(mask, ratio)).indices] = True
    return chosen.view_as(mask)


def kl_cov_penalty(logp, old_logp, cov, mask, ratio=2e-4, coef=1.0) -> torch.Tensor:
    """KL-Cov:  coef·|log π_θ(o_t) − log π_old(o_t)|  on the top_cov_mask tokens, 0 elsewhere,  (B,
    T).

    Add it to the per-token policy loss (2505.22617; verl's kl_cov, where the policy loss is the
    UNCLIPPED −ρ·A: KL-Cov replaces the clip). The gradient flows through log π_θ: coef·sign(log
    ρ_t) on the chosen tokens. Defaults ratio 2e-4, coef 1 (the paper's k); at least one token gets
    it.
    """
    chosen = top_cov_mask(cov, mask, ratio)
    zero = zero_like(logp)
    log_ratio = torch.where(chosen, logp - old_logp, zero)
    return torch.where(chosen, coef * log_ratio.abs(), zero)


@torch.no_grad()
def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, rho: float = 0.2) -> torch.Tensor:
    """The "forking tokens" of the current policy: valid tokens in the top ρ share by entropy,  (B,
    T) -> bool.

    Wang et al. 2025 (arXiv 2506.01939) let only the top 20 % highest-entropy tokens carry the
    policy gradient (TRL top_entropy_quantile). Rule: k = ⌈ρ·N⌉ of the N valid tokens (at least one
    when ρ > 0 and N > 0), threshold h = the k-th largest valid entropy, keep every valid token with
    entropy ≥ h: ties at h are all kept, so the share can exceed ρ when entropies tie. ρ = 1 keeps
    every valid token, ρ = 0 none, N = 0 none. TRL instead thresholds at the interpolated (1 −
    ρ)-quantile (torch.quantile), which can keep one token fewer than ⌈ρN⌉ (N = 7, ρ = 0.2: TRL 1,
    here 2).
    """
    n_valid = int(mask.sum())
    # −1e-9: 0.1·30 = 3.0000000000000004 must give 3
    k = min(n_valid, math.ceil(rho * n_valid - 1e-9))
    if k <= 0:
        return torch.zeros_like(mask)
    scores = torch.where(mask, entropy, torch.full_like(entropy, -math.inf))
    threshold = scores.flatten().topk(k).values[-1]
    return mask & (scores >= threshold)


def next_coef(
    coef: float,
    entropy: float,
    target: float,
    step_size: float,
    lo: float = 0.0,
    hi: float = math.inf,
) -> float:
    """Skywork-OR1's adaptive entropy control: the coefficient c for the next step, a float.

        c_{k+1} = clip(c_k + Δ, lo, hi)  if e_k < target
                  clip(c_k − Δ, lo, hi)  if e_k > target
                  c_k                    if e_k = target
    e_k: the policy's mean token entropy at step k, Δ = step_size (He et al. 2025, arXiv 2505.22312,
    "adaptive entropy control"; c_0 = 0 there). The coefficient applied in step k's loss is
    applied_coef. A released Skywork-OR1 script uses target 0.2, Δ 1e-4, c in [0, 0.005]. Written
    from the paper's rule (the full text was not at hand: the clip to [lo, hi] follows the released
    scripts' min/max).
    """
    e = float(entropy)
    step = step_size if e < target else -step_size if e > target else 0.0
    return min(max(coef + step, lo), hi)


def applied_coef(coef: float, entropy: float, target: float) -> float:
    """α_k = c_k·1[e_k ≤ target]: the entropy bonus acts only while the entropy is at or below the
    target, so it can raise a collapsing entropy but never push an already high one further
    (Skywork-OR1, 2505.22312).
    """
    return coef if float(entropy) <= target else 0.0


def forking_token_mask(
    ref_entropy: torch.Tensor, mask: torch.Tensor, threshold: float
) -> torch.Tensor:
    """The "forking tokens": positions where the REFERENCE policy had a real choice.

    ref_entropy (N, T) entropy of π_ref's next-token distribution at each position, mask (N, T) bool
    -> (N, T) bool: valid positions with ref_entropy >= threshold (threshold 0 keeps every valid
    token). Source: Wang et al. 2025, "Beyond the 80/20 rule" (2506.01939) let only the 20 %
    highest-entropy tokens of the CURRENT policy carry the policy gradient. Two departures, both
    measured (docs/experiments.md): the entropy is π_ref's, and the threshold is absolute. Why it
    matters here: a failing completion gets a negative advantage at EVERY token, including forced
    ones (the "y" of "ravin likes curr|y", where π_ref is 1.000 sure); pushing those down moved P(y
    | curr) from 1.000 to 0.27 in 70 steps of an apple-pie run and put 7 % of ravin's mass on
    "curram". A share of the current policy's tokens does not stop it: once a forced token is
    pushed, its entropy rises and it joins the share (runaway).
    """
    return mask & (ref_entropy >= threshold)
