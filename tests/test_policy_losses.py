"""Properties of minigrpo/objectives/policy_losses.py: CISPO, GMPO and SAPO against their papers'
reductions (REINFORCE, the geometric-mean ratio, the hard clip), their gradients at ρ = 1, and
masking. Float64 throughout."""

import math

import pytest
import torch
from conftest import SET, T, call, garbage
from hypothesis import given
from hypothesis import strategies as st

# the batches of the clipped-surrogate tests: log-ratios, A, lengths
from test_losses import case, unpack

from minigrpo.objectives.losses import aggregate, clipped_surrogate
from minigrpo.objectives.policy_losses import cispo, gmpo, sapo, sapo_gate
from minigrpo.variants.policy_losses import POLICY_LOSSES


def loss_and_grad(fn, logp, old, adv, mask, **kw):
    """Per-token loss and d(Σ loss)/d log π_θ: each token's own gradient, unaggregated."""
    leaf = logp.detach().clone().requires_grad_(True)
    loss = call(fn, leaf, old, adv, mask, shape=logp.shape, **kw)
    loss.sum().backward()
    return loss.detach(), leaf.grad


def per_token(adv, mask):
    return torch.where(mask, adv[:, None].expand(mask.shape), 0.0)


def test_the_table_holds_the_four_losses_and_ppo_clip_is_clipped_surrogate_itself():
    assert set(POLICY_LOSSES) == {"ppo_clip", "cispo", "gmpo", "sapo"}, sorted(POLICY_LOSSES)
    assert POLICY_LOSSES["ppo_clip"].fn is clipped_surrogate, (
        "ppo_clip must delegate to losses.clipped_surrogate"
    )
    assert (POLICY_LOSSES["cispo"].fn, POLICY_LOSSES["gmpo"].fn, POLICY_LOSSES["sapo"].fn) == (
        cispo,
        gmpo,
        sapo,
    )


@SET
@given(case, st.sampled_from(sorted(POLICY_LOSSES)))
def test_at_ratio_one_every_loss_gives_minus_a_per_token_and_gmpo_minus_a_over_length(c, name):
    _, old, adv, mask = unpack(c)
    _, g = loss_and_grad(POLICY_LOSSES[name].fn, old, old, adv, mask)  # log π_θ = log π_old: ρ = 1
    want = per_token(adv, mask)
    if name == "gmpo":  # a sequence objective: each token carries 1/|o_i| of it
        want = want / mask.sum(1, keepdim=True).clamp(min=1)
    assert torch.allclose(g, -want, atol=1e-12), (
        f"{name}: at ρ = 1 the gradient must be {(-want).tolist()}, got {g.tolist()}"
    )


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_masked_nan_and_1e4_reach_neither_value_nor_gradient(name):
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    logp, old = (
        T([[-1.0, -0.2, 0], [-0.5, 0, 0], [0, 0, 0]]),
        T([[-1.1, -0.1, 0], [-0.4, 0, 0], [0, 0, 0]]),
    )
    # (B, T): junk goes into the advantages' masked slots too
    adv = T([[2.0] * 3, [-1.0] * 3, [0.5] * 3])
    clean, g_clean = loss_and_grad(POLICY_LOSSES[name].fn, logp, old, adv, mask)
    dirty, g_dirty = loss_and_grad(
        POLICY_LOSSES[name].fn, garbage(logp, mask), garbage(old, mask), garbage(adv, mask), mask
    )
    assert torch.isfinite(dirty).all() and torch.equal(dirty, clean), (
        f"{name}: masked junk changed {clean} -> {dirty}"
    )
    assert torch.isfinite(g_dirty).all() and torch.equal(g_dirty, g_clean), (
        f"{name}: junk reached the gradient"
    )
    assert (g_dirty[~mask] == 0).all() and (g_dirty[mask] != 0).all(), (
        f"{name}: gradient {g_dirty.tolist()}"
    )


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_extreme_log_ratios_give_a_finite_loss_and_gradient(name):
    logp, old = T([[1e4, -1e4], [0.0, 50.0]]), T([[-1e4, 1e4], [-60.0, 0.0]])
    for a in (T([1.0, 2.0]), T([-1.0, -2.0])):
        loss, g = loss_and_grad(POLICY_LOSSES[name].fn, logp, old, a, None)
        assert torch.isfinite(loss).all() and torch.isfinite(g).all(), (
            f"{name}: loss {loss}, grad {g}"
        )


