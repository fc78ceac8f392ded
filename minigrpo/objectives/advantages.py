"""Advantages: how much better than its baseline each completion (or token) did.

    group_advantages    GRPO's group-normalised outcome advantage (DeepSeekMath 2402.03300 §4.1.2)
    rloo_advantages     REINFORCE leave-one-out baseline (RLOO: Kool et al. 2019; Ahmadian et al.
                        2402.14740)
    batch_scaled        already-centred advantages divided by their batch std (REINFORCE++,
                        2501.03262)
    kl_shaped_rewards   PPO's per-token reward: −β·k1 at every token, the scalar reward at the last
                        (2203.02155)
    gae                 generalised advantage estimation for PPO (Schulman et al. 2015, 1506.02438
                        §3)
    whiten              masked normalisation to mean 0, variance 1 (PPO's advantage whitening)
    explained_variance  how much of the returns' variance the critic explains (a PPO diagnostic)
    remax_advantages    A = r − r(greedy completion) (ReMax, Li et al. 2310.10505)
    gpg_scale           α = N / #(A ≠ 0), GPG's correction for the zero-advantage samples (GPG
                        2504.02546)

Defaults and departures:
  - The group std is Bessel-corrected (÷(G−1)), as in the paper's code and TRL; `unbiased=False`
    gives the population std that several teaching notebooks use (the worked example in the tests
    shows both).
  - ε = 1e-4 is added to the std (TRL's value; the paper writes no ε, `eps=0` restores it; verl uses
    1e-6).
  - `scale="none"` drops the division (Dr. GRPO 2503.20783 §3.1); `scale="batch"` divides the
    group-centred rewards by the std of the RAW rewards over the whole batch (TRL
    `scale_rewards="batch"`). REINFORCE++ (2501.03262) divides the centred values by THEIR batch std
    instead: `batch_scaled`, for any baseline.
  - A group whose rewards are all equal gets exactly 0 and a group of one gets 0 (the paper is
    silent).
  - GAE does not bootstrap past the last valid token: the completion ended there (γ = 1, λ = 0.95
    are the usual LM values; verl defaults to λ = 1).
"""

from __future__ import annotations

import torch

from minigrpo.objectives.kl import k1

SCALES = ("group", "batch", "none")


def _std(x: torch.Tensor, dims: tuple[int, ...], unbiased: bool) -> torch.Tensor:
    """Standard deviation of x over `dims` (kept as size-1 dims).

    The deviations are divided by the largest one before squaring (std(s·y) = s·std(y)), so
    differences of 1e-200 do not underflow to a zero variance and rewards of 1e200 do not overflow.
    """
    dev = x - x.mean(dim=dims, keepdim=True)
    biggest = dev.abs().amax(dim=dims, keepdim=True)
    # every |entry| ≤ 1
    unit_dev = dev / torch.where(biggest > 0, biggest, torch.ones_like(biggest))
    n = 1
    for d in dims:
        n *= x.size(d)
    dof = n - 1 if unbiased else n  # Bessel's correction or the population std
    return biggest * (unit_dev.pow(2).sum(dim=dims, keepdim=True) / dof).sqrt()


def equal_groups(rewards: torch.Tensor) -> torch.Tensor:
    """(B, G) rewards -> (B,) bool: every reward of the group is the same (no signal to learn
    from)."""
    return (rewards == rewards[:, :1]).all(dim=1)


