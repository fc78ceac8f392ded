"""Properties of minigrpo/objectives/advantages.py. Each test's name is the property it proves; a
failure says which property broke and on what input. Float64 wherever a tolerance matters."""

import math

import pytest
import torch
from conftest import SET, call, garbage, naive_gae, right_padded
from hypothesis import example, given
from hypothesis import strategies as st

from minigrpo.objectives.advantages import (
    batch_scaled,
    explained_variance,
    gae,
    group_advantages,
    kl_shaped_rewards,
    rloo_advantages,
    whiten,
)

SCALES = ["group", "batch", "none"]


def R(rows):
    return torch.tensor(rows, dtype=torch.float64)


def adv(r, **kw):
    return call(group_advantages, r, shape=r.shape, **kw)


# rewards (B, G): any floats, or a coarse grid (exact under affine maps, like real 0/1 rewards)
def reward_rows(value=st.floats(-10, 10), B=(1, 4), G=(2, 8)):
    return st.integers(*B).flatmap(
        lambda b: st.integers(*G).flatmap(
            lambda g: st.lists(st.lists(value, min_size=g, max_size=g), min_size=b, max_size=b)
        )
    )


grid = st.integers(-40, 40).map(lambda k: k / 4)


def distinct(rows_strategy):
    """Every row gets at least two different rewards: its last entry is moved away from its
    first."""
    return st.tuples(rows_strategy, st.floats(0.25, 5)).map(
        lambda c: [row[:-1] + [row[0] + c[1]] for row in c[0]]
    )


@SET
@given(reward_rows(), st.sampled_from(SCALES), st.booleans())
def test_zero_mean_per_group(rows, scale, unbiased):
    a = adv(R(rows), scale=scale, unbiased=unbiased)
    assert a.mean(1).abs().max() < 1e-9, (
        f"zero mean per group broken: rewards {rows} ({scale}) gave A {a.tolist()}"
    )


@SET
@given(distinct(reward_rows()))
def test_unit_std_per_group_when_eps_is_zero_and_rewards_differ(rows):
    r = R(rows)
    bessel = adv(r, eps=0.0).std(1, unbiased=True)
    population = adv(r, eps=0.0, unbiased=False).std(1, unbiased=False)
    assert torch.allclose(bessel, torch.ones_like(bessel), atol=1e-9), (
        f"Bessel std of A per group should be 1 (std with ÷(G−1)), got {bessel.tolist()} for "
        f"rewards {rows}"
    )
    assert torch.allclose(population, torch.ones_like(population), atol=1e-9), (
        "unbiased=False: population std of A per group should be 1 (÷G), got "
        f"{population.tolist()} for {rows}"
    )


@SET
@given(reward_rows(grid), st.floats(0.1, 10), st.floats(-5, 5), st.sampled_from(["group", "batch"]))
def test_invariant_under_positive_affine_maps_and_sign_flipped_by_negative_ones(rows, a, b, scale):
    r = R(rows)
    base = adv(r, scale=scale, eps=0.0)
    pos, neg = adv(a * r + b, scale=scale, eps=0.0), adv(-a * r + b, scale=scale, eps=0.0)
    assert torch.allclose(pos, base, atol=1e-9), (
        f"r -> {a}·r + {b} changed A: {base.tolist()} -> {pos.tolist()}"
    )
    assert torch.allclose(neg, -base, atol=1e-9), (
        f"r -> −{a}·r + {b} must flip A: {base.tolist()} -> {neg.tolist()}"
    )


@SET
@given(reward_rows(), st.floats(-10, 10))
def test_scale_none_is_the_centred_reward_and_scales_with_a(rows, a):
    r = R(rows)
    none = adv(r, scale="none")
    assert torch.allclose(none, r - r.mean(1, keepdim=True), atol=1e-9), (
        f"scale='none' must be r − group mean: {rows}"
    )
    assert torch.allclose(adv(a * r, scale="none"), a * none, atol=1e-8), (
        f"scale='none' must scale by a={a}: {rows}"
    )


@SET
@given(reward_rows(), st.sampled_from(SCALES), st.randoms(use_true_random=False))
def test_permutation_equivariant_within_a_group(rows, scale, rnd):
    r = R(rows)
    perm = list(range(r.size(1)))
    rnd.shuffle(perm)
    got, want = adv(r[:, perm], scale=scale), adv(r, scale=scale)[:, perm]
    assert torch.allclose(got, want, atol=1e-9), (
        f"shuffling a group must shuffle its A the same way: {rows}, {perm}"
    )


