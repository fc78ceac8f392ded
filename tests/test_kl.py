"""Properties of minigrpo/objectives/kl.py: signs and symmetries, unbiasedness and the gradient
facts by exact enumeration over small categoricals, and Schulman's Gaussian table by Monte Carlo.
Float64 throughout."""

import pytest
import torch
from conftest import SET, T, call
from hypothesis import given, settings
from hypothesis import strategies as st

from minigrpo.objectives.kl import exact, k1, k2, k3
from minigrpo.variants.kl import KL_ESTIMATORS

logps = st.lists(st.floats(-30, 0), min_size=1, max_size=8)


def pair(a, b):
    n = min(len(a), len(b))
    return T(a[:n]), T(b[:n])


def test_estimators_table_maps_names_to_functions():
    table = {name: KL_ESTIMATORS[name].fn for name in ("k1", "k2", "k3")}
    assert table == {"k1": k1, "k2": k2, "k3": k3}, (
        f"KL_ESTIMATORS must map 'k1', 'k2', 'k3' to them: {table}"
    )


def test_hand_values_fix_the_sign_convention():
    # π_θ(x) = 1/2, π_ref(x) = 1/4: Δ = log π_ref − log π_θ = −log 2
    lp, ref = T([0.5]).log(), T([0.25]).log()
    log2 = torch.tensor(2.0, dtype=torch.float64).log()
    assert torch.allclose(call(k1, lp, ref), log2), "k1 = log π_θ − log π_ref (here +log 2)"
    assert torch.allclose(call(k2, lp, ref), 0.5 * log2**2), "k2 = ½(log π_θ − log π_ref)²"
    assert torch.allclose(call(k3, lp, ref), 0.5 + log2 - 1), (
        "k3 = e^Δ − Δ − 1 with Δ = log π_ref − log π_θ"
    )


@SET
@given(logps, logps)
def test_k2_and_k3_are_non_negative(a, b):
    lp, ref = pair(a, b)
    assert (call(k2, lp, ref) >= 0).all(), f"k2 < 0 for logp {lp.tolist()}, ref {ref.tolist()}"
    assert (call(k3, lp, ref) >= -1e-12).all(), f"k3 < 0 for logp {lp.tolist()}, ref {ref.tolist()}"


@SET
@given(logps, st.floats(1e-6, 19).flatmap(lambda d: st.sampled_from([d, -d])))
def test_k3_is_zero_iff_logp_equals_ref_logp(a, delta):
    lp = T(a)
    assert (call(k3, lp, lp) == 0).all(), f"k3(x, x) must be exactly 0 for {a}"
    got = k3(lp, lp + delta)
    assert (got > 0).all(), f"k3 must be > 0 when the log-ratio is {delta}, got {got.tolist()}"


@SET
@given(logps, logps)
def test_k1_is_antisymmetric_and_k2_symmetric_in_the_log_ratio(a, b):
    lp, ref = pair(a, b)
    assert torch.equal(call(k1, lp, ref), -k1(ref, lp)), "k1(p, q) must equal −k1(q, p)"
    assert torch.equal(call(k2, lp, ref), k2(ref, lp)), "k2(p, q) must equal k2(q, p)"


