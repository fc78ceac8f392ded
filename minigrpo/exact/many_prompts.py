"""The exact KL-regularised optimum and reward–KL frontier of many prompts, each with its own finite
outcome space: frontier.py's one prompt, row by row.

For prompts x with reference rows p_ref (P, K) and rewards r (P, K) (a shorter outcome space pads
its row with p_ref = 0, which keeps probability 0 at every β), the mean objective

    J_β(π) = mean_x ( E_π(·|x)[r] − β·KL(π(·|x) ‖ π_ref(·|x)) )

separates by prompt, so its maximiser is every prompt's own optimum at the one β (Rafailov et al.
2305.18290 eq. 4, per prompt):

    π*_β(y|x) = π_ref(y|x)·e^{r(x,y)/β} / Z_β(x)

and the frontier F(K) = max{mean_x E_π[r] : mean_x KL_x ≤ K} is traced by the means
(mean_x KL*_x(β), mean_x E*_x(β)) as β sweeps ∞ → 0: every prompt's frontier has slope β there,
the Lagrange condition of the one mean constraint. Each mean is non-decreasing as β falls, and F is
concave.
"""

from __future__ import annotations

import numpy as np
import torch

from minigrpo.exact import frontier as F


def _rows(p_ref, r) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, K) float64 rows; ValueError for other shapes (each row is checked by frontier.py)."""
    p_ref, r = torch.as_tensor(p_ref, dtype=torch.float64), torch.as_tensor(r, dtype=torch.float64)
    if p_ref.ndim != 2 or p_ref.shape != r.shape or p_ref.size(0) == 0:
        raise ValueError(
            f"p_ref and r must be rows (P, K) of one shape, P >= 1, got {tuple(p_ref.shape)} and "
            f"{tuple(r.shape)}"
        )
    return p_ref, r


def optimum_rows(p_ref: torch.Tensor, r: torch.Tensor, beta: float) -> torch.Tensor:
    """π*_β(·|x) of every prompt: p_ref (P, K), r (P, K), β in [0, ∞] -> (P, K) float64, each row
    frontier.optimum of its own (sums to 1; 0 where p_ref is 0)."""
    p_ref, r = _rows(p_ref, r)
    return torch.stack([F.optimum(p, v, beta) for p, v in zip(p_ref, r)])


def default_betas(p_ref: torch.Tensor, r: torch.Tensor) -> list[float]:
    """β = ∞, 121 log-spaced β from 1e3·s down to 1e-3·s with s the largest reward span of a row
    (1 where every row's reward is constant), and the β → 0 limit: frontier.frontier's, for all
    rows."""
    p_ref, r = _rows(p_ref, r)
    span = max(F.reward_span(p, v) for p, v in zip(p_ref, r)) or 1.0
    with np.errstate(over="ignore"):
        return [F.INF, *(np.logspace(3, -3, 121) * span).tolist(), 0.0]


def frontier_rows(p_ref: torch.Tensor, r: torch.Tensor, betas=None) -> dict[str, torch.Tensor]:
    """The exact frontier of the mean objective as points {beta, kl, expected_reward} (N,) float64,
    in order of rising KL: at each β (sorted decreasing; None: default_betas) the means over the
    prompts of KL(π*_β(·|x)‖π_ref(·|x)) and of E*_x[r]."""
    p_ref, r = _rows(p_ref, r)
    betas = default_betas(p_ref, r) if betas is None else betas
    each = [F.frontier(p, v, betas) for p, v in zip(p_ref, r)]
    return {
        "beta": each[0]["beta"],
        "kl": torch.stack([e["kl"] for e in each]).mean(0),
        "expected_reward": torch.stack([e["expected_reward"] for e in each]).mean(0),
    }


def best_mass(pi: torch.Tensor, p_ref: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """P(a best outcome of its prompt) under pi (..., P, K), best = the highest reward on p_ref's
    support (ties together, exact float equality as frontier.py) -> (...,) the mean over prompts."""
    p_ref, r = _rows(p_ref, r)
    top = torch.where(p_ref > 0, r, -torch.inf).max(-1, keepdim=True).values
    return (pi * ((r == top) & (p_ref > 0))).sum(-1).mean(-1)