@SET
@given(reward_rows(B=(2, 4)), st.floats(-10, 10), st.floats(0.1, 5))
def test_groups_are_independent_in_group_mode(rows, shift, stretch):
    r = R(rows)
    other = r.clone()
    other[1:] = shift + stretch * other[1:]  # change every group but the first
    assert torch.allclose(adv(other)[0], adv(r)[0], rtol=0, atol=1e-12), (
        f"group 0's advantages changed when only other groups did: {rows}"
    )


@SET
@given(distinct(reward_rows(B=(2, 4))), st.booleans())
def test_batch_scale_keeps_the_group_mean_but_divides_by_one_std_over_the_whole_batch(
    rows, unbiased
):
    r = R(rows)
    want = (r - r.mean(1, keepdim=True)) / (r.flatten().std(unbiased=unbiased) + 1e-4)
    got = adv(r, scale="batch", unbiased=unbiased)
    assert torch.allclose(got, want, atol=1e-9), (
        f"scale='batch': (r − group mean) / (std of all B·G rewards + eps) "
        f"expected {want.tolist()}, got {got.tolist()} for {rows}"
    )


@SET
@given(reward_rows(), st.sampled_from(SCALES))
def test_monotone_in_reward(rows, scale):
    r = R(rows)
    a = adv(r, scale=scale)
    higher = r[:, :, None] > r[:, None, :]  # (B, G, G): r_i > r_j
    lower_adv = a[:, :, None] < a[:, None, :]
    assert not (higher & lower_adv).any(), (
        f"a higher reward got a lower advantage: rewards {rows}, A {a.tolist()}"
    )


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("value", [0.0, 1.0, -3.5, 0.1, 1e6])
def test_equal_rewards_give_exactly_zero(scale, dtype, value):
    for eps in (1e-4, 0.0):
        a = adv(torch.full((3, 5), value, dtype=dtype), scale=scale, eps=eps)
        assert (a == 0).all(), (
            f"all-equal rewards {value} ({dtype}, {scale}, eps={eps}) must give exactly 0, got {a}"
        )
    # an equal group inside a mixed batch
    mixed = torch.tensor([[0.1] * 3, [0.0, 1.0, 1.0]], dtype=dtype)
    assert (adv(mixed, scale=scale)[0] == 0).all(), (
        f"an all-equal group must give exactly 0 in {scale} mode"
    )


@pytest.mark.parametrize("base, step", [(1.0, 1e-9), (1e6, 1e-9), (0.0, 1e-200), (1e200, 1e186)])
def test_near_equal_rewards_stay_finite_and_bounded(base, step):
    r = R([[base, base + step, base, base + 2 * step]])
    for eps in (1e-4, 0.0):
        a = adv(r, eps=eps)
        assert torch.isfinite(a).all() and a.abs().max() <= 3 / 2 + 1e-9, (
            f"rewards {base} + multiples of {step} (eps={eps}) gave {a.tolist()}: must be finite "
            "and |A| ≤ (G−1)/√G "
            "(hint: scale the deviations before squaring them)"
        )


@SET
@given(reward_rows(), st.sampled_from([0.0, 1e-6, 1e-4, 1e-2, 1.0]))
def test_abs_advantage_at_most_g_minus_one_over_sqrt_g(rows, eps):
    G = len(rows[0])
    a = adv(R(rows), eps=eps)
    bound = (G - 1) / math.sqrt(G)
    assert a.abs().max() <= bound * (1 + 1e-9), (
        f"|A| = {a.abs().max():.6f} > (G−1)/√G = {bound:.6f} for {rows}"
    )


@pytest.mark.parametrize("scale", SCALES)
def test_group_of_one_gives_zero(scale):
    r = R([[3.0], [5.0], [-1.0]])
    assert (adv(r, scale=scale) == 0).all(), f"G = 1 must give 0 ({scale})"
    assert (call(rloo_advantages, r, shape=r.shape) == 0).all(), "rloo with G = 1 must give 0"


