"""The exact KL-regularised optimum on one prompt with a finite outcome space, and the reward–KL
frontier.

For outcomes y with reference probabilities p_ref (K,) and rewards r (K,), J_β(π) = E_π[r] −
β·KL(π‖π_ref) is maximised by (Rafailov et al. 2305.18290 eq. 4; Korbak et al. 2022)

    π*_β(y) = π_ref(y)·e^{r(y)/β} / Z_β       log Z_β = log Σ_y π_ref(y)·e^{r(y)/β}
    E*[r] = Σ_y π*_β(y)·r(y)                  KL(π*_β‖π_ref) = E*[r]/β − log Z_β
    J_β(π*_β) − J_β(π) = β·KL(π‖π*_β) ≥ 0     (for every π: the optimum is unique)

Sweeping β from ∞ (π_ref) to 0 (π_ref restricted to the best outcomes, renormalised) traces the
exact frontier f(K) = max{E_π[r] : KL(π‖π_ref) ≤ K}: non-decreasing and concave, its slope at K is
β, and no policy lies above it. "Best" and max r are taken over the support of p_ref (outcomes with
p_ref = 0 keep probability 0 at every β); ties are exact float equality. Everything is float64 and
computed from the shifted rewards (r − max r)/β ≤ 0 with logsumexp, so β down to 1e-300 and rewards
of 1e3 neither overflow nor cancel. β may be 0 (the limit) or math.inf (π_ref) wherever a β is
taken.

pass@k for a 0/1 reward with success probability p is 1 − (1 − p)^k; from n samples with c successes
the unbiased estimator is 1 − C(n−c, k)/C(n, k) (Chen et al. 2107.03374, "Codex", eq. 1).
"""

from __future__ import annotations

import math

import numpy as np
import torch

INF = math.inf
# The arithmetic is numpy's, on float64 arrays of K numbers: a torch call on so small a tensor costs
# several times more.
# log 0 = −inf, x/0 and inf − inf are meant
QUIET = dict(divide="ignore", invalid="ignore", over="ignore")


