"""Properties of minigrpo/objectives/entropy_control.py: the token covariance (and Cui et al.'s
entropy claim by exact enumeration), Clip-Cov's random detach, KL-Cov's top-share penalty, the
top-entropy mask and Skywork-OR1's adaptive coefficient. Float64 throughout."""

import math

import pytest
import torch
from conftest import SET, T, call, garbage, right_padded
from hypothesis import given
from hypothesis import strategies as st

from minigrpo.objectives.entropy_control import (
    applied_coef,
    clip_cov_mask,
    kl_cov_penalty,
    next_coef,
    token_covariance,
    top_cov_mask,
    top_entropy_mask,
)

case = st.integers(1, 4).flatmap(
    lambda B: st.integers(1, 6).flatmap(
        lambda L: st.tuples(
            st.lists(st.lists(st.floats(-4, 0), min_size=L, max_size=L), min_size=B, max_size=B),
            st.lists(st.floats(-2, 2), min_size=B, max_size=B),
            st.lists(st.integers(0, L), min_size=B, max_size=B),
        )
    )
)


def unpack(c):
    logp, adv, lengths = c
    lp = T(logp)
    return lp, T(adv), right_padded(lengths, lp.size(1))


# ---- token covariance ----------------------------------------------------------------------------


@SET
@given(case, st.floats(-3, 3), st.floats(-3, 3))
def test_token_covariance_averages_to_the_covariance_and_ignores_shifts_and_padding(
    c, shift_a, shift_lp
):
    lp, adv, mask = unpack(c)
    cov = call(token_covariance, lp, adv, mask, shape=lp.shape)
    a, l = adv[:, None].expand_as(lp)[mask], lp[mask]
    if mask.any():
        # population covariance over the valid tokens
        want = ((a - a.mean()) * (l - l.mean())).mean()
        assert torch.allclose(cov[mask].mean(), want, atol=1e-12), (
            f"mean c_t = {cov[mask].mean()}, Cov = {want}"
        )
    assert (cov[~mask] == 0).all()
    moved = token_covariance(garbage(lp + shift_lp, mask), adv + shift_a, mask)
    assert torch.allclose(moved, cov, atol=1e-9), (
        "constant shifts of log π or A, or junk in padding, changed c_t"
    )
    flat = token_covariance(lp, torch.full_like(adv, 0.7), mask)
    assert (flat.abs() < 1e-12).all(), "a constant advantage carries no covariance"


def test_token_covariance_carries_no_gradient():
    lp = T([[-1.0, -2.0]], grad=True)
    assert not token_covariance(lp, T([1.0]), torch.ones(1, 2, dtype=torch.bool)).requires_grad