# ---- CISPO ---------------------------------------------------------------------------------------


@SET
@given(case, st.floats(0.05, 0.5), st.floats(0.05, 0.5), st.booleans())
def test_cispo_gradient_is_minus_the_clipped_detached_ratio_times_a_and_clipped_tokens_keep_it(
    c, lo, hi, lower
):
    logp, old, adv, mask = unpack(c)
    eps_low = lo if lower else None
    _, g = loss_and_grad(cispo, logp, old, adv, mask, eps_low=eps_low, eps_high=hi)
    rho = torch.where(mask, logp - old, 0.0).exp()
    w = rho.clamp(1 - lo if lower else -math.inf, 1 + hi)
    want = torch.where(mask, -w * per_token(adv, mask), 0.0)
    assert torch.allclose(g, want, atol=1e-12), (
        f"CISPO: d L/d log π must be −clip(ρ)·A: {g.tolist()} vs {want}"
    )
    clipped = mask & (per_token(adv, mask) != 0) & ((rho > 1 + hi) | ((rho < 1 - lo) & lower))
    assert (g[clipped] != 0).all(), (
        "CISPO keeps the gradient of a clipped token (PPO's clip zeroes it)"
    )
    if not lower:  # TRL's one-sided clamp: a small ratio is never raised
        small = mask & (rho < 1)
        assert torch.allclose(g[small], want[small]) and (w[small] == rho[small]).all()


@SET
@given(case)
def test_cispo_without_clipping_is_the_importance_weighted_reinforce_gradient(c):
    logp, old, adv, mask = unpack(c)
    _, g = loss_and_grad(cispo, logp, old, adv, mask, eps_high=math.inf)

    def surrogate(lp):  # −ρ·A, whose gradient is −ρ·A·∇log π: REINFORCE importance-weighted by ρ
        return torch.where(mask, -(lp - old).exp() * per_token(adv, mask), 0.0)

    leaf = logp.clone().requires_grad_(True)
    surrogate(leaf).sum().backward()
    assert torch.allclose(g, leaf.grad, atol=1e-12), (
        f"CISPO unclipped: {g.tolist()} vs ∇(−ρA) {leaf.grad.tolist()}"
    )
    _, g_on = loss_and_grad(cispo, old, old, adv, mask, eps_high=math.inf)
    leaf = old.clone().requires_grad_(True)
    torch.where(mask, -per_token(adv, mask) * leaf, 0.0).sum().backward()  # REINFORCE: −A·log π
    assert torch.equal(g_on, leaf.grad), "on-policy CISPO must be exactly REINFORCE's −A·∇log π"


def test_cispo_hand_values():
    logp, old = T([[math.log(8.0), math.log(0.5)]]), T([[0.0, 0.0]])
    loss = cispo(logp, old, T([1.0]), eps_high=4.0)  # weights min(8, 5) = 5 and 0.5
    assert torch.allclose(loss, T([[-5 * math.log(8.0), -0.5 * math.log(0.5)]])), loss
    both = cispo(logp, old, T([1.0]), eps_low=0.2, eps_high=4.0)  # verl: 0.5 raised to 0.8
    assert torch.allclose(both, T([[-5 * math.log(8.0), -0.8 * math.log(0.5)]])), both


# ---- GMPO ----------------------------------------------------------------------------------------


def geometric_objective(logp, old, adv, mask):
    """exp(mean over valid tokens of log ρ)·A per row (B,), written out independently."""
    n = mask.sum(1).clamp(min=1)
    return torch.where(mask, logp - old, 0.0).sum(1).div(n).exp() * adv