def _array(x) -> np.ndarray:
    """A tensor (any device), list or number as a float64 numpy array."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _check(p: np.ndarray, r: np.ndarray, name: str = "p_ref", rows: bool = False) -> None:
    """ValueError unless r is a finite (K,) vector and p a distribution (≥ 0, sums to 1 within 1e-6)
    of shape (K,), or with `rows` each row of p (M, K) is one (naming the sum of the first that is
    not)."""
    if r.ndim != 1 or p.ndim not in ((1, 2) if rows else (1,)) or p.shape[-1:] != r.shape:
        shape = "(K,) or rows (M, K)" if rows else "(K,)"
        raise ValueError(
            f"{name} must be of shape {shape} and r (K,), got {tuple(p.shape)} and {tuple(r.shape)}"
        )
    total = p.sum(-1)
    bad = np.flatnonzero(~((p >= 0).all(-1) & (np.abs(total - 1) <= 1e-6)).reshape(-1))
    if bad.size:
        raise ValueError(
            f"{name} must be a probability distribution (≥ 0, sum 1), got sum "
            f"{total.reshape(-1)[bad[0]]}"
        )
    if not np.isfinite(r).all():
        raise ValueError(f"rewards must be finite, got {r.tolist()}")


def _checked(p_ref, r) -> tuple[np.ndarray, np.ndarray]:
    p_ref, r = _array(p_ref), _array(r)
    _check(p_ref, r)
    return p_ref, r


def _logsumexp(x: np.ndarray) -> np.ndarray:
    """log Σ e^x over the last dim, keepdims; −inf for a row of −inf."""
    top = x.max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return top + np.log(np.exp(x - top).sum(-1, keepdims=True))


def _solve(p_ref: np.ndarray, r: np.ndarray, beta: np.ndarray) -> dict:
    """The figures of π*_β for a (B,) array of β in [0, ∞]: log π* (B, K), KL (B,), E (B,), log Z
    (B,), Var[r] (B,)."""
    with np.errstate(**QUIET):
        on = p_ref > 0
        r_max = r[on].max()
        gap = np.where(on, r - r_max, 0.0)  # ≤ 0 on the support; 0 at its best outcomes
        b = beta[:, None]  # (B, 1)
        s = np.where(gap == 0, 0.0, gap / b)  # (r − max r)/β; β = 0: −∞ off the argmax
        log_w = np.log(p_ref) + s  # (B, K); −∞ where p_ref = 0
        # log Σ π_ref e^{(r − max r)/β} ≤ 0: as log1p(Σ π_ref (e^s − 1)) where that sum is small
        # (large β: the
        # logsumexp of values near 0 would round away the 1/β-sized difference β·log Z is made of),
        # else logsumexp
        t = (p_ref * np.expm1(s)).sum(-1, keepdims=True)
        log_zs = np.where(np.abs(t) < 0.5, np.log1p(t), _logsumexp(log_w))
        log_pi = log_w - log_zs
        pi = np.exp(log_pi)
        ratio = s - log_zs  # log π*/π_ref on the support: no large terms cancel
        kl = np.maximum(np.where(pi > 0, pi * ratio, 0.0).sum(-1), 0.0)
        lead = (np.zeros_like(b) if r_max == 0 else r_max / b)[:, 0]  # log Z_β = max r/β + log_zs
        reward = r_max + (pi * gap).sum(-1)  # = Σ π* r, exactly max r at the β → 0 limit
        variance = (pi * np.square(gap - (reward - r_max)[:, None])).sum(-1)  # Var_π*[r]
    return {
        "log_pi": log_pi,
        "pi": pi,
        "kl": kl,
        "expected_reward": reward,
        "log_z": lead + log_zs[:, 0],
        "variance": variance,
    }


def _betas(beta) -> np.ndarray:  # a float or a list of them -> (B,) float64
    return _array(beta).reshape(-1)


def optimum(p_ref: torch.Tensor, r: torch.Tensor, beta: float) -> torch.Tensor:
    """π*_β(y) = π_ref(y)·e^{r(y)/β}/Z_β: p_ref (K,), r (K,), β in [0, ∞] -> (K,) float64, sums to
    1.

    β = ∞ gives p_ref; β = 0 gives p_ref restricted to argmax r (over p_ref's support),
    renormalised. For a 0/1 reward every non-target outcome keeps π_ref's proportions. (Rafailov et
    al. eq. 4.)
    """
    return torch.from_numpy(_solve(*_checked(p_ref, r), _betas(beta))["pi"][0])


def optimum_figures(p_ref: torch.Tensor, r: torch.Tensor, beta: float) -> dict[str, float]:
    """{expected_reward: E*[r], kl: KL(π*_β‖π_ref) = E*[r]/β − log Z_β, log_z: log Z_β}, β in [0,
    ∞].

    log Z_β = log Σ_y π_ref(y)·e^{r(y)/β}; β·log Z_β is the optimal value J_β(π*_β) (A*PO's V*(x),
    2505.20686)."""
    out = _solve(*_checked(p_ref, r), _betas(beta))
    return {k: float(out[k][0]) for k in ("expected_reward", "kl", "log_z")}


def _span(p_ref: np.ndarray, r: np.ndarray) -> float:
    on = p_ref > 0
    return float(r[on].max() - r[on].min())


def reward_span(p_ref: torch.Tensor, r: torch.Tensor) -> float:
    """max r − min r over p_ref's support: the reward's scale (β is measured in it); 0 for a
    constant r."""
    return _span(_array(p_ref), _array(r))


def frontier(p_ref: torch.Tensor, r: torch.Tensor, betas=None) -> dict[str, torch.Tensor]:
    """The exact frontier as points {beta, kl, expected_reward}, each (N,) float64, in order of
    rising KL.

    betas=None: β = ∞ (KL 0, E_ref[r]), 121 log-spaced β from 1e3·s down to 1e-3·s where s =
    reward_span (1 for a constant reward), and the β → 0 limit (−log P_ref(argmax r), max r). Given
    betas are sorted decreasing. KL and E[r] are then both non-decreasing along the points, and E[r]
    concave in KL.
    """
    p_ref, r = _checked(p_ref, r)
    if betas is None:
        span = _span(p_ref, r) or 1.0
        # a span near the float range: β overflows to inf, as a β may be
        with np.errstate(over="ignore"):
            betas = [INF, *(np.logspace(3, -3, 121) * span).tolist(), 0.0]
    beta = -np.sort(-_betas(betas))
    out = _solve(p_ref, r, beta)
    return {
        "beta": torch.from_numpy(beta),
        "kl": torch.from_numpy(out["kl"]),
        "expected_reward": torch.from_numpy(out["expected_reward"]),
    }


# KL* and E* move with t = log β as d/dt E* = −Var*[r]/β and d/dt KL* = −Var*[r]/β² (with λ = 1/β:
# dE*/dλ =
# Var*[r], and KL* = λE* − log Z gives dKL*/dλ = λ·Var*[r]): the slopes Newton's method takes
SLOPES = {
    "expected_reward": lambda out, beta: -out["variance"] / beta,
    "kl": lambda out, beta: -out["variance"] / beta**2,
}
# a cap, never met in the tests: Newton's steps converge in a few rounds, a step that cannot bisects
ROUNDS = 200


def _root_rows(p_ref: np.ndarray, r: np.ndarray, what: str, target: np.ndarray) -> np.ndarray:
    """The β at which _solve's `what` (E* or KL*, each non-increasing in β) is each of M targets
    (M,) -> (M,). Newton's method on t = log β, each row's root kept in a bracket that every step
    narrows (a step that would leave it, or land on its end, bisects it instead: rtsafe, Numerical
    Recipes 9.4), all rows at once. A row is done when its step is below 1e-14 in t, its value is
    its target, or its bracket is below 1e-13 in t."""

    def at(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # -> the value and its slope in t
        beta = np.exp(t)
        out = _solve(p_ref, r, beta)
        with np.errstate(**QUIET):  # β = 0 (t far below): a slope of 0/0, whose step then bisects
            return out[what], SLOPES[what](out, beta)

    t0 = math.log(_span(p_ref, r))
    lo, hi = np.full(target.shape, t0 - 7), np.full(target.shape, min(t0 + 7, 700.0))
    while (low := (at(lo)[0] < target) & (lo > t0 - 700)).any():
        lo = np.where(low, lo - 7, lo)
    while (high := (at(hi)[0] > target) & (hi < min(t0 + 35, 700.0))).any():
        hi = np.where(high, hi + 7, hi)
    t, going = (lo + hi) / 2, np.ones(target.shape, dtype=bool)
    for _ in range(ROUNDS):
        rows = np.flatnonzero(going)
        (value, slope), now, aim = at(t[rows]), t[rows], target[rows]
        above = value > aim  # the root lies above t
        lo[rows], hi[rows] = np.where(above, now, lo[rows]), np.where(above, hi[rows], now)
        with np.errstate(**QUIET):  # a slope of 0 where the curve is flat: a step that bisects
            step = now - (value - aim) / slope
        # else a bisection: the bracket halves
        newton = np.isfinite(step) & (step > lo[rows]) & (step < hi[rows])
        # t stays
        done = (np.abs(step - now) <= 1e-14 * np.maximum(1.0, np.abs(now))) | (value == aim)
        t[rows] = np.where(done, now, np.where(newton, step, (lo[rows] + hi[rows]) / 2))
        going[rows] = ~done & (hi[rows] - lo[rows] > 1e-13 * np.maximum(1.0, np.abs(lo[rows])))
        if not going.any():
            break
    return np.exp(t)


def _frontier_rewards(p_ref: np.ndarray, r: np.ndarray, kls: np.ndarray) -> np.ndarray:
    """frontier_reward_at of each KL in kls (M,) -> (M,)."""
    ends, span = _solve(p_ref, r, np.array([INF, 0.0])), _span(p_ref, r)
    beta = np.full(kls.shape, INF)  # the β whose KL* is each K
    inside = (kls > 0) & (kls < ends["kl"][1]) & (span > 0)
    if inside.any():
        beta[inside] = _root_rows(p_ref, r, "kl", kls[inside])
    return np.where(
        inside,
        _solve(p_ref, r, beta)["expected_reward"],
        ends["expected_reward"][np.where(kls <= 0, 0, 1)],
    )


def frontier_reward_at(p_ref: torch.Tensor, r: torch.Tensor, kl: float) -> float:
    """f(K) = max{E_π[r] : KL(π‖π_ref) ≤ K} = E*[r] at the β whose KL* is K (Newton's method on log
    β: KL* is non-increasing in β). K ≤ 0 gives E_ref[r]; K ≥ −log P_ref(argmax r) (the β → 0 limit)
    gives max r."""
    p_ref, r = _checked(p_ref, r)
    if math.isnan(kl):
        raise ValueError("kl is NaN")
    return float(_frontier_rewards(p_ref, r, np.array([kl], dtype=np.float64))[0])


def _implied_betas(p_ref: np.ndarray, r: np.ndarray, rewards: np.ndarray) -> np.ndarray:
    """implied_beta of each E[r] in rewards (M,) -> (M,)."""
    ends = _solve(p_ref, r, np.array([INF, 0.0]))["expected_reward"]
    tol = 1e-12 * (1 + np.abs(r).max())  # rounding of E[r] computed another way
    out = np.where(rewards <= ends[0] + tol, INF, 0.0)
    between = (rewards > ends[0] + tol) & (rewards < ends[1] - tol)
    if between.any():
        out[between] = _root_rows(p_ref, r, "expected_reward", rewards[between])
    return out


def implied_beta(p_ref: torch.Tensor, r: torch.Tensor, expected_reward: float) -> float:
    """The β whose optimum has E*[r] = expected_reward (Newton's method on log β: E* is
    non-increasing in β).

    inf when expected_reward ≤ E_ref[r] (no optimum is worse than π_ref; a constant reward
    included); 0.0 when expected_reward ≥ max r (only the β → 0 limit reaches it); both within
    1e-12·(1 + max |r|)."""
    return float(
        _implied_betas(*_checked(p_ref, r), np.array([expected_reward], dtype=np.float64))[0]
    )


def _kl(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """KL(p‖q) over the last dim (rows of p against q, broadcast), clamped at 0."""
    with np.errstate(**QUIET):
        return np.maximum(np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0).sum(-1), 0.0)


def kl(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(p‖q) = Σ_y p(y)·log(p(y)/q(y)) over outcome distributions p, q (K,): 0·log 0 = 0, inf
    where p > 0 = q. Clamped at 0 against rounding."""
    return float(_kl(_array(p), _array(q)))


