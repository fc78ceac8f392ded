"""The exact KL-regularised optimum on one prompt with a finite outcome space, and the reward–KL frontier.

For outcomes y with reference probabilities p_ref (K,) and rewards r (K,), J_β(π) = E_π[r] − β·KL(π‖π_ref)
is maximised by (Rafailov et al. 2305.18290 eq. 4; Korbak et al. 2022)

    π*_β(y) = π_ref(y)·e^{r(y)/β} / Z_β       log Z_β = log Σ_y π_ref(y)·e^{r(y)/β}
    E*[r] = Σ_y π*_β(y)·r(y)                  KL(π*_β‖π_ref) = E*[r]/β − log Z_β
    J_β(π*_β) − J_β(π) = β·KL(π‖π*_β) ≥ 0     (for every π: the optimum is unique)

Sweeping β from ∞ (π_ref) to 0 (π_ref restricted to the best outcomes, renormalised) traces the exact
frontier f(K) = max{E_π[r] : KL(π‖π_ref) ≤ K}: non-decreasing and concave, its slope at K is β, and no
policy lies above it. "Best" and max r are taken over the support of p_ref (outcomes with p_ref = 0 keep
probability 0 at every β); ties are exact float equality. Everything is float64 and computed from the
shifted rewards (r − max r)/β ≤ 0 with logsumexp, so β down to 1e-300 and rewards of 1e3 neither overflow
nor cancel. β may be 0 (the limit) or math.inf (π_ref) wherever a β is taken.

pass@k for a 0/1 reward with success probability p is 1 − (1 − p)^k; from n samples with c successes
the unbiased estimator is 1 − C(n−c, k)/C(n, k) (Chen et al. 2107.03374, "Codex", eq. 1).
"""

from __future__ import annotations

import math

import torch

INF = math.inf


def _check(p: torch.Tensor, r: torch.Tensor | None = None, name: str = "p_ref") -> None:
    """ValueError unless p is a 1-D distribution (≥ 0, sums to 1 within 1e-6) and r a finite (K,) vector."""
    if p.dim() != 1 or (r is not None and r.shape != p.shape):
        raise ValueError(f"{name} must be 1-D (K,) and r the same shape, got {tuple(p.shape)}"
                         f"{'' if r is None else f' and {tuple(r.shape)}'}")
    if not (p >= 0).all() or abs(p.sum().item() - 1) > 1e-6:
        raise ValueError(f"{name} must be a probability distribution (≥ 0, sum 1), got sum {p.sum().item()}")
    if r is not None and not torch.isfinite(r).all():
        raise ValueError(f"rewards must be finite, got {r.tolist()}")


def _solve(p_ref, r, beta) -> dict:
    """The figures of π*_β for a (B,) tensor of β in [0, ∞]: log π* (B, K), KL (B,), E (B,), log Z (B,)."""
    p_ref, r = p_ref.double(), r.double()
    on = p_ref > 0
    r_max = r[on].max()
    gap = torch.where(on, r - r_max, torch.zeros_like(r))  # ≤ 0 on the support; 0 at its best outcomes
    b = beta.double()[:, None]  # (B, 1)
    s = torch.where(gap == 0, torch.zeros_like(gap), gap / b)  # (r − max r)/β; β = 0: −∞ off the argmax
    log_w = p_ref.log() + s  # (B, K); −∞ where p_ref = 0
    # log Σ π_ref e^{(r − max r)/β} ≤ 0: as log1p(Σ π_ref (e^s − 1)) where that sum is small (large β: the
    # logsumexp of values near 0 would round away the 1/β-sized difference β·log Z is made of), else logsumexp
    t = (p_ref * torch.expm1(s)).sum(-1, keepdim=True)
    log_zs = torch.where(t.abs() < 0.5, torch.log1p(t), torch.logsumexp(log_w, dim=-1, keepdim=True))
    log_pi = log_w - log_zs
    pi = log_pi.exp()
    ratio = s - log_zs  # log π*/π_ref on the support: no large terms cancel
    kl = torch.where(pi > 0, pi * ratio, torch.zeros_like(pi)).sum(-1).clamp(min=0.0)
    lead = torch.where(r_max == 0, torch.zeros_like(b), r_max / b)[:, 0]  # log Z_β = max r/β + log_zs
    reward = r_max + (pi * gap).sum(-1)  # = Σ π* r, exactly max r at the β → 0 limit
    return {"log_pi": log_pi, "pi": pi, "kl": kl, "expected_reward": reward,
            "log_z": lead + log_zs[:, 0]}


