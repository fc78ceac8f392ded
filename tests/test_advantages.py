"""Properties of the advantage estimators (minigrpo/advantages.py). Each test name is the property."""

import math

import torch
from hypothesis import given, settings, strategies as st

from minigrpo.advantages import explained_variance, gae, group_advantages, rloo_advantages, whiten

SET = settings(deadline=None, max_examples=60)
rewards_strategy = st.integers(1, 4).flatmap(lambda B: st.integers(2, 8).flatmap(
    lambda G: st.lists(st.lists(st.floats(-10, 10, width=32), min_size=G, max_size=G), min_size=B, max_size=B)))


def R(rows):
    return torch.tensor(rows, dtype=torch.float64)


@SET
@given(rewards_strategy, st.sampled_from(["group", "batch", "none"]))
def test_zero_mean_per_group(rows, scale):
    a = group_advantages(R(rows), scale=scale)
    assert a.mean(1).abs().max() < 1e-9, f"group means {a.mean(1).tolist()} for rewards {rows}"


@SET
@given(rewards_strategy)
def test_unit_bessel_std_per_group_when_eps_is_zero(rows):
    r = R(rows)
    a = group_advantages(r, eps=0.0)
    for i, row in enumerate(r):
        if row.unique().numel() > 1 and row.std() > 1e-6:
            assert abs(a[i].std().item() - 1) < 1e-6, f"std {a[i].std().item()} for rewards {row.tolist()}"


@SET
@given(rewards_strategy, st.floats(0.1, 10), st.floats(-5, 5), st.sampled_from(["group", "batch"]))
def test_invariant_under_positive_affine_maps_and_sign_flipped_by_negative(rows, a, b, scale):
    r = R(rows)
    base = group_advantages(r, scale=scale, eps=0.0)
    assert torch.allclose(group_advantages(a * r + b, scale=scale, eps=0.0), base, atol=1e-6), "a>0 changed A"
    assert torch.allclose(group_advantages(-a * r + b, scale=scale, eps=0.0), -base, atol=1e-6), "a<0 must flip A"


@SET
@given(rewards_strategy, st.floats(0.1, 10))
def test_scale_none_scales_with_the_rewards(rows, a):
    r = R(rows)
    assert torch.allclose(group_advantages(a * r, scale="none"), a * group_advantages(r, scale="none"), atol=1e-9)


@SET
@given(rewards_strategy, st.randoms())
def test_permutation_equivariant_within_a_group(rows, rnd):
    r = R(rows)
    perm = list(range(r.size(1)))
    rnd.shuffle(perm)
    assert torch.allclose(group_advantages(r[:, perm]), group_advantages(r)[:, perm], atol=1e-12)


@SET
@given(rewards_strategy, st.floats(-10, 10))
def test_groups_are_independent_in_group_mode(rows, new_value):
    r = R(rows)
    if r.size(0) < 2:
        return
    changed = r.clone()
    changed[1:] = new_value + changed[1:] * 0.5
    assert torch.equal(group_advantages(changed)[0], group_advantages(r)[0]), "group 0 saw another group"


@SET
@given(rewards_strategy)
def test_monotone_in_reward(rows):
    r = R(rows)
    a = group_advantages(r)
    for i in range(r.size(0)):
        order = torch.argsort(r[i])
        assert (a[i][order].diff() >= -1e-12).all(), f"higher reward got lower advantage: {r[i].tolist()}"


@SET
@given(st.integers(1, 8), st.sampled_from([0.0, 1.0, -3.5, 1e6]), st.sampled_from(["group", "batch", "none"]))
def test_equal_rewards_give_exactly_zero(G, value, scale):
    a = group_advantages(torch.full((3, G), value), scale=scale)
    assert (a == 0).all(), f"equal rewards {value} gave {a.tolist()}"


def test_near_equal_rewards_stay_finite_and_bounded():
    r = torch.tensor([[1.0, 1.0 + 1e-9, 1.0, 1.0]], dtype=torch.float64)
    a = group_advantages(r)
    assert torch.isfinite(a).all() and a.abs().max() <= 3 / 2, a.tolist()


@SET
@given(rewards_strategy, st.floats(0, 1e-2))
def test_bounded_by_g_minus_one_over_sqrt_g(rows, eps):
    r = R(rows)
    G = r.size(1)
    assert group_advantages(r, eps=eps).abs().max() <= (G - 1) / math.sqrt(G) + 1e-9


def test_group_of_one_gives_zero():
    assert (group_advantages(torch.tensor([[3.0], [5.0]])) == 0).all()
    assert (rloo_advantages(torch.tensor([[3.0], [5.0]])) == 0).all()


@SET
@given(rewards_strategy)
def test_rloo_is_g_over_g_minus_one_times_centered_reward(rows):
    r = R(rows)
    G = r.size(1)
    expected = G / (G - 1) * (r - r.mean(1, keepdim=True))
    assert torch.allclose(rloo_advantages(r), expected, atol=1e-9)


def test_worked_example_bessel_and_population():
    r = torch.tensor([[1.0, 1, 1, 1, 0, 0, 0, 0]])
    bessel = group_advantages(r, eps=0.0)
    pop = group_advantages(r, unbiased=False, eps=0.0)
    assert torch.allclose(bessel, torch.tensor([[0.9354] * 4 + [-0.9354] * 4]), atol=1e-4), bessel
    assert torch.allclose(pop, torch.tensor([[1.0] * 4 + [-1.0] * 4]), atol=1e-6), pop


def test_unknown_scale_names_the_choices():
    try:
        group_advantages(torch.zeros(1, 2), scale="std")
    except ValueError as e:
        assert "group" in str(e) and "none" in str(e)
    else:
        raise AssertionError("expected ValueError")