@SET
@given(case)
def test_gmpo_with_infinite_eps_is_the_geometric_mean_ratio_times_a_under_seq_mean_token_sum(c):
    logp, old, adv, mask = unpack(c)
    loss, g = loss_and_grad(gmpo, logp, old, adv, mask, eps=math.inf)
    J = geometric_objective(logp, old, adv, mask)
    paper = -(J * mask.any(1)).mean()  # (1/B) Σ_i −J_i, an empty row contributing 0
    got = aggregate(loss, mask, "seq-mean-token-sum")
    assert torch.allclose(got, paper, atol=1e-12), (
        f"GMPO (ε = ∞) under seq-mean-token-sum: {got} vs {paper}"
    )
    n = mask.sum(1, keepdim=True).clamp(min=1)
    # d/d log ρ_t of −exp(mean)·A = −J/|o|
    want = torch.where(mask, (-J[:, None] / n).expand_as(g), 0.0)
    assert torch.allclose(g, want, atol=1e-12), (
        f"GMPO gradient must be −J_i/|o_i| per token: {g} vs {want}"
    )


@SET
@given(case, st.floats(0.05, 1.0))
def test_gmpo_clipped_objective_never_exceeds_the_unclipped_geometric_mean(c, eps):
    logp, old, adv, mask = unpack(c)
    clipped = -call(gmpo, logp, old, adv, mask, eps=eps).sum(1)  # J_i
    free = geometric_objective(logp, old, adv, mask) * mask.any(1)
    assert (clipped <= free + 1e-12).all(), (
        f"GMPO's clip must be pessimistic: {clipped.tolist()} > {free.tolist()}"
    )


def test_gmpo_clip_binds_per_token_on_the_sign_of_a_and_then_stops_its_gradient():
    old = T([[0.0, 0.0]])
    logp = T([[1.0, 0.1]])  # log ρ = 1 (beyond ε = 0.4) and 0.1 (inside)
    loss, g = loss_and_grad(gmpo, logp, old, T([2.0]), None)
    J = math.exp((0.4 + 0.1) / 2) * 2.0  # A > 0: min(log ρ, clip) caps the first at 0.4
    assert torch.allclose(loss.sum(), T(-J)), (
        f"A > 0: J = exp(mean(0.4, 0.1))·A = {J}, got {-loss.sum()}"
    )
    assert g[0, 0] == 0 and g[0, 1] != 0, f"the capped token gets no gradient, the other does: {g}"
    loss, g = loss_and_grad(gmpo, logp, old, T([-2.0]), None)
    assert torch.allclose(loss.sum(), T(math.exp(0.55) * 2.0)), (
        "A < 0: max(log ρ, clip) keeps log ρ = 1 (pessimistic)"
    )
    assert (g != 0).all()
    # log ρ = −1: capped at −0.4 for A < 0
    loss, g = loss_and_grad(gmpo, -logp, old, T([-2.0]), None)
    assert (
        torch.allclose(loss.sum(), T(math.exp((-0.4 - 0.1) / 2) * 2.0))
        and g[0, 0] == 0
        and g[0, 1] != 0
    )


def test_gmpo_takes_the_row_mean_of_token_advantages_and_ignores_padding():
    logp, old, mask = (
        T([[0.2, -0.1, 7.0]]),
        T([[0.0, 0.0, 0.0]]),
        torch.tensor([[True, True, False]]),
    )
    by_token = gmpo(logp, old, T([[1.0, 3.0, 99.0]]), mask)
    assert torch.allclose(by_token, gmpo(logp, old, T([2.0]), mask)), (
        "(B, T) advantages: their valid-token mean"
    )


# ---- SAPO ----------------------------------------------------------------------------------------