def _betas(beta) -> torch.Tensor:  # a float or a list of them -> (B,) float64
    return torch.as_tensor(beta, dtype=torch.float64).reshape(-1)


def optimum(p_ref: torch.Tensor, r: torch.Tensor, beta: float) -> torch.Tensor:
    """π*_β(y) = π_ref(y)·e^{r(y)/β}/Z_β: p_ref (K,), r (K,), β in [0, ∞] -> (K,) float64, sums to 1.

    β = ∞ gives p_ref; β = 0 gives p_ref restricted to argmax r (over p_ref's support), renormalised.
    For a 0/1 reward every non-target outcome keeps π_ref's proportions. (Rafailov et al. eq. 4.)
    """
    _check(p_ref, r)
    return _solve(p_ref, r, _betas(beta))["pi"][0]


def optimum_figures(p_ref: torch.Tensor, r: torch.Tensor, beta: float) -> dict[str, float]:
    """{expected_reward: E*[r], kl: KL(π*_β‖π_ref) = E*[r]/β − log Z_β, log_z: log Z_β}, β in [0, ∞].

    log Z_β = log Σ_y π_ref(y)·e^{r(y)/β}; β·log Z_β is the optimal value J_β(π*_β) (A*PO's V*(x), 2505.20686)."""
    _check(p_ref, r)
    out = _solve(p_ref, r, _betas(beta))
    return {k: out[k][0].item() for k in ("expected_reward", "kl", "log_z")}


def reward_span(p_ref: torch.Tensor, r: torch.Tensor) -> float:
    """max r − min r over p_ref's support: the reward's scale (β is measured in it); 0 for a constant r."""
    on = p_ref > 0
    return (r[on].max() - r[on].min()).item()


def frontier(p_ref: torch.Tensor, r: torch.Tensor, betas=None) -> dict[str, torch.Tensor]:
    """The exact frontier as points {beta, kl, expected_reward}, each (N,) float64, in order of rising KL.

    betas=None: β = ∞ (KL 0, E_ref[r]), 121 log-spaced β from 1e3·s down to 1e-3·s where s = reward_span
    (1 for a constant reward), and the β → 0 limit (−log P_ref(argmax r), max r). Given betas are sorted
    decreasing. KL and E[r] are then both non-decreasing along the points, and E[r] concave in KL.
    """
    _check(p_ref, r)
    if betas is None:
        span = reward_span(p_ref, r) or 1.0
        betas = [INF, *torch.logspace(3, -3, 121, dtype=torch.float64).mul(span).tolist(), 0.0]
    beta = _betas(betas).sort(descending=True).values
    out = _solve(p_ref, r, beta)
    return {"beta": beta, "kl": out["kl"], "expected_reward": out["expected_reward"]}


def _bisect(fn, target: float, scale: float) -> float:
    """β with fn(β) = target for fn non-increasing in β; fn maps a (B,) tensor of β to (B,) values. Searched
    on t = log β, 128 points per round (each round narrows the bracket 128-fold, to 1e-13 in t): the
    same answer as bisection in a tenth of the calls (a run scores itself this way at every evaluation)."""
    at = lambda t: fn(_betas(math.exp(t)))[0].item()  # noqa: E731
    t0 = math.log(scale)
    lo, hi = t0 - 7, min(t0 + 7, 700.0)
    while at(lo) < target and lo > t0 - 700:  # bracket: fn(e^lo) ≥ target ≥ fn(e^hi)
        lo -= 7
    while at(hi) > target and hi < min(t0 + 35, 700.0):
        hi += 7
    while hi - lo > 1e-13 * max(1.0, abs(lo)):
        ts = torch.linspace(lo, hi, 129, dtype=torch.float64)
        k = int((fn(ts.exp()) > target).sum().clamp(1, 128))  # the values above target come first
        if (ts[k - 1].item(), ts[k].item()) == (lo, hi):  # float resolution reached
            break
        lo, hi = ts[k - 1].item(), ts[k].item()
    return math.exp((lo + hi) / 2)