@SET
@given(st.floats(1e-3, 1e-2), st.sampled_from([1.0, -1.0]), st.floats(-10, -0.1))
def test_k3_is_accurate_for_small_log_ratios_in_float32(size, sign, base):
    lp = torch.tensor([base], dtype=torch.float32)
    ref = lp + sign * size
    want = k3(lp.double(), ref.double())  # the same float32 inputs, evaluated in float64
    got = k3(lp, ref)
    assert torch.allclose(got.double(), want, rtol=1e-3, atol=0), (
        f"float32 k3 at Δ={(ref - lp).item():.2e}: {got.item():.4e} vs {want.item():.4e} (e^Δ − "
        "1 cancels: use expm1)"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_k3_value_and_gradient_stay_finite_for_extreme_log_ratios(dtype):
    lp = torch.tensor([0.0, -1e4, 0.0, -200.0], dtype=dtype, requires_grad=True)
    ref = torch.tensor([-1e4, 0.0, -200.0, 0.0], dtype=dtype)
    value = call(k3, lp, ref)
    value.sum().backward()
    assert torch.isfinite(value).all() and torch.isfinite(lp.grad).all(), (
        f"k3 at log-ratios ±1e4 gave {value.tolist()}, grad {lp.grad.tolist()} (clamp Δ to ±20 "
        "before exp)"
    )


# ---- exact enumeration over small categoricals ---------------------------------------------------


def random_categoricals(seed, V, scale, n=8):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(n, V, generator=g, dtype=torch.float64) * scale
    ref = torch.randn(n, V, generator=g, dtype=torch.float64) * scale
    return theta, ref


def true_kl(p_logits, q_logits):
    """KL(softmax(p) ‖ softmax(q)) per row, written out independently of kl.exact."""
    p, q = p_logits.softmax(-1), q_logits.softmax(-1)
    return (p * (p.log() - q.log())).sum(-1)


categoricals = st.tuples(st.integers(0, 10**6), st.integers(2, 8), st.floats(0.1, 2.0))


@settings(deadline=None, max_examples=25, derandomize=True)
@given(categoricals)
def test_k1_and_k3_are_unbiased_and_exact_is_the_true_kl(case):
    theta, ref = random_categoricals(*case)
    lp, lref = theta.log_softmax(-1), ref.log_softmax(-1)
    pi = lp.exp()
    want = true_kl(theta, ref)
    for name in ("k1", "k3"):
        mean = (pi * KL_ESTIMATORS[name].fn(lp, lref)).sum(-1)  # E_(x~π)[k(x)], enumerated
        assert torch.allclose(mean, want, atol=1e-10), (
            f"E_π[{name}] = {mean.tolist()} must equal KL(π‖π_ref) = {want.tolist()}"
        )
    got = call(exact, theta, ref)
    assert got.shape == want.shape, f"exact: (n, V) logits must give (n,), got {tuple(got.shape)}"
    assert torch.allclose(got, want, atol=1e-10), (
        f"exact must be KL(softmax(logits)‖softmax(ref)): {got} vs {want}"
    )


def expected_grad(name, theta, ref):
    """Σ_x π(x)·∇_θ k(x) with the sample x held fixed (π(x) detached): the gradient a loss term
    gives on-policy — the score-function term of the sampling is NOT included, as in a trainer."""
    theta = theta.clone().requires_grad_(True)
    lp, lref = theta.log_softmax(-1), ref.log_softmax(-1)
    (lp.exp().detach() * KL_ESTIMATORS[name].fn(lp, lref)).sum().backward()
    return theta.grad


def grad_of(fn, theta):
    theta = theta.clone().requires_grad_(True)
    fn(theta).sum().backward()
    return theta.grad


@settings(deadline=None, max_examples=25, derandomize=True)
@given(categoricals)
def test_expected_gradients_k1_zero_k2_reverse_kl_k3_forward_kl(case):
    theta, ref = random_categoricals(*case)
    reverse = grad_of(lambda t: true_kl(t, ref), theta)  # ∇_θ KL(π_θ ‖ π_ref)
    forward = grad_of(lambda t: true_kl(ref, t), theta)  # ∇_θ KL(π_ref ‖ π_θ)
    g1, g2, g3 = (expected_grad(n, theta, ref) for n in ("k1", "k2", "k3"))
    assert g1.abs().max() < 1e-10, f"E[∇k1] must be 0 (k1 regularises nothing), got {g1}"
    assert torch.allclose(g2, reverse, atol=1e-10), (
        f"E[∇k2] must be ∇KL(π‖π_ref): {g2} vs {reverse}"
    )
    assert torch.allclose(g3, forward, atol=1e-10), (
        f"E[∇k3] must be ∇KL(π_ref‖π) (forward KL): {g3} vs {forward}"
    )
    assert not torch.allclose(forward, reverse, atol=1e-6), (
        "the two KL directions should differ here"
    )


def test_exact_is_finite_non_negative_and_zero_for_equal_logits():
    big = torch.tensor([[1e4, -1e4, 0.0], [-1e4, 1e4, 3.0]])
    got = call(exact, big, big.flip(0))
    assert torch.isfinite(got).all() and (got >= 0).all(), (
        f"exact at logits ±1e4 must be finite, ≥ 0: {got}"
    )
    assert (exact(big, big) == 0).all(), "exact(x, x) must be exactly 0"
    x = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert exact(x, y).shape == (2, 5) and (exact(x, y) >= 0).all(), "exact: (..., V) -> (...), ≥ 0"
    assert torch.allclose(exact(x + 3.0, y - 1.0), exact(x, y), atol=1e-12), (
        "exact must ignore constant logit shifts"
    )


def test_exact_gradient_is_finite_at_extreme_logits():
    big = torch.tensor([[1e4, -1e4, 0.0]], requires_grad=True)
    exact(big, torch.zeros(1, 3)).sum().backward()
    assert torch.isfinite(big.grad).all(), (
        f"exact's gradient at logits ±1e4 must be finite, got {big.grad}"
    )


# ---- Schulman's Gaussian table -----------------------------------------------------------------
# J. Schulman, "Approximating KL Divergence", 2020, http://joschu.net/blog/kl-approx.html: the
# table of each estimator's bias/true and std/true for q = N(0, 1), p = N(mu, 1), mu = 0.1 and 1.

# mu: name -> (bias/true, std/true)
TABLE = {
    0.1: {"k1": (0.0, 20.0), "k2": (0.002, 1.42), "k3": (0.0, 1.42)},
    1.0: {"k1": (0.0, 2.0), "k2": (0.25, 1.73), "k3": (0.0, 1.7)},
}


@pytest.mark.parametrize("mu", sorted(TABLE))
def test_monte_carlo_reproduces_schulmans_gaussian_table(mu):
    # x ~ q = N(0, 1) plays the sampler π_θ, p = N(mu, 1) the reference; KL[q‖p] = mu²/2.
    n = 500_000
    x = torch.randn(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    # the shared normaliser cancels in the log-ratio
    logq, logp = -0.5 * x**2, -0.5 * (x - mu) ** 2
    true = mu**2 / 2
    for name, (bias, std) in TABLE[mu].items():
        # (log-prob under the sampler, under the reference)
        est = call(KL_ESTIMATORS[name].fn, logq, logp)
        got_bias, got_std = (est.mean().item() - true) / true, est.std().item() / true
        tolerance = 4 * std / n**0.5 + 0.002  # 4 standard errors + the table's rounding
        assert abs(got_bias - bias) < tolerance, (
            f"{name}, mu={mu}: bias/true {got_bias:.4f}, table {bias} ± {tolerance:.4f}"
        )
        assert abs(got_std / std - 1) < 0.03, (
            f"{name}, mu={mu}: std/true {got_std:.3f}, table {std}"
        )


# ---- k3+ (k3's value, k2's gradient) and DeepSeek-V3.2's importance-weighted k3 ------------------

from minigrpo.objectives.kl import k3_iw, k3_plus  # noqa: E402


def sampled_grad(loss_of_logp, theta, weights):
    """Σ_x w(x)·∇_θ loss(x) with the sample weights w (the sampler's probabilities) held fixed."""
    theta = theta.clone().requires_grad_(True)
    (weights.detach() * loss_of_logp(theta.log_softmax(-1))).sum().backward()
    return theta.grad


def test_the_kl_table_holds_k3_plus_and_k3_iw():
    assert KL_ESTIMATORS["k3+"].fn is k3_plus and KL_ESTIMATORS["k3_iw"].fn is k3_iw, (
        f"KL_ESTIMATORS: {KL_ESTIMATORS}"
    )


@SET
@given(logps, logps)
def test_k3_plus_has_k3s_value_exactly_and_k2s_gradient_per_sample(a, b):
    lp, ref = pair(a, b)
    lp = lp.requires_grad_(True)
    got = call(k3_plus, lp, ref, shape=lp.shape)
    assert torch.equal(got.detach(), k3(lp, ref).detach()), (
        f"k3+ must have k3's value exactly: {got} vs {k3(lp, ref)}"
    )
    (g_plus,) = torch.autograd.grad(got.sum(), lp)
    (g_two,) = torch.autograd.grad(k2(lp, ref).sum(), lp)
    assert torch.equal(g_plus, g_two), f"k3+ must carry k2's gradient: {g_plus} vs {g_two}"


@settings(deadline=None, max_examples=25, derandomize=True)
@given(categoricals)
def test_on_policy_k3_plus_expected_gradient_is_the_reverse_kl_where_k3s_is_not(case):
    theta, ref = random_categoricals(*case)
    lref = ref.log_softmax(-1)
    reverse = grad_of(lambda t: true_kl(t, ref), theta)
    pi = theta.softmax(-1)
    g_plus = sampled_grad(lambda lp: k3_plus(lp, lref), theta, pi)
    g_three = sampled_grad(lambda lp: k3(lp, lref), theta, pi)
    assert torch.allclose(g_plus, reverse, atol=1e-10), (
        f"E[∇k3+] must be ∇KL(π‖π_ref): {g_plus} vs {reverse}"
    )
    assert not torch.allclose(g_three, reverse, atol=1e-6), (
        "plain k3's expected gradient is not the reverse KL's"
    )


def off_policy(case):
    """(θ, π_ref logits, π_old logits): π_old a perturbed copy of π_θ, as after the first of μ > 1
    updates."""
    theta, ref = random_categoricals(*case)
    g = torch.Generator().manual_seed(case[0] + 1)
    return theta, ref, theta + 0.5 * torch.randn(theta.shape, generator=g, dtype=torch.float64)


@settings(deadline=None, max_examples=25, derandomize=True)
@given(categoricals)
def test_k3_iw_under_pi_old_sampling_is_unbiased_for_the_kl_and_its_gradient(case):
    theta, ref, old = off_policy(case)
    lp, lref, lold = theta.log_softmax(-1), ref.log_softmax(-1), old.log_softmax(-1)
    q = lold.exp()  # samples come from π_old ≠ π_θ
    want = true_kl(theta, ref)
    value = (q * call(k3_iw, lp, lref, lold, shape=lp.shape)).sum(-1)
    assert torch.allclose(value, want, atol=1e-10), (
        f"E_π_old[ρ·k3] must be KL(π_θ‖π_ref): {value} vs {want}"
    )
    plain = (q * k3(lp, lref)).sum(-1)
    assert not torch.allclose(plain, want, atol=1e-6), (
        "plain k3 under π_old sampling should be biased here"
    )
    reverse = grad_of(lambda t: true_kl(t, ref), theta)
    forward = grad_of(lambda t: true_kl(ref, t), theta)
    g_iw = sampled_grad(lambda l: k3_iw(l, lref, lold), theta, q)
    assert torch.allclose(g_iw, reverse, atol=1e-10), (
        f"E_π_old[∇(ρ·k3)] must be ∇KL(π_θ‖π_ref): {g_iw} vs {reverse}"
    )
    g_detached = sampled_grad(lambda l: (l - lold).exp().detach() * k3(l, lref), theta, q)
    assert torch.allclose(g_detached, forward, atol=1e-10), (
        "with ρ detached the expectation is ∇KL(π_ref‖π_θ)"
    )
    assert not torch.allclose(g_detached, reverse, atol=1e-6), (
        "so detaching ρ matters: the two must differ here"
    )


# |Δ| < 20: k3's gradient is 0 beyond
inside_clamp = st.lists(st.floats(-19, 0), min_size=1, max_size=8)


@SET
@given(inside_clamp, inside_clamp)
def test_k3_iw_at_ratio_one_has_k3s_value_and_k2s_gradient_per_sample(a, b):
    lp, ref = pair(a, b)
    lp = lp.requires_grad_(True)
    got = k3_iw(lp, ref, lp.detach())  # π_old = π_θ in value: ρ = 1, but ρ still carries a gradient
    assert torch.allclose(got, k3(lp, ref), rtol=1e-12, atol=0), "at ρ = 1, k3_iw must equal k3"
    (g_iw,) = torch.autograd.grad(got.sum(), lp)
    (g_two,) = torch.autograd.grad(k2(lp, ref).sum(), lp)
    scale = 1 + (ref - lp.detach()).exp()  # ρ·(k3 + 1 − e^Δ) cancels terms of size e^Δ in float64
    assert ((g_iw - g_two).abs() <= 1e-12 * scale).all(), (
        f"at ρ = 1, ∇(ρ·k3) must be ∇k2: {g_iw} vs {g_two}"
    )


def test_k3_plus_and_k3_iw_stay_finite_for_extreme_log_ratios():
    lp = torch.tensor([0.0, -1e4, 0.0, -200.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1e4, 0.0, -200.0, 0.0], dtype=torch.float64)
    old = torch.tensor([-1e4, 0.0, 1e4, 0.0], dtype=torch.float64)
    for value in (k3_plus(lp, ref), k3_iw(lp, ref, old)):
        (g,) = torch.autograd.grad(value.sum(), lp)
        assert torch.isfinite(value).all() and torch.isfinite(g).all(), f"value {value}, grad {g}"