@pytest.mark.parametrize("seed", range(4))
def test_entropy_change_under_a_natural_gradient_step_is_minus_eta_times_the_mean_token_covariance(
    seed,
):
    """Cui et al.'s first-order claim by exact enumeration: a softmax over 5 actions with rational
    probabilities (counts/20), a batch holding each action `count` times so that batch means are
    exact expectations under π, one natural-gradient step z_a += η·A(a): ΔH/η → −Cov(log π, A) =
    −mean c_t."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor([1, 2, 3, 5, 9])
    logits = counts.double().log()  # π = counts / 20
    action_adv = torch.randn(5, generator=g, dtype=torch.float64)
    # 20 tokens, action a appearing counts[a] times
    tokens = torch.repeat_interleave(torch.arange(5), counts)
    lp, adv = logits.log_softmax(-1)[tokens][None, :], action_adv[tokens][None, :]
    mean_cov = token_covariance(lp, adv, torch.ones_like(lp, dtype=torch.bool)).mean()

    def H(z):
        return -(z.softmax(-1) * z.log_softmax(-1)).sum()

    for eta in (1e-3, 1e-5):
        slope = (H(logits + eta * action_adv) - H(logits)) / eta
        assert abs(slope + mean_cov) < 10 * eta, f"η={eta}: ΔH/η = {slope}, −mean c_t = {-mean_cov}"


# ---- Clip-Cov ------------------------------------------------------------------------------------

cov_case = st.integers(1, 4).flatmap(
    lambda B: st.integers(1, 8).flatmap(
        lambda L: st.tuples(
            st.lists(st.lists(st.floats(-2, 7), min_size=L, max_size=L), min_size=B, max_size=B),
            st.lists(st.integers(0, L), min_size=B, max_size=B),
        )
    )
)


@SET
@given(cov_case, st.sampled_from([2e-4, 0.1, 0.3, 1.0]), st.integers(0, 10**6))
def test_clip_cov_picks_the_documented_number_of_candidates_inside_the_band(c, ratio, seed):
    cov = T(c[0])
    mask = right_padded(c[1], cov.size(1))
    exclude = cov > 4.5  # e.g. tokens PPO's clip already stops
    chosen = call(
        clip_cov_mask,
        garbage(cov, mask),
        mask,
        ratio,
        1.0,
        5.0,
        torch.Generator().manual_seed(seed),
        exclude,
        shape=cov.shape,
    )
    candidate = mask & (cov >= 1) & (cov <= 5) & ~exclude
    n = int(mask.sum())
    want = min(max(1, int(ratio * n)) if n else 0, int(candidate.sum()))
    assert chosen.dtype == torch.bool and int(chosen.sum()) == want, (
        f"chose {int(chosen.sum())}, want {want}"
    )
    assert not (chosen & ~candidate).any(), (
        "only valid, non-excluded tokens with c_t in [1, 5] may be chosen"
    )
    again = clip_cov_mask(cov, mask, ratio, 1.0, 5.0, torch.Generator().manual_seed(seed), exclude)
    assert torch.equal(again, chosen), "the same generator seed must give the same choice"


def test_clip_cov_choice_is_random_over_the_candidates():
    cov = T([[0.5, 1.5, 2.0, 3.0, 9.0]])
    mask = torch.ones_like(cov, dtype=torch.bool)
    hits = sum(
        clip_cov_mask(cov, mask, 2e-4, generator=torch.Generator().manual_seed(s)).long()
        for s in range(300)
    )
    assert hits[0, [0, 4]].tolist() == [0, 0], "outside [1, 5]: never"
    assert (hits[0, 1:4] > 60).all() and hits.sum() == 300, (
        f"one token a draw, each candidate ~1/3: {hits}"
    )


# ---- KL-Cov --------------------------------------------------------------------------------------


@SET
@given(case, st.sampled_from([2e-4, 0.25, 0.5]), st.floats(0.1, 3))
def test_kl_cov_penalises_exactly_the_top_share_by_covariance_with_coef_abs_log_ratio(
    c, ratio, coef
):
    lp, adv, mask = unpack(c)
    old = lp + torch.linspace(-0.6, 0.5, lp.numel(), dtype=torch.float64).view_as(lp)
    cov = token_covariance(lp, adv, mask)
    chosen = call(top_cov_mask, cov, mask, ratio, shape=lp.shape)
    n = int(mask.sum())
    assert int(chosen.sum()) == (max(1, int(ratio * n)) if n else 0), (
        "max(1, ⌊ratio·N⌋) tokens, 0 if none valid"
    )
    if chosen.any() and (mask & ~chosen).any():
        assert cov[chosen].min() >= cov[mask & ~chosen].max(), (
            "every chosen c_t ≥ every other valid c_t"
        )
    leaf = garbage(lp, mask).requires_grad_(True)
    pen = call(kl_cov_penalty, leaf, garbage(old, mask), cov, mask, ratio, coef, shape=lp.shape)
    want = torch.where(chosen, coef * (lp - old).abs(), 0.0)
    assert torch.allclose(pen, want, atol=1e-12), (
        f"penalty {pen.tolist()} vs k·|log ρ| on the chosen {want.tolist()}"
    )
    pen.sum().backward()
    assert torch.allclose(leaf.grad, torch.where(chosen, coef * (lp - old).sign(), 0.0)), (
        "k·sign(log ρ) on chosen"
    )


# ---- top-entropy mask ----------------------------------------------------------------------------

ent_case = st.integers(1, 4).flatmap(
    lambda B: st.integers(1, 8).flatmap(
        lambda L: st.tuples(
            st.lists(
                st.lists(
                    st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.3, 2.0]) | st.floats(0, 3),
                    min_size=L,
                    max_size=L,
                ),
                min_size=B,
                max_size=B,
            ),
            st.lists(st.integers(0, L), min_size=B, max_size=B),
        )
    )
)


@SET
@given(ent_case, st.floats(0.0, 1.0))
def test_top_entropy_mask_keeps_the_top_share_with_ties_and_never_padding(c, rho):
    ent = T(c[0])
    mask = right_padded(c[1], ent.size(1))
    keep = call(top_entropy_mask, garbage(ent, mask), mask, rho, shape=ent.shape)
    n = int(mask.sum())
    k = min(n, math.ceil(rho * n - 1e-9))
    assert not (keep & ~mask).any(), "padding never carries the loss"
    assert int(keep.sum()) >= k, f"at least ⌈ρN⌉ = {k} tokens, got {int(keep.sum())}"
    if keep.any() and (mask & ~keep).any():
        assert ent[keep].min() > ent[mask & ~keep].max(), (
            "every kept entropy above every dropped one"
        )
    if len(set(ent[mask].tolist())) == n:
        assert int(keep.sum()) == k, "distinct entropies: exactly ⌈ρN⌉ kept"


def test_top_entropy_mask_edge_cases():
    ent = T([[0.3, 0.9, 0.9, 0.1, 5.0]])
    mask = torch.tensor([[True, True, True, True, False]])
    assert top_entropy_mask(ent, mask, 0.2).tolist() == [[False, True, True, False, False]], (
        "ties at h both kept"
    )
    assert (
        torch.equal(top_entropy_mask(ent, mask, 1.0), mask)
        and not top_entropy_mask(ent, mask, 0.0).any()
    )
    assert not top_entropy_mask(ent, torch.zeros_like(mask), 0.5).any(), "no valid token: none kept"
    assert (
        top_entropy_mask(
            T([[float(i) for i in range(30)]]), torch.ones(1, 30, dtype=torch.bool), 0.1
        ).sum()
        == 3
    )


# ---- adaptive entropy coefficient ----------------------------------------------------------------


@SET
@given(
    st.floats(0, 0.01),
    st.floats(0, 2),
    st.floats(0, 2),
    st.floats(1e-5, 1e-3),
    st.floats(0.002, 0.01),
)
def test_next_coef_steps_toward_raising_a_low_entropy_and_stays_in_bounds(
    coef, entropy, target, step, hi
):
    coef = min(coef, hi)
    new = next_coef(coef, entropy, target, step, 0.0, hi)
    assert 0.0 <= new <= hi, f"{new} outside [0, {hi}]"
    if entropy < target:
        assert new == min(coef + step, hi), "below the target: c + Δ (capped)"
    elif entropy > target:
        assert new == max(coef - step, 0.0), "above the target: c − Δ (floored)"
    else:
        assert new == coef
    assert applied_coef(coef, entropy, target) == (coef if entropy <= target else 0.0), (
        "α = c·1[e ≤ target]"
    )


def test_adaptive_coef_closes_the_loop_around_the_target():
    """A toy plant: entropy drifts down by 0.01 a step and rises by 20·α. From c = 0 the controller
    ramps c up while e < target, then hovers: e ends within a band around the target and c stays
    bounded."""
    e, c, target = 0.5, 0.0, 0.3
    history = []
    for _ in range(2000):
        alpha = applied_coef(c, e, target)
        c = next_coef(c, e, target, 1e-4, 0.0, 0.005)
        e = e - 0.01 + 20 * alpha
        history.append(e)
    late = history[-500:]
    assert min(late) > target - 0.15 and max(late) < target + 0.15, (
        f"entropy not held near {target}: [{min(late):.3f}, {max(late):.3f}]"
    )
    assert 0 <= c <= 0.005