@SET
@given(reward_rows())
def test_rloo_is_reward_minus_leave_one_out_mean_which_is_g_over_g_minus_one_times_centred(rows):
    r = R(rows)
    B, G = r.shape
    got = call(rloo_advantages, r, shape=r.shape)
    # mean of the others
    loo = torch.stack([torch.cat([r[:, :i], r[:, i + 1 :]], 1).mean(1) for i in range(G)], 1)
    assert torch.allclose(got, r - loo, atol=1e-9), (
        f"RLOO must be r_i − mean_(j≠i) r_j: {rows} -> {got.tolist()}"
    )
    assert torch.allclose(got, G / (G - 1) * (r - r.mean(1, keepdim=True)), atol=1e-9)


@SET
@given(
    reward_rows(B=(0, 3)),
    st.sampled_from([0.1, 0.7, -3.5, 1e6, 0.0]),
    st.integers(2, 8),
    st.sampled_from([torch.float32, torch.float64]),
)
@example(rows=[], value=0.1, G=3, dtype=torch.float64)  # the mean of three 0.1s is not 0.1
def test_rloo_gives_exactly_zero_to_every_all_equal_group(rows, value, G, dtype):
    # the mean of G equal floats is not always that float: (r − r̄) is rounding noise
    equal = [[value] * G]
    r = torch.tensor(equal + [row[:G] + [0.0] * (G - len(row)) for row in rows], dtype=dtype)
    got = call(rloo_advantages, r, shape=r.shape)
    assert (got[0] == 0).all(), (
        f"an all-equal group {equal} ({dtype}) must give exactly 0, got {got[0].tolist()}"
    )


def test_worked_example_gives_0935_with_bessel_and_1_with_population_std():
    r = R([[1, 1, 1, 1, 0, 0, 0, 0]])
    sign = torch.tensor([[1.0] * 4 + [-1.0] * 4], dtype=torch.float64)
    bessel, pop = adv(r, eps=0.0), adv(r, eps=0.0, unbiased=False)
    assert torch.allclose(bessel, 0.9354 * sign, atol=1e-4), (
        f"Bessel std 0.5345 should give ±0.935, got {bessel}"
    )
    assert torch.allclose(pop, sign, atol=1e-12), f"population std 0.5 should give ±1.0, got {pop}"
    assert torch.allclose(adv(r), 0.5 / (0.53452 + 1e-4) * sign, atol=1e-4), (
        "default eps = 1e-4 is added to the std"
    )


def test_unknown_scale_raises_value_error_listing_the_choices():
    with pytest.raises(ValueError, match="group.*batch.*none"):
        group_advantages(torch.zeros(1, 2), scale="std")


# ---- PPO's KL-shaped rewards ---------------------------------------------------------------------

shaped_case = st.integers(1, 3).flatmap(
    lambda P: st.integers(1, 4).flatmap(
        lambda N: st.integers(1, 5).flatmap(
            lambda T: st.tuples(
                st.lists(st.floats(-3, 3), min_size=P * N, max_size=P * N),
                st.lists(st.floats(-5, 0), min_size=2 * P * N * T, max_size=2 * P * N * T),
                st.lists(st.integers(0, T), min_size=P * N, max_size=P * N),
                st.lists(st.floats(0, 2), min_size=P, max_size=P),
                st.just((P, N, T)),
            )
        )
    )
)


@SET
@given(shaped_case)
def test_kl_shaped_rewards_put_the_penalty_on_every_token_and_the_reward_on_the_last(case):
    """r_t = −β·(log π_old − log π_ref)_t on every valid token, plus the reward on the last one; 0
    where masked (garbage there reaches nothing); a row with no valid token gets nothing; per
    sequence Σ_t k1_t. With a leading dim of P members, each member's own β: each member's own
    call."""
    rewards, logps, lengths, betas, (P, N, T) = case
    r = torch.tensor(rewards, dtype=torch.float64).view(P, N)
    old, ref = torch.tensor(logps, dtype=torch.float64).view(2, P, N, T)
    mask = right_padded(lengths, T).view(P, N, T)
    beta = torch.tensor(betas, dtype=torch.float64)[:, None, None]
    got, kl_seq = kl_shaped_rewards(r, garbage(old, mask), garbage(ref, mask), mask, beta)
    k1 = torch.where(mask, old - ref, 0.0)
    assert torch.allclose(kl_seq, k1.sum(-1), atol=1e-12) and (got[~mask] == 0).all()
    # (P, N, T)
    last = torch.nn.functional.one_hot((mask.sum(-1) - 1).clamp(min=0), T).bool() & mask
    want = torch.where(mask, -beta * k1, 0.0) + torch.where(last, r[..., None], 0.0)
    assert torch.allclose(got, want, atol=1e-12), (got.tolist(), want.tolist())
    for p in range(P):  # the population's call is each member's own, β a float
        one, seq = kl_shaped_rewards(r[p], old[p], ref[p], mask[p], betas[p])
        assert torch.allclose(one, got[p], atol=1e-12) and torch.allclose(
            seq, kl_seq[p], atol=1e-12
        )