def group_advantages(
    rewards: torch.Tensor, scale: str = "group", unbiased: bool = True, eps: float = 1e-4
) -> torch.Tensor:
    """GRPO outcome advantage  A_i = (r_i − mean(r_group)) / (std + ε),  rewards (B, G) -> (B, G).

    Row b holds the rewards of the G completions sampled for prompt b (DeepSeekMath §4.1.2).
    scale:    "group"  std within each group (the paper)
              "batch"  one std over all B·G rewards; the mean is still per group (TRL
                       scale_rewards="batch")
              "none"   no division: A = r − mean(r_group) (Dr. GRPO §3.1)
    unbiased: Bessel-corrected std (÷(G−1), paper code and TRL) or the population std (÷G).
    Example: r = [1,1,1,1,0,0,0,0] -> ±0.935 (Bessel std 0.5345) or ±1.0 (population std 0.5), ε =
    0. A group whose rewards are all equal gets exactly 0 whatever their size, and G = 1 gives 0.
    With the Bessel std, |A| ≤ (G−1)/√G for every ε ≥ 0 (group mode), so near-equal rewards cannot
    blow up. Computed in float64 and returned in the rewards' dtype.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    B, G = rewards.shape
    if G < 2:  # a group of one has no baseline to be better than
        return torch.zeros_like(rewards)
    r = rewards.double()
    centered = r - r.mean(dim=1, keepdim=True)  # (B, G)
    if scale == "none":
        adv = centered
    else:
        dims = (1,) if scale == "group" else (0, 1)
        std = _std(r, dims, unbiased)  # (B, 1) per group, or (1, 1) for the whole batch
        adv = centered / (std + eps)
    # all-equal groups: exactly 0 (the mean's rounding error, or 0/0 when ε = 0, must not leak out)
    equal = equal_groups(r)[:, None]  # (B, 1)
    return torch.where(equal, torch.zeros_like(adv), adv).to(rewards.dtype)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO advantage  A_i = r_i − (1/(G−1)) Σ_{j≠i} r_j = G/(G−1)·(r_i − r̄),  rewards (B, G) ->
    (B, G).

    Each completion's baseline is the mean reward of the other G−1 in its group (Kool et al. 2019;
    Ahmadian et al. 2024, 2402.14740, the RLOO estimator).
    G = 1 gives 0; a group whose rewards are all equal gets exactly 0.
    """
    B, G = rewards.shape
    if G < 2:
        return torch.zeros_like(rewards)
    adv = G / (G - 1) * (rewards - rewards.mean(dim=1, keepdim=True))  # (B, G)
    equal = equal_groups(rewards)[:, None]
    return torch.where(equal, torch.zeros_like(adv), adv)