def frontier_reward_at(p_ref: torch.Tensor, r: torch.Tensor, kl: float) -> float:
    """f(K) = max{E_π[r] : KL(π‖π_ref) ≤ K} = E*[r] at the β whose KL* is K (bisection on log β: KL* is
    non-increasing in β). K ≤ 0 gives E_ref[r]; K ≥ −log P_ref(argmax r) (the β → 0 limit) gives max r."""
    _check(p_ref, r)
    if math.isnan(kl):
        raise ValueError("kl is NaN")
    ends = _solve(p_ref, r, _betas([INF, 0.0]))
    if kl <= 0 or kl >= ends["kl"][1].item() or reward_span(p_ref, r) == 0:
        return ends["expected_reward"][0 if kl <= 0 else 1].item()
    beta = _bisect(lambda b: _solve(p_ref, r, b)["kl"], kl, reward_span(p_ref, r))
    return _solve(p_ref, r, _betas(beta))["expected_reward"][0].item()


def implied_beta(p_ref: torch.Tensor, r: torch.Tensor, expected_reward: float) -> float:
    """The β whose optimum has E*[r] = expected_reward (bisection on log β: E* is non-increasing in β).

    inf when expected_reward ≤ E_ref[r] (no optimum is worse than π_ref; a constant reward included);
    0.0 when expected_reward ≥ max r (only the β → 0 limit reaches it); both within 1e-12·(1 + max |r|)."""
    _check(p_ref, r)
    ends = _solve(p_ref, r, _betas([INF, 0.0]))["expected_reward"].tolist()
    tol = 1e-12 * (1 + r.abs().max().item())  # rounding of E[r] computed another way
    if expected_reward <= ends[0] + tol:
        return INF
    if expected_reward >= ends[1] - tol:
        return 0.0
    return _bisect(lambda b: _solve(p_ref, r, b)["expected_reward"], expected_reward, reward_span(p_ref, r))


def kl(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(p‖q) = Σ_y p(y)·log(p(y)/q(y)) over outcome distributions p, q (K,): 0·log 0 = 0, inf where
    p > 0 = q. Clamped at 0 against rounding."""
    p, q = p.double(), q.double()
    terms = torch.where(p > 0, p * (p.log() - q.log()), torch.zeros_like(p))
    return max(terms.sum().item(), 0.0)


REGRET_TOL = 1e-9  # × (1 + reward span): the bisection's rounding (measured ≤ 3e-13 on 13 outcomes)


def score(p_theta: torch.Tensor, p_ref: torch.Tensor, r: torch.Tensor, beta: float | None = None) -> dict:
    """Where a policy's outcome distribution p_theta (K,) stands against the exact optimum:

        kl_ref                 KL(π_θ‖π_ref)
        expected_reward        E_θ[r]
        regret                 f(kl_ref) − E_θ[r] ≥ 0: the frontier's reward at the policy's KL, minus its own
        implied_beta           the β whose optimum has E_θ[r] (implied_beta)
        kl_to_implied_optimum  KL(π_θ‖π*_{implied β}): how the policy differs from the optimum of equal reward
        kl_to_optimum          KL(π_θ‖π*_β), when beta is given; = (J_β(π*_β) − J_β(π_θ))/β
    A regret below −REGRET_TOL·(1 + span) (a policy above the frontier: impossible, so a bug or p_theta over
    other outcomes than p_ref) raises ValueError; smaller negatives are rounding and become 0.
    """
    _check(p_theta, r, name="p_theta")
    _check(p_ref, r)
    kl_ref = kl(p_theta, p_ref)
    reward = (p_theta.double() * r.double()).sum().item()
    regret = frontier_reward_at(p_ref, r, kl_ref) - reward
    if regret < -REGRET_TOL * (1 + reward_span(p_ref, r)):
        raise ValueError(f"policy above the exact frontier by {-regret:.3g} at KL {kl_ref:.6g}: impossible "
                         f"unless p_theta puts mass where p_ref is 0")
    b = implied_beta(p_ref, r, reward)
    out = {"kl_ref": kl_ref, "expected_reward": reward, "regret": max(regret, 0.0), "implied_beta": b,
           "kl_to_implied_optimum": kl(p_theta, optimum(p_ref, r, b))}
    if beta is not None:
        out["kl_to_optimum"] = kl(p_theta, optimum(p_ref, r, beta))
    return out


def pass_at_k(p, k: int):
    """Exact pass@k = 1 − (1 − p)^k for success probability p (float or tensor), as −expm1(k·log1p(−p))."""
    if isinstance(p, torch.Tensor):
        return -torch.expm1(k * torch.log1p(-p.double()))
    return -math.expm1(k * math.log1p(-p)) if p < 1 else 1.0


def pass_at_k_estimate(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes: 1 − C(n−c, k)/C(n, k) (Chen et al. 2107.03374),
    0 ≤ c ≤ n, 1 ≤ k ≤ n; exact integer binomials (1 when n − c < k)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