# ---- GAE ---------------------------------------------------------------------------------------

gae_case = st.integers(1, 3).flatmap(
    lambda B: st.integers(1, 6).flatmap(
        lambda T: st.tuples(
            st.lists(st.lists(st.floats(-3, 3), min_size=T, max_size=T), min_size=B, max_size=B),
            st.lists(st.lists(st.floats(-3, 3), min_size=T, max_size=T), min_size=B, max_size=B),
            st.lists(st.integers(0, T), min_size=B, max_size=B),
        )
    )
)


def run_gae(r, v, mask, gamma, lam):
    out = gae(r, v, mask, gamma, lam)
    assert isinstance(out, tuple) and len(out) == 2, (
        f"gae must return (advantages, returns), got {out!r}"
    )
    assert out[0].shape == r.shape and out[1].shape == r.shape, (
        "advantages and returns must be (B, T)"
    )
    return out


@SET
@given(gae_case, st.floats(0, 1), st.floats(0, 1))
def test_gae_equals_a_naive_double_loop_and_returns_are_advantages_plus_values(case, gamma, lam):
    rw, vals, lengths = case
    r, v = R(rw), R(vals)
    mask = right_padded(lengths, r.size(1))
    a, ret = run_gae(garbage(r, mask), garbage(v, mask), mask, gamma, lam)
    want = naive_gae(r, v, lengths, gamma, lam)
    assert torch.allclose(a, want, atol=1e-9), (
        f"GAE (γ={gamma}, λ={lam}) {a.tolist()} != naive {want.tolist()}"
    )
    assert torch.allclose(ret, torch.where(mask, a + v, 0.0), atol=1e-12), (
        "returns must be advantages + values"
    )
    assert (a[~mask] == 0).all() and (ret[~mask] == 0).all(), (
        "advantages and returns must be 0 at masked positions"
    )


@SET
@given(gae_case)
def test_gae_with_lambda_and_gamma_one_is_reward_to_go_minus_value(case):
    rw, vals, lengths = case
    r, v = R(rw), R(vals)
    mask = right_padded(lengths, r.size(1))
    a, _ = run_gae(r, v, mask, 1.0, 1.0)
    to_go = torch.where(mask, r, 0.0).flip(1).cumsum(1).flip(1)  # Σ_(k≥t) r_k
    assert torch.allclose(a, torch.where(mask, to_go - v, 0.0), atol=1e-9), (
        f"λ=γ=1 must give Σ_(k≥t) r_k − V_t: {case}"
    )


@SET
@given(gae_case, st.floats(0, 1))
def test_gae_with_lambda_zero_is_the_td_error(case, gamma):
    rw, vals, lengths = case
    r, v = R(rw), R(vals)
    T = r.size(1)
    mask = right_padded(lengths, T)
    a, _ = run_gae(r, v, mask, gamma, 0.0)
    v_next = torch.cat([v[:, 1:], torch.zeros(r.size(0), 1, dtype=v.dtype)], 1)
    # no bootstrap past the end
    v_next = torch.where(right_padded([n - 1 for n in lengths], T), v_next, 0.0)
    assert torch.allclose(a, torch.where(mask, r + gamma * v_next - v, 0.0), atol=1e-9), (
        f"λ=0 must give δ_t = r_t + γV_(t+1) − V_t (V = 0 after the last valid token): {case}"
    )


@SET
@given(gae_case, st.floats(-3, 3), st.floats(0, 1), st.floats(0, 1))
def test_gae_is_linear_in_rewards(case, c, gamma, lam):
    rw, other, lengths = case
    r, r2 = R(rw), R(other)  # two reward tensors of the same shape
    mask = right_padded(lengths, r.size(1))
    zero_v = torch.zeros_like(r)
    combined, _ = run_gae(c * r + r2, zero_v, mask, gamma, lam)
    separate = (
        c * run_gae(r, zero_v, mask, gamma, lam)[0] + run_gae(r2, zero_v, mask, gamma, lam)[0]
    )
    assert torch.allclose(combined, separate, atol=1e-9), (
        f"A(c·r + r') must equal c·A(r) + A(r') (V = 0): {case}"
    )