# ---- GAE -------------------------------------------------------------------------------------

def naive_gae(rewards, values, lengths, gamma, lam):
    B, T = rewards.shape
    adv = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        n = lengths[b]
        for t in range(n):
            total = 0.0
            for k in range(t, n):  # A_t = Σ_k (γλ)^(k−t) δ_k
                v_next = values[b, k + 1].item() if k + 1 < n else 0.0
                delta = rewards[b, k].item() + gamma * v_next - values[b, k].item()
                total += (gamma * lam) ** (k - t) * delta
            adv[b, t] = total
    return adv


gae_case = st.integers(1, 3).flatmap(lambda B: st.integers(1, 6).flatmap(lambda T: st.tuples(
    st.lists(st.lists(st.floats(-3, 3), min_size=T, max_size=T), min_size=B, max_size=B),
    st.lists(st.lists(st.floats(-3, 3), min_size=T, max_size=T), min_size=B, max_size=B),
    st.lists(st.integers(0, T), min_size=B, max_size=B))))


def _mask(lengths, T):
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


@SET
@given(gae_case, st.floats(0, 1), st.floats(0, 1))
def test_gae_equals_a_naive_double_loop(case, gamma, lam):
    rw, vals, lengths = case
    r, v = R(rw), R(vals)
    adv, ret = gae(r, v, _mask(lengths, r.size(1)), gamma, lam)
    assert torch.allclose(adv, naive_gae(r, v, lengths, gamma, lam), atol=1e-9)
    mask = _mask(lengths, r.size(1))
    assert torch.allclose(ret, torch.where(mask, adv + v, 0.0)), "returns must be advantages + values"


@SET
@given(gae_case)
def test_gae_lambda_one_gamma_one_is_reward_to_go_minus_value(case):
    rw, vals, lengths = case
    r, v = R(rw), R(vals)
    mask = _mask(lengths, r.size(1))
    adv, _ = gae(r, v, mask, 1.0, 1.0)
    to_go = torch.where(mask, r, 0.0).flip(1).cumsum(1).flip(1)
    assert torch.allclose(adv, torch.where(mask, to_go - v, 0.0), atol=1e-9)


@SET
@given(gae_case, st.floats(0, 1))
def test_gae_lambda_zero_is_the_td_error(case, gamma):
    rw, vals, lengths = case
    r, v = R(rw), R(vals)
    mask = _mask(lengths, r.size(1))
    adv, _ = gae(r, v, mask, gamma, 0.0)
    v_next = torch.where(mask, v, 0.0).roll(-1, 1)
    v_next[:, -1] = 0
    v_next = torch.where(_mask([n - 1 for n in lengths], r.size(1)), v_next, 0.0)  # no bootstrap past the end
    assert torch.allclose(adv, torch.where(mask, r + gamma * v_next - v, 0.0), atol=1e-9)


@SET
@given(gae_case, st.floats(-3, 3), st.floats(0, 1), st.floats(0, 1))
def test_gae_is_linear_in_rewards(case, c, gamma, lam):
    rw, vals, lengths = case
    r, v = R(rw), R(vals)
    mask = _mask(lengths, r.size(1))
    a1, _ = gae(r, torch.zeros_like(v), mask, gamma, lam)
    a2, _ = gae(c * r, torch.zeros_like(v), mask, gamma, lam)
    assert torch.allclose(a2, c * a1, atol=1e-9)


@SET
@given(gae_case, st.floats(0, 1), st.floats(0, 1))
def test_gae_appended_masked_steps_change_nothing(case, gamma, lam):
    rw, vals, lengths = case
    r, v = R(rw), R(vals)
    mask = _mask(lengths, r.size(1))
    adv, ret = gae(r, v, mask, gamma, lam)
    pad = torch.full((r.size(0), 3), float("nan"), dtype=torch.float64)
    adv2, ret2 = gae(torch.cat([r, pad], 1), torch.cat([v, pad], 1), torch.cat([mask, torch.zeros(r.size(0), 3, dtype=torch.bool)], 1), gamma, lam)
    assert torch.equal(adv2[:, : r.size(1)], adv) and (adv2[:, r.size(1):] == 0).all() and torch.isfinite(ret2).all()


# ---- whiten, explained variance ----------------------------------------------------------------

@SET
@given(gae_case)
def test_whiten_gives_masked_mean_zero_and_variance_one_and_ignores_garbage(case):
    rw, _, lengths = case
    x = R(rw)
    mask = _mask(lengths, x.size(1))
    w = whiten(torch.where(mask, x, float("nan")), mask)
    assert torch.isfinite(w).all() and (w[~mask] == 0).all()
    if mask.sum() > 1 and x[mask].var(unbiased=False) > 1e-6:
        assert abs(w[mask].mean().item()) < 1e-6 and abs(w[mask].var(unbiased=False).item() - 1) < 1e-4


def test_explained_variance_hand_examples():
    ret = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones_like(ret, dtype=torch.bool)
    assert explained_variance(ret, ret, mask).item() == 1.0
    assert abs(explained_variance(torch.full_like(ret, 2.5), ret, mask).item()) < 1e-7
    # residuals [0.5, -0.5, 0.5, -0.5]: Var 0.25 against Var[R] 1.25 -> 1 - 0.2 = 0.8
    assert abs(explained_variance(ret + torch.tensor([[-0.5, 0.5, -0.5, 0.5]]), ret, mask).item() - 0.8) < 1e-6
    assert explained_variance(ret, torch.ones_like(ret), mask).item() == 0.0  # nothing to explain