REGRET_TOL = 1e-9  # × (1 + reward span): the root finding's rounding


def score(
    p_theta: torch.Tensor, p_ref: torch.Tensor, r: torch.Tensor, beta: float | None = None
) -> dict:
    """Where a policy's outcome distribution p_theta (K,) stands against the exact optimum:

        kl_ref                 KL(π_θ‖π_ref)
        expected_reward        E_θ[r]
        regret                 f(kl_ref) − E_θ[r] ≥ 0: the frontier's reward at the policy's KL,
                               minus its own
        implied_beta           the β whose optimum has E_θ[r] (implied_beta)
        kl_to_implied_optimum  KL(π_θ‖π*_{implied β}): how the policy differs from the optimum of
                               equal reward
        kl_to_optimum          KL(π_θ‖π*_β), when beta is given; = (J_β(π*_β) − J_β(π_θ))/β
    A regret below −REGRET_TOL·(1 + span) (a policy above the frontier: impossible, so a bug or
    p_theta over other outcomes than p_ref) raises ValueError; smaller negatives are rounding and
    become 0.
    """
    return score_many(_array(p_theta)[None], p_ref, r, beta)[0]


def score_many(
    p_thetas, p_ref: torch.Tensor, r: torch.Tensor, beta: float | None = None
) -> list[dict]:
    """score(p_thetas[m], p_ref, r, beta) of M policies (M, K) over one p_ref and r, their root
    findings as one (_root_rows). Each row's figures are its own score's."""
    p_thetas, (p_ref, r) = _array(p_thetas), _checked(p_ref, r)
    _check(p_thetas, r, name="p_theta", rows=True)
    kl_ref, reward, span = _kl(p_thetas, p_ref), (p_thetas * r).sum(1), _span(p_ref, r)
    regret = _frontier_rewards(p_ref, r, kl_ref) - reward
    if (regret < -REGRET_TOL * (1 + span)).any():
        m = int(np.argmin(regret))
        raise ValueError(
            f"policy above the exact frontier by {-regret[m]:.3g} at KL {kl_ref[m]:.6g}: "
            "impossible unless p_theta puts mass where p_ref is 0"
        )
    implied = _implied_betas(p_ref, r, reward)
    figures = {
        "kl_ref": kl_ref,
        "expected_reward": reward,
        "regret": np.maximum(regret, 0.0),
        "implied_beta": implied,
        # each member's own optimum
        "kl_to_implied_optimum": _kl(p_thetas, _solve(p_ref, r, implied)["pi"]),
    }
    if beta is not None:
        # one optimum for all
        figures["kl_to_optimum"] = _kl(p_thetas, _solve(p_ref, r, _betas(beta))["pi"])
    return [{k: float(v[m]) for k, v in figures.items()} for m in range(len(p_thetas))]


def pass_at_k(p, k: int):
    """Exact pass@k = 1 − (1 − p)^k for success probability p (float or tensor), as
    −expm1(k·log1p(−p))."""
    if isinstance(p, torch.Tensor):
        return -torch.expm1(k * torch.log1p(-p.double()))
    return -math.expm1(k * math.log1p(-p)) if p < 1 else 1.0


def pass_at_k_estimate(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes: 1 − C(n−c, k)/C(n, k) (Chen et al.
    2107.03374), 0 ≤ c ≤ n, 1 ≤ k ≤ n; exact integer binomials (1 when n − c < k)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
