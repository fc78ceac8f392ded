"""Properties of the KL estimators (minigrpo/kl.py), by exact enumeration and one Monte-Carlo table."""

import torch
from hypothesis import given, settings, strategies as st

from minigrpo.kl import ESTIMATORS, exact, k1, k2, k3

SET = settings(deadline=None, max_examples=60)
logps = st.lists(st.floats(-20, 0), min_size=1, max_size=8)


def T(x):
    return torch.tensor(x, dtype=torch.float64)


@SET
@given(logps, logps)
def test_k2_and_k3_are_non_negative(a, b):
    n = min(len(a), len(b))
    lp, ref = T(a[:n]), T(b[:n])
    assert (k2(lp, ref) >= 0).all() and (k3(lp, ref) >= -1e-12).all(), (a, b)


@SET
@given(logps)
def test_k3_is_zero_iff_logp_equals_ref_logp(a):
    lp = T(a)
    assert (k3(lp, lp) == 0).all()
    assert (k3(lp, lp - 0.5) > 0).all() and (k3(lp, lp + 0.5) > 0).all()


@SET
@given(logps, logps)
def test_k1_is_antisymmetric_and_k2_symmetric_in_the_log_ratio(a, b):
    n = min(len(a), len(b))
    lp, ref = T(a[:n]), T(b[:n])
    assert torch.equal(k1(lp, ref), -k1(ref, lp))
    assert torch.equal(k2(lp, ref), k2(ref, lp))


def random_pair(seed, V=6):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, generator=g, dtype=torch.float64) * 2, torch.randn(V, generator=g, dtype=torch.float64) * 2


def kl(p_logits, q_logits):
    lp, lq = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
    return (lp.exp() * (lp - lq)).sum()


@settings(deadline=None, max_examples=30)
@given(st.integers(0, 10_000))
def test_k1_and_k3_are_unbiased_and_exact_is_the_true_kl(seed):
    theta, ref = random_pair(seed)
    lp, lref = theta.log_softmax(-1), ref.log_softmax(-1)
    p = lp.exp()
    true = kl(theta, ref)
    assert abs((p * k1(lp, lref)).sum() - true) < 1e-10, "E_π[k1] must equal KL(π‖π_ref)"
    assert abs((p * k3(lp, lref)).sum() - true) < 1e-10, "E_π[k3] must equal KL(π‖π_ref)"
    assert abs(exact(theta, ref) - true) < 1e-10
    assert (p * k2(lp, lref)).sum() >= 0


def expected_grad(kind, theta, ref):
    """Σ_x π(x) ∇_θ k(x) with the sample x held fixed: the gradient a loss term gives on-policy."""
    theta = theta.clone().requires_grad_(True)
    lp = theta.log_softmax(-1)
    lref = ref.log_softmax(-1)
    weights = lp.exp().detach()
    (weights * ESTIMATORS[kind](lp, lref)).sum().backward()
    return theta.grad


def grad_of(fn, theta):
    theta = theta.clone().requires_grad_(True)
    fn(theta).backward()
    return theta.grad


@settings(deadline=None, max_examples=30)
@given(st.integers(0, 10_000))
def test_gradient_facts_by_enumeration(seed):
    theta, ref = random_pair(seed)
    assert expected_grad("k1", theta, ref).abs().max() < 1e-10, "E[∇k1] must be 0"
    reverse = grad_of(lambda t: kl(t, ref), theta)  # ∇ KL(π‖π_ref)
    forward = grad_of(lambda t: kl(ref, t), theta)  # ∇ KL(π_ref‖π)
    assert torch.allclose(expected_grad("k2", theta, ref), reverse, atol=1e-10), "E[∇k2] must be ∇KL(π‖π_ref)"
    assert torch.allclose(expected_grad("k3", theta, ref), forward, atol=1e-10), "E[∇k3] must be ∇KL(π_ref‖π)"


def test_exact_is_finite_non_negative_and_zero_for_equal_logits():
    big = torch.tensor([[1e4, -1e4, 0.0], [-1e4, 1e4, 3.0]])
    assert torch.isfinite(exact(big, big.flip(0))).all()
    assert (exact(big, big) == 0).all()
    x = torch.randn(5, 7)
    assert (exact(x, torch.randn(5, 7)) >= 0).all() and exact(x, x).shape == (5,)


def test_monte_carlo_reproduces_schulmans_gaussian_table():
    # q = N(0, 1) samples; p = N(mu, 1); KL[q‖p] = mu²/2. REFERENCE.md §4: bias/true and std/true.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500_000, generator=g, dtype=torch.float64)
    table = {0.1: {"k1": (0, 20), "k2": (0.002, 1.42), "k3": (0, 1.42)},
             1.0: {"k1": (0, 2), "k2": (0.25, 1.73), "k3": (0, 1.7)}}
    for mu, rows in table.items():
        logq = -0.5 * x ** 2  # the shared normaliser cancels in the log-ratio
        logp = -0.5 * (x - mu) ** 2
        true = mu ** 2 / 2
        for name, (bias, std) in rows.items():
            est = ESTIMATORS[name](logq, logp)  # (logp of the sampler, logp of the reference)
            got_bias = (est.mean().item() - true) / true
            got_std = est.std().item() / true
            tolerance = 4 * std / len(x) ** 0.5 + 0.005  # 4 standard errors of the mean
            assert abs(got_bias - bias) < tolerance, f"{name} mu={mu}: bias/true {got_bias:.4f} vs {bias}"
            assert abs(got_std - std) / std < 0.03, f"{name} mu={mu}: std/true {got_std:.3f} vs {std}"
