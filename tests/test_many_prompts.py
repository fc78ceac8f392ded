"""Properties of minigrpo/exact/many_prompts.py: the exact optimum and frontier of the mean
objective over prompts of their own outcome spaces (padded rows), against frontier.py's one prompt
and against any other policy. Float64 throughout."""

import math

import pytest
import torch
from conftest import SET, T
from hypothesis import given
from hypothesis import strategies as st

from minigrpo.exact import frontier as F
from minigrpo.exact.many_prompts import best_mass, frontier_rows, optimum_rows

BETAS = [math.inf, 3.0, 1.0, 0.3, 0.1, 0.03, 0.0]


def rows(n_prompts=st.integers(1, 4), width=st.integers(2, 6)):
    """(p_ref, r) rows (P, K): each prompt's outcomes a prefix of its row, the rest padding."""

    def one(k):
        size = st.integers(1, k)
        return size.flatmap(
            lambda n: st.tuples(
                st.lists(st.floats(1e-3, 1.0), min_size=n, max_size=n),
                st.lists(st.integers(-2, 2).map(float), min_size=k, max_size=k),
            )
        )

    def build(items, k):
        p = torch.zeros(len(items), k, dtype=torch.float64)
        for i, (w, _) in enumerate(items):
            p[i, : len(w)] = T(w) / sum(w)
        return p, T([r for _, r in items])

    return st.tuples(n_prompts, width).flatmap(
        lambda pk: st.lists(one(pk[1]), min_size=pk[0], max_size=pk[0]).map(
            lambda items: build(items, pk[1])
        )
    )


def objective(pi, p_ref, r, beta):
    """mean_x E_π[r] − β·mean_x KL(π(·|x)‖π_ref(·|x)), by hand."""
    e = (pi * r).sum(-1).mean()
    kl = torch.where(pi > 0, pi * (pi / p_ref).log(), 0.0).sum(-1).mean()
    return (e - beta * kl).item()


@SET
@given(rows())
def test_each_row_is_its_own_prompts_optimum_and_padding_stays_zero(case):
    p_ref, r = case
    for beta in BETAS:
        pi = optimum_rows(p_ref, r, beta)
        assert torch.allclose(pi.sum(-1), torch.ones(len(p_ref), dtype=torch.float64)), pi
        assert (pi[p_ref == 0] == 0).all(), f"padding got mass at β={beta}: {pi}"
        for i in range(len(p_ref)):
            assert torch.allclose(pi[i], F.optimum(p_ref[i], r[i], beta), atol=1e-12)


@SET
@given(rows(), st.integers(0, 2**31 - 1))
def test_no_policy_beats_the_optimum_of_the_mean_objective(case, seed):
    """J_β(π*_β) ≥ J_β(q) for random policies q on the same supports (at finite β > 0)."""
    p_ref, r = case
    g = torch.Generator().manual_seed(seed)
    for beta in (3.0, 0.3, 0.03):
        best = objective(optimum_rows(p_ref, r, beta), p_ref, r, beta)
        for _ in range(5):
            q = torch.rand(p_ref.shape, generator=g, dtype=torch.float64) * (p_ref > 0)
            q = q / q.sum(-1, keepdim=True)
            assert objective(q, p_ref, r, beta) <= best + 1e-9, (beta, q)


@SET
@given(rows())
def test_the_frontier_is_the_mean_of_the_prompts_frontiers_rising_and_concave(case):
    p_ref, r = case
    f = frontier_rows(p_ref, r, BETAS)
    each = [F.frontier(p, v, BETAS) for p, v in zip(p_ref, r)]
    for key in ("kl", "expected_reward"):
        want = torch.stack([e[key] for e in each]).mean(0)
        assert torch.allclose(f[key], want, atol=1e-12), key
        assert (f[key][1:] >= f[key][:-1] - 1e-9).all(), f"{key} falls as β falls: {f[key]}"
    assert f["kl"][0] == 0 and f["expected_reward"][0] == pytest.approx(
        (p_ref * r).sum(-1).mean().item()
    )
    kl, e = f["kl"], f["expected_reward"]
    for i in range(1, len(kl) - 1):  # concave: each chord's slope falls
        a, b = kl[i] - kl[i - 1], kl[i + 1] - kl[i]
        if a > 1e-9 and b > 1e-9:
            assert (e[i] - e[i - 1]) / a >= (e[i + 1] - e[i]) / b - 1e-6, (kl, e)


@SET
@given(rows())
def test_a_repeated_prompt_changes_no_mean_and_one_prompt_is_frontier_py(case):
    p_ref, r = case
    once = frontier_rows(p_ref, r, BETAS)
    twice = frontier_rows(torch.cat([p_ref, p_ref]), torch.cat([r, r]), BETAS)
    assert torch.allclose(once["kl"], twice["kl"]) and torch.allclose(
        once["expected_reward"], twice["expected_reward"]
    )
    one = frontier_rows(p_ref[:1], r[:1])
    assert torch.equal(one["kl"], F.frontier(p_ref[0], r[0])["kl"])


def test_best_mass_by_hand_and_bad_shapes_are_refused():
    p_ref = T([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    r = T([[1.0, 0.0, 5.0], [1.0, 1.0, 0.0]])  # row 0's 5 has p_ref 0: not on the support
    pi = T([[0.25, 0.75, 0.0], [0.1, 0.1, 0.8]])
    assert best_mass(pi, p_ref, r).item() == pytest.approx((0.25 + 0.2) / 2)
    assert best_mass(optimum_rows(p_ref, r, 0.0), p_ref, r).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="rows"):
        optimum_rows(T([0.5, 0.5]), T([1.0, 0.0]), 1.0)