@SET
@given(gae_case, st.integers(1, 3), st.floats(0, 1), st.floats(0, 1))
def test_gae_appended_masked_steps_change_nothing(case, extra, gamma, lam):
    rw, vals, lengths = case
    r, v = R(rw), R(vals)
    B, T = r.shape
    mask = right_padded(lengths, T)
    a, ret = run_gae(r, v, mask, gamma, lam)
    pad = torch.full((B, extra), float("nan"), dtype=torch.float64)
    wide_mask = torch.cat([mask, torch.zeros(B, extra, dtype=torch.bool)], 1)
    a2, ret2 = run_gae(torch.cat([r, pad], 1), torch.cat([v, -pad], 1), wide_mask, gamma, lam)
    assert torch.equal(a2[:, :T], a) and torch.equal(ret2[:, :T], ret), (
        "appending masked steps changed the result"
    )
    assert (a2[:, T:] == 0).all() and (ret2[:, T:] == 0).all(), (
        "appended masked steps must be 0 (NaN leaked?)"
    )


# ---- whiten, explained variance ------------------------------------------------------------------


@SET
@given(distinct(reward_rows(B=(1, 3), G=(2, 6))), st.data())
def test_whiten_gives_masked_mean_zero_and_variance_one_and_ignores_masked_garbage(rows, data):
    x = R(rows)
    # keep columns 0 and −1 (which differ) valid in row 0, the rest at random
    mask = torch.tensor(
        data.draw(
            st.lists(
                st.lists(st.booleans(), min_size=x.size(1), max_size=x.size(1)),
                min_size=x.size(0),
                max_size=x.size(0),
            )
        )
    )
    mask[0, 0] = mask[0, -1] = True
    w = call(whiten, garbage(x, mask), mask, shape=x.shape)
    assert (w[~mask] == 0).all(), f"masked positions must be 0 (garbage leaked): {w.tolist()}"
    assert abs(w[mask].mean()) < 1e-9 and abs(w[mask].var(unbiased=False) - 1) < 1e-9, (
        f"whitened valid entries must have mean 0, variance 1: {w[mask].tolist()} from "
        f"{x[mask].tolist()}"
    )


@SET
@given(distinct(reward_rows(B=(1, 3), G=(2, 6))), st.booleans())
def test_batch_scaled_divides_by_one_std_over_the_batch_and_keeps_the_mean(rows, unbiased):
    x = R(rows)
    scaled = call(batch_scaled, x, unbiased, 0.0, shape=x.shape)
    std = x.flatten().std(unbiased=unbiased)
    assert torch.allclose(scaled, x / std, atol=1e-9), (
        f"batch_scaled must divide every entry by ONE std over the whole batch "
        f"({'Bessel' if unbiased else 'population'})"
    )
    assert torch.allclose(call(batch_scaled, x, unbiased, 0.5), x / (std + 0.5), atol=1e-9), (
        "ε is added to the std"
    )


def test_batch_scaled_keeps_all_zero_advantages_exactly_zero():
    zero = torch.zeros(2, 4)
    assert torch.equal(batch_scaled(zero), zero), (
        "an all-equal batch has no signal: its advantages must stay 0"
    )


def test_whiten_stays_finite_for_one_valid_entry_or_zero_variance():
    x = R([[2.0, float("nan"), 1e4]])
    one = torch.tensor([[True, False, False]])
    w = whiten(x, one)
    assert torch.isfinite(w).all(), f"one valid entry gave {w}"
    same = R([[3.0, 3.0, 3.0]])
    w = whiten(same, torch.ones_like(same, dtype=torch.bool))
    assert torch.equal(w, torch.zeros_like(same)), (
        f"zero variance with shift_mean must give 0, got {w}"
    )


def test_explained_variance_perfect_constant_and_hand_examples():
    ret = R([[1.0, 2.0, 3.0, 4.0, 99.0]])
    mask = torch.tensor([[True, True, True, True, False]])
    ev = lambda v, r: call(explained_variance, v, r, mask, shape=())
    assert ev(ret, ret) == 1.0, "perfect values must explain everything (EV = 1)"
    assert abs(ev(torch.full_like(ret, 2.5), ret)) < 1e-12, (
        "a constant equal to the mean of the returns gives EV = 0"
    )
    # residuals ±0.5 have variance 0.25, the returns 1.25 -> 1 − 0.25/1.25 = 0.8 (padding ignored)
    v = ret + R([[-0.5, 0.5, -0.5, 0.5, float("nan")]])
    assert abs(ev(v, ret) - 0.8) < 1e-12, f"hand example: expected 0.8, got {ev(v, ret)}"
    assert ev(ret, torch.ones_like(ret)) == 0.0, "Var[returns] = 0 is defined as EV = 0 (no NaN)"