def batch_scaled(adv: torch.Tensor, unbiased: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """A / (std(A) + ε) with ONE std over every entry of A (any shape -> the same shape).

    For advantages already centred by a baseline (batch mean, leave-one-out, group mean):
    REINFORCE++ normalises them over the global batch (2501.03262 §3.2; OpenRLHF's
    reinforce_plus_plus). Unlike `whiten`, the mean is not removed again. Bessel or population std
    as in `group_advantages`; all-equal advantages (std 0) come back divided by ε alone, so all-zero
    advantages stay exactly 0.
    """
    std = _std(adv.double().reshape(1, -1), (1,), unbiased)  # (1, 1)
    return (adv.double() / (std.reshape(()) + eps)).to(adv.dtype)


def kl_shaped_rewards(
    rewards: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, beta
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's reward per completion token (InstructGPT 2203.02155 eq. 2; Ziegler et al. 1909.08593):

        r_t = −β·k1_t + [t is the row's last valid token]·r,    k1_t = log π_old(o_t) − log
        π_ref(o_t)
    rewards (..., N); old_logp, ref_logp, mask (..., N, T), mask right-padded; beta a float, or a
    tensor broadcasting to (..., N, T) (each leading slice its own β) -> (r_t (..., N, T), Σ_t k1_t
    (..., N)). Masked slots 0 whatever the log-probs hold there; a row without a valid token gets
    nothing, not even its scalar reward.
    """
    kl = torch.where(mask, k1(old_logp, ref_logp), 0.0)
    r = -beta * kl
    last = (mask.sum(-1) - 1).clamp(min=0)  # the index of each row's last valid token
    r = r.scatter_add(-1, last[..., None], (rewards * mask.any(-1))[..., None])
    return r, kl.sum(-1)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2015, 1506.02438 eq. 16) per completion
    token.

        δ_t = r_t + γ·V_{t+1} − V_t             (TD error)
        A_t = δ_t + γλ·A_{t+1}                  (= Σ_k (γλ)^k δ_{t+k})
        R_t = A_t + V_t                         (the value target, "returns")
    rewards, values, mask: (..., B, T); mask (bool) is right-padded: valid tokens first, then
    padding. Returns (advantages, returns), both (..., B, T). After the last valid token V = A =
    0: the episode ended there, nothing is bootstrapped (a masked slot inside a row would also end
    the episode).
    λ = 1 gives reward-to-go − V (Monte-Carlo); λ = 0 gives the one-step TD error.
    Masked positions are 0 in both outputs whatever rewards/values hold there (NaN included).
    """
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    r = torch.where(mask, rewards, zero)  # garbage in padding never enters the recursion
    v = torch.where(mask, values, zero)
    B, T = r.shape[:-1], r.size(-1)
    adv = torch.zeros_like(v)
    next_value = torch.zeros(B, dtype=v.dtype, device=v.device)  # V_{t+1}; 0 past the end
    next_adv = torch.zeros(B, dtype=v.dtype, device=v.device)  # A_{t+1}
    for t in reversed(range(T)):  # reverse scan over time, vectorised over the batch
        delta = r[..., t] + gamma * next_value - v[..., t]
        adv_t = torch.where(mask[..., t], delta + gamma * lam * next_adv, zero)
        adv[..., t] = adv_t
        next_value, next_adv = v[..., t], adv_t  # both already 0 at masked slots
    returns = torch.where(mask, adv + v, zero)
    return adv, returns


def _masked_mean_var(x: torch.Tensor, mask: torch.Tensor):
    """(sanitised x, deviations from the mean, mean, population variance) over the valid entries."""
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    n = mask.sum().clamp(min=1)
    xv = torch.where(mask, x, zero)  # sanitise first: NaN·0 would still be NaN
    mean = xv.sum() / n
    dev = torch.where(mask, xv - mean, zero)
    var = dev.pow(2).sum() / n
    return xv, dev, mean, var


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """x -> (x − μ)/σ over the valid entries (x and mask of any equal shape); masked positions -> 0.

    μ and σ² are the masked mean and POPULATION variance, so the output has masked mean 0 and masked
    variance exactly 1 (÷n; TRL's and verl's masked_whiten use ÷(n−1)). Their `shift_mean=False`
    returns (x − μ)/σ + μ; minigrpo has no such flag (to rescale already-centred advantages:
    `batch_scaled`). A std ≤ eps (one valid entry, all entries equal) is not divided by: the output
    stays finite, (x − μ) = 0.
    """
    _, dev, _, var = _masked_mean_var(x, mask)
    std = var.sqrt()
    std = torch.where(std > eps, std, torch.ones_like(std))
    return torch.where(mask, dev / std, torch.zeros((), dtype=x.dtype, device=x.device))


@torch.no_grad()
def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """EV = 1 − Var[R − V] / Var[R] over the valid entries -> 0-dim tensor (no grad).

    1: the critic predicts the returns perfectly; 0: no better than predicting their mean; < 0:
    worse. Defined as 0 when Var[R] = 0 (nothing to explain; cleanrl would give NaN).
    """
    residual = torch.where(mask, returns, 0) - torch.where(mask, values, 0)
    var_returns = _masked_mean_var(returns, mask)[3]
    var_residual = _masked_mean_var(residual, mask)[3]
    safe = torch.where(var_returns > 0, var_returns, torch.ones_like(var_returns))
    return torch.where(var_returns > 0, 1 - var_residual / safe, torch.zeros_like(var_returns))


# ---- ReMax's greedy baseline and GPG's rescaling ----


def remax_advantages(rewards: torch.Tensor, greedy_rewards: torch.Tensor) -> torch.Tensor:
    """ReMax advantage  A_i = r_i − r(ŷ_greedy),  rewards (B, G), greedy_rewards (B,) -> (B, G).

    The baseline of prompt b is the reward of its GREEDY completion (Li et al. 2023, arXiv
    2310.10505): no critic and no other samples; it costs one extra greedy decode per prompt. No
    normalisation. Sampled completions that score like the greedy one get exactly 0.
    """
    return rewards - greedy_rewards[:, None]


def gpg_scale(adv: torch.Tensor) -> torch.Tensor:
    """GPG's rescaling  α = N / #(A ≠ 0),  advantages of any shape -> 0-dim tensor.

    Group Policy Gradient (Chu et al. 2025, arXiv 2504.02546): the loss −α·A·log π averaged over
    all N samples of the batch is diluted by the samples with A = 0 (all-equal groups); α = B/(B −
    M), M of them zero, undoes that dilution, as if the mean ran over the informative samples only.
    Pass ONE advantage per completion (B, G): per-token advantages would count tokens. α ≥ 1; a
    batch with no nonzero advantage gives α = 1 (its loss is 0 whatever α).
    """
    nonzero = (adv != 0).sum()
    one = torch.ones((), dtype=adv.dtype, device=adv.device)
    return torch.where(nonzero > 0, adv.numel() / nonzero.clamp(min=1).to(adv.dtype), one)