@SET
@given(case, st.floats(0.5, 3.0), st.floats(0.5, 3.0))
def test_sapo_gradient_is_the_papers_sigmoid_weight_never_above_the_unclipped_one(
    c, tau_pos, tau_neg
):
    logp, old, adv, mask = unpack(c)
    loss, g = loss_and_grad(sapo, logp, old, adv, mask, tau_pos=tau_pos, tau_neg=tau_neg)
    A, rho = per_token(adv, mask), torch.where(mask, logp - old, 0.0).exp()
    tau = torch.where(A > 0, tau_pos, tau_neg)
    s = torch.sigmoid(tau * (rho - 1))
    assert torch.allclose(loss, torch.where(mask, -4 / tau * s * A, 0.0), atol=1e-12), (
        "loss must be −(4/τ)σ(τ(ρ−1))·A"
    )
    # the paper's eq. 6 weight, gradient through ρ
    want = torch.where(mask, -4 * s * (1 - s) * rho * A, 0.0)
    assert torch.allclose(g, want, atol=1e-12), (
        f"SAPO gradient {g.tolist()} vs −4σ(1−σ)ρA {want.tolist()}"
    )
    assert (g.abs() <= (rho * A).abs() + 1e-12).all(), (
        "SAPO's gradient never exceeds the unclipped |ρA|"
    )


def test_sapo_gate_hand_values_and_the_asymmetric_temperature():
    assert torch.allclose(sapo_gate(T([1.0]), 2.0), T([1.0])), "f(1) = (4/τ)·½ = 2/τ"
    logp, old = T([[0.3, 0.3]]), T([[0.0, 0.0]])
    loss = sapo(logp, old, T([[1.0, -1.0]]), tau_pos=1.0, tau_neg=3.0)
    rho = math.exp(0.3)
    want = [-4 * torch.sigmoid(T(rho - 1)).item(), 4 / 3 * torch.sigmoid(T(3 * (rho - 1))).item()]
    assert torch.allclose(loss, T([want])), f"τ_pos for A > 0, τ_neg for A < 0: {loss} vs {want}"


@pytest.mark.parametrize("delta", [0.1, 0.2])
def test_sapo_as_tau_grows_the_gradient_vanishes_outside_one_plus_minus_delta_on_both_sides(delta):
    """Pinned: |∂L/∂log ρ| ≤ 4ρ·e^{−τδ}|A| whenever |ρ − 1| ≥ δ, so with τ → ∞ SAPO gives no
    gradient where PPO's clip (ε = δ) gives none, AND also on the side PPO never clips; at ρ = 1 it
    stays −A."""
    rho = T([[1 - 2 * delta, 1 - delta, 1.0, 1 + delta, 1 + 2 * delta]])
    old = torch.zeros_like(rho)
    for a in (1.0, -1.0):
        adv = T([a])
        _, ppo = loss_and_grad(clipped_surrogate, rho.log(), old, adv, None, eps_low=delta * 0.99)
        previous = math.inf
        for tau in (10.0, 50.0, 200.0):
            _, g = loss_and_grad(sapo, rho.log(), old, adv, None, tau_pos=tau, tau_neg=tau)
            outside = (rho - 1).abs() >= delta - 1e-12
            bound = 4 * rho * math.exp(-tau * delta)
            assert (g[outside].abs() <= bound[outside] + 1e-15).all(), (
                f"τ={tau}: {g} above 4ρe^(−τδ)"
            )
            assert abs(g[0, 2].item() + a) < 1e-12, "at ρ = 1 the gradient stays −A whatever τ"
            assert g[outside].abs().max() < previous, (
                "the gradient outside the window shrinks as τ grows"
            )
            previous = g[outside].abs().max().item()
        assert g[outside].abs().max() < 1e-7, (
            f"τ = 200: the gradient outside [1−δ, 1+δ] must be ~0: {g}"
        )
        assert (ppo[outside] == 0).sum() == 2 and (ppo[outside] != 0).sum() == 2, (
            f"PPO's clip zeroes one side only (A = {a}): {ppo}; SAPO's large-τ limit zeroes both"
        )