# ---- ReMax's greedy baseline, REINFORCE-Rej's group filter, GPG's rescaling ----------------------

from types import SimpleNamespace  # noqa: E402

from minigrpo.objectives.advantages import equal_groups, gpg_scale, remax_advantages  # noqa: E402
from minigrpo.variants.advantages import kept_rows  # noqa: E402


@SET
@given(reward_rows(grid), st.integers(0, 10**6))
def test_remax_is_reward_minus_the_greedy_reward_and_zero_where_they_match(rows, seed):
    r = R(rows)
    pick = torch.randint(0, r.size(1), (r.size(0),), generator=torch.Generator().manual_seed(seed))
    greedy = r[torch.arange(r.size(0)), pick]  # a greedy completion that scored like sample `pick`
    a = call(remax_advantages, r, greedy, shape=r.shape)
    assert torch.equal(a, r - greedy[:, None]), (
        f"ReMax must be r − r(greedy) per group: {a.tolist()}"
    )
    assert (a[r == greedy[:, None]] == 0).all(), (
        "a sample scoring like the greedy completion must get exactly 0"
    )
    shifted = remax_advantages(r + 2.5, greedy + 2.5)
    assert torch.equal(shifted, a), (
        "shifting every reward by a constant (greedy included) must change nothing"
    )


@SET
@given(reward_rows(st.sampled_from([0.0, 1.0]), G=(1, 6)))
def test_reinforce_rej_drops_exactly_the_all_correct_and_all_wrong_groups(rows):
    r = R(rows)
    keep = ~call(equal_groups, r, shape=(r.size(0),))
    want = torch.tensor([0.0 < sum(row) < len(row) for row in rows])
    assert keep.dtype == torch.bool and torch.equal(keep, want), (
        f"0/1 rewards {rows}: keep {keep.tolist()}"
    )


@SET
@given(reward_rows(grid))
def test_reinforce_rej_keeps_every_group_with_two_different_rewards_and_leaves_no_zero_signal_group(
    rows,
):
    r = R(rows)
    B, G = r.shape
    on = SimpleNamespace(skip_equal_groups=True, group_size=G)
    rows_kept = kept_rows(equal_groups(r), on)
    want = [b * G + j for b, row in enumerate(rows) if len(set(row)) > 1 for j in range(G)]
    assert rows_kept.nonzero().flatten().tolist() == want, (
        "the kept rows are exactly those of the groups with ≥ 2 different rewards"
    )
    members = torch.stack([equal_groups(r), equal_groups(r.flip(0))])  # two members' groups
    assert torch.equal(kept_rows(members, on), torch.stack([rows_kept, kept_rows(members[1], on)]))
    assert (
        kept_rows(equal_groups(r), SimpleNamespace(skip_equal_groups=False, group_size=G)) is None
    ), "off: all"
    keep = torch.tensor([len(set(row)) > 1 for row in rows])
    kept = group_advantages(r[keep])
    assert (kept.abs().sum(1) > 0).all(), f"a kept group has all-zero advantages: {kept.tolist()}"


@SET
@given(reward_rows(st.sampled_from([0.0, 1.0]), B=(1, 4), G=(2, 6)))
def test_gpg_alpha_makes_the_batch_mean_a_mean_over_the_nonzero_advantages(rows):
    a = group_advantages(R(rows))
    alpha = call(gpg_scale, a, shape=())
    nonzero = a[a != 0]
    if nonzero.numel() == 0:
        assert alpha == 1, f"no informative sample: α must be 1, got {alpha}"
        return
    assert torch.allclose(alpha * nonzero.numel(), R(float(a.numel()))), (
        f"α = N/#(A≠0): {alpha} for {a.tolist()}"
    )
    assert alpha >= 1
    assert torch.allclose((alpha * a).mean(), nonzero.mean(), atol=1e-12), (
        "α·mean over all N = mean over A ≠ 0"
    )


def test_gpg_hand_value():
    assert gpg_scale(R([[1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])).item() == 4.0, (
        "8 samples, 2 nonzero: α = 4"
    )
