"""Properties of minigrpo/objectives/losses.py: the clipped surrogate and its stats, aggregation,
entropy, value loss. Each test's name is the property it proves; a failure says which property broke
and on what input."""

import math

import pytest
import torch
from conftest import NAN, SET, T, call, garbage, right_padded
from hypothesis import given
from hypothesis import strategies as st

from minigrpo.objectives.losses import (
    AGG_MODES,
    aggregate,
    clipped_surrogate,
    entropy,
    surrogate_stats,
    value_loss,
)


def loss_and_grad(logp, old, adv, mask, **kw):
    """Per-token loss (B, T) and d(Σ loss)/d logp, i.e. each token's own gradient, unaggregated."""
    logp = logp.detach().clone().requires_grad_(True)
    loss = call(clipped_surrogate, logp, old, adv, mask, shape=logp.shape, **kw)
    loss.sum().backward()
    return loss.detach(), logp.grad


# a batch: per-token log-ratios, one advantage per row (never tiny: 0 or |A| ≥ 0.01), valid lengths
advantage = st.one_of(st.just(0.0), st.floats(0.01, 3), st.floats(-3, -0.01))
case = st.integers(1, 4).flatmap(
    lambda B: st.integers(1, 6).flatmap(
        lambda L: st.tuples(
            st.lists(
                st.lists(st.floats(-1.0, 1.0), min_size=L, max_size=L), min_size=B, max_size=B
            ),
            st.lists(advantage, min_size=B, max_size=B),
            st.lists(st.integers(0, L), min_size=B, max_size=B),
        )
    )
)


def unpack(c):
    log_ratio, adv, lengths = c
    lr = T(log_ratio)
    mask = right_padded(lengths, lr.size(1))
    old = torch.linspace(-3.0, -0.5, lr.numel(), dtype=torch.float64).view_as(lr)  # log π_old
    return old + lr, old, T(adv), mask


def ratio_of(logp, old, mask, level):
    """ρ per token, or GSPO's s_i = exp(mean of the valid log-ratios) on every token of row i."""
    lr = torch.where(mask, logp - old, 0.0)
    if level == "sequence":
        lr = (lr.sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)).expand_as(lr)
    return lr.exp()


@SET
@given(case, st.sampled_from(["token", "sequence"]))
def test_at_ratio_one_the_gradient_is_minus_the_advantage(c, level):
    _, old, adv, mask = unpack(c)
    _, g = loss_and_grad(old, old, adv, mask, level=level)  # logp = old: ρ = 1
    want = torch.where(mask, -adv[:, None].expand_as(old), 0.0)
    assert torch.allclose(g, want, atol=1e-12), (
        f"at ρ = 1 d loss/d logp must be −A on valid tokens ({level}): "
        f"got {g.tolist()}, want {want.tolist()}"
    )


@SET
@given(case, st.floats(0.05, 0.4), st.floats(0.05, 0.4), st.sampled_from(["token", "sequence"]))
def test_gradient_is_zero_exactly_where_the_clip_acts_and_nonzero_inside_the_range(
    c, eps_low, eps_high, level
):
    logp, old, adv, mask = unpack(c)
    _, g = loss_and_grad(logp, old, adv, mask, eps_low=eps_low, eps_high=eps_high, level=level)
    rho, A = ratio_of(logp, old, mask, level), adv[:, None].expand_as(logp)
    clipped = mask & (((A > 0) & (rho > 1 + eps_high)) | ((A < 0) & (rho < 1 - eps_low)))
    inside = mask & (A != 0) & (rho > 1 - eps_low + 1e-9) & (rho < 1 + eps_high - 1e-9)
    assert (g[clipped] == 0).all(), (
        f"the clip must stop the gradient (A>0, ρ>1+ε_high or A<0, ρ<1−ε_low): "
        f"ρ {rho[clipped].tolist()}, grad {g[clipped].tolist()}"
    )
    assert (g[inside] != 0).all(), (
        f"inside [1−ε_low, 1+ε_high] the gradient must flow: ρ {rho[inside].tolist()}"
    )


def test_clip_higher_widens_only_the_upper_side():
    old = T([[0.0, 0.0, 0.0, 0.0]])
    logp = T([[math.log(1.25), math.log(1.25), math.log(0.78), math.log(0.78)]])
    adv = T([[1.0, -1.0, 1.0, -1.0]])
    _, sym = loss_and_grad(logp, old, adv, None, eps_low=0.2)
    _, dapo = loss_and_grad(logp, old, adv, None, eps_low=0.2, eps_high=0.28)
    assert sym[0, 0] == 0 and dapo[0, 0] != 0, (
        "ρ = 1.25, A > 0: clipped at ε = 0.2, free under eps_high = 0.28"
    )
    assert sym[0, 3] == 0 and dapo[0, 3] == 0, (
        "ρ = 0.78, A < 0: still clipped from below (eps_low = 0.2)"
    )
    assert (sym[0, 1:3] != 0).all() and (dapo[0, 1:3] != 0).all(), (
        "the pessimistic side is never clipped"
    )


@SET
@given(case, st.floats(0.05, 0.4), st.floats(0.05, 0.4), st.sampled_from(["token", "sequence"]))
def test_clip_fractions_count_exactly_the_zero_gradient_tokens(c, eps_low, eps_high, level):
    logp, old, adv, mask = unpack(c)
    _, g = loss_and_grad(logp, old, adv, mask, eps_low=eps_low, eps_high=eps_high, level=level)
    s = surrogate_stats(logp, old, adv, mask, eps_low, eps_high, level)
    assert isinstance(s, dict) and all(
        isinstance(v, torch.Tensor) and v.dim() == 0 for v in s.values()
    ), s
    A, n = adv[:, None].expand_as(logp), max(int(mask.sum()), 1)
    stopped = mask & (A != 0) & (g == 0)
    for key, side in (("clip_frac_low", A < 0), ("clip_frac_high", A > 0)):
        want = (stopped & side).sum().item() / n
        assert abs(s[key].item() - want) < 1e-12, (
            f"{key} = {s[key].item()} but {want} of the valid tokens have "
            f"{'A<0' if key.endswith('low') else 'A>0'} and zero gradient"
        )


def test_surrogate_stats_ratio_and_approx_kl_hand_values():
    old = T([[-1.0, -1.0, -1.0]])
    logp = old + T([[0.0, math.log(2.0), NAN]])
    mask = torch.tensor([[True, True, False]])
    s = surrogate_stats(logp.requires_grad_(), old, T([1.0]), mask)
    assert abs(s["ratio_mean"] - 1.5) < 1e-12 and abs(s["ratio_max"] - 2.0) < 1e-12, (
        f"ratios 1 and 2: {s}"
    )
    want_kl = ((2 - 1) - math.log(2)) / 2  # mean of (ρ − 1) − log ρ: k3 with π_old as the sampler
    assert abs(s["approx_kl"] - want_kl) < 1e-12, (
        f"approx_kl must be mean of (ρ−1) − log ρ = {want_kl}: {s}"
    )
    assert not any(v.requires_grad for v in s.values()), "surrogate_stats must not carry gradients"


@SET
@given(case, st.floats(0.05, 0.4), st.floats(0.0, 0.3), st.sampled_from(["token", "sequence"]))
def test_clipped_objective_never_exceeds_unclipped_and_raising_eps_high_never_lowers_it(
    c, eps, extra, level
):
    logp, old, adv, mask = unpack(c)
    objective = -call(
        clipped_surrogate, logp, old, adv, mask, shape=logp.shape, eps_low=eps, level=level
    )
    unclipped = torch.where(mask, ratio_of(logp, old, mask, level) * adv[:, None], 0.0)
    assert (objective <= unclipped + 1e-12).all(), (
        f"clipped objective {objective.tolist()} > unclipped {unclipped.tolist()}"
    )
    higher = -clipped_surrogate(
        logp, old, adv, mask, eps_low=eps, eps_high=eps + extra, level=level
    )
    assert (higher >= objective - 1e-12).all(), (
        f"eps_high {eps} -> {eps + extra} lowered the objective"
    )


@SET
@given(case, st.floats(1.5, 5.0), st.floats(1.0, 4.0))
def test_dual_clip_bounds_the_loss_by_c_abs_a_for_negative_advantages(c, dual, stretch):
    logp, old, adv, mask = unpack(c)
    logp = old + stretch * (logp - old).abs()  # ratios ≥ 1, up to e^4: where A < 0 hurts
    loss, g = loss_and_grad(logp, old, adv, mask, dual_clip=dual)
    A = adv[:, None].expand_as(loss)
    neg = mask & (A < 0)
    assert (loss[neg] <= dual * A[neg].abs() + 1e-12).all(), (
        f"dual clip c={dual}: loss {loss[neg].tolist()} > c·|A|"
    )
    assert (g[neg & (loss >= dual * A.abs() - 1e-12)] == 0).all(), (
        "where the dual clip binds the gradient must be 0"
    )
    plain = clipped_surrogate(logp, old, adv, mask)
    assert torch.equal(loss[~neg], plain[~neg]), "dual clip must not touch A ≥ 0"


def test_without_dual_clip_a_negative_advantage_loss_is_unbounded():
    loss = clipped_surrogate(T([[3.0]]), T([[0.0]]), T([-1.0]), dual_clip=None)
    assert abs(loss.item() - math.exp(3.0)) < 1e-9, (
        f"ρ = e³, A = −1 must give loss e³ without dual clip: {loss}"
    )
    assert (
        abs(clipped_surrogate(T([[3.0]]), T([[0.0]]), T([-1.0]), dual_clip=3.0).item() - 3.0)
        < 1e-12
    )


@SET
@given(case)
def test_gspo_sequence_ratio_is_exp_of_the_mean_valid_log_ratio_and_ignores_padding(c):
    logp, old, adv, mask = unpack(c)
    loss = call(
        clipped_surrogate, logp, old, adv, mask, shape=logp.shape, eps_low=100.0, level="sequence"
    )
    # no clipping at ε = 100
    want = torch.where(mask, -ratio_of(logp, old, mask, "sequence") * adv[:, None], 0.0)
    assert torch.allclose(loss, want, atol=1e-12), (
        f"GSPO loss must be −s_i·A_i: {loss.tolist()} vs {want.tolist()}"
    )
    dirty = clipped_surrogate(
        garbage(logp, mask), garbage(old, mask), adv, mask, eps_low=100.0, level="sequence"
    )
    assert torch.equal(dirty, loss), (
        "garbage in masked slots changed the sequence ratio (mean over valid tokens only)"
    )


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("dual", [None, 3.0])
def test_masked_nan_and_1e4_reach_neither_value_nor_gradient(level, dual):
    mask = torch.tensor([[True, False, False], [True, True, False], [False, False, False]])
    logp = garbage(T([[-1.0, 0, 0], [-0.5, -2.0, 0], [0, 0, 0]]), mask)
    old = garbage(T([[-1.1, 0, 0], [-0.4, -2.1, 0], [0, 0, 0]]), mask)
    adv = garbage(T([[2.0] * 3, [-1.0] * 3, [0.5] * 3]), mask)  # (B, T) advantages with junk too
    loss, g = loss_and_grad(logp, old, adv, mask, level=level, dual_clip=dual)
    assert torch.isfinite(loss).all() and (loss[~mask] == 0).all(), (
        f"masked slots leaked into the loss: {loss}"
    )
    assert torch.isfinite(g).all() and (g[~mask] == 0).all(), f"masked slots got a gradient: {g}"
    assert (g[mask] != 0).all(), "valid tokens must still get a gradient"


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_extreme_log_ratios_give_a_finite_loss_and_gradient(level):
    logp, old = T([[1e4, -1e4], [0.0, 50.0]]), T([[-1e4, 1e4], [-60.0, 0.0]])
    for a in (T([1.0, 2.0]), T([-1.0, -2.0])):
        loss, g = loss_and_grad(logp, old, a, None, level=level)
        assert torch.isfinite(loss).all() and torch.isfinite(g).all(), (
            "log-ratios ±2e4 must give a finite loss and gradient (clamp before exp): loss "
            f"{loss}, grad {g}"
        )


def test_advantages_of_shape_b_b1_and_bt_broadcast_alike():
    logp, old = T([[-1.0, -2.0], [-0.3, -0.1]]), T([[-1.2, -1.9], [-0.2, -0.4]])
    a = T([1.5, -0.5])
    by_row = clipped_surrogate(logp, old, a)
    assert torch.equal(clipped_surrogate(logp, old, a[:, None]), by_row), (
        "(B, 1) advantages must match (B,)"
    )
    assert torch.equal(clipped_surrogate(logp, old, a[:, None].expand(2, 2)), by_row), (
        "(B, T) must match (B,)"
    )


def test_unknown_level_raises_value_error():
    with pytest.raises(ValueError, match="token"):
        clipped_surrogate(T([[0.0]]), T([[0.0]]), T([1.0]), level="seq")


# ---- aggregation -------------------------------------------------------------------------------

agg_case = st.integers(1, 4).flatmap(
    lambda B: st.integers(1, 6).flatmap(
        lambda L: st.tuples(
            st.lists(st.lists(st.floats(-5, 5), min_size=L, max_size=L), min_size=B, max_size=B),
            st.lists(st.integers(0, L), min_size=B, max_size=B),
        )
    )
)


def agg_unpack(c):
    vals, lengths = c
    x = T(vals)
    return x, right_padded(lengths, x.size(1))


def agg(x, mask, mode, **kw):
    return call(aggregate, x, mask, mode, shape=(), **kw)


@SET
@given(agg_case, st.sampled_from(AGG_MODES))
def test_masked_garbage_changes_neither_value_nor_gradient_in_every_mode(c, mode):
    x, mask = agg_unpack(c)
    clean, dirty = x.clone().requires_grad_(True), garbage(x, mask).requires_grad_(True)
    v_clean, v_dirty = agg(clean, mask, mode), agg(dirty, mask, mode)
    assert torch.isfinite(v_dirty) and torch.equal(v_clean, v_dirty), (
        f"{mode}: garbage changed {v_clean} -> {v_dirty}"
    )
    v_clean.backward()
    v_dirty.backward()
    assert torch.equal(clean.grad, dirty.grad) and (dirty.grad[~mask] == 0).all(), (
        f"{mode}: garbage reached the gradient"
    )


@SET
@given(agg_case, st.sampled_from(AGG_MODES), st.integers(1, 3), st.randoms(use_true_random=False))
def test_extra_masked_columns_and_row_permutations_change_nothing_but_the_documented_factor(
    c, mode, extra, rnd
):
    x, mask = agg_unpack(c)
    B, L = x.shape
    base = agg(x, mask, mode, max_len=L)
    wide = torch.cat([x, torch.full((B, extra), 1e4, dtype=x.dtype)], 1)
    wide_mask = torch.cat([mask, torch.zeros(B, extra, dtype=torch.bool)], 1)
    assert torch.allclose(agg(wide, wide_mask, mode, max_len=L), base, atol=1e-12), (
        f"{mode}: extra masked columns"
    )
    if mode == "seq-mean-token-sum-norm":  # default max_len = T: normalised by the padded width
        got = agg(wide, wide_mask, mode)
        assert torch.allclose(got, base * L / (L + extra), atol=1e-12), (
            f"{mode}: default max_len must be T"
        )
    else:
        assert torch.allclose(agg(wide, wide_mask, mode), agg(x, mask, mode), atol=1e-12), (
            f"{mode}: default max_len"
        )
    perm = list(range(B))
    rnd.shuffle(perm)
    assert torch.allclose(agg(x[perm], mask[perm], mode), agg(x, mask, mode), atol=1e-12), (
        f"{mode}: row order mattered"
    )


@SET
@given(agg_case, st.floats(-3, 3), st.integers(1, 9))
def test_a_constant_loss_gives_each_modes_closed_form(c, const, max_len):
    x, mask = agg_unpack(c)
    x = torch.full_like(x, const)
    B = x.size(0)
    lengths = mask.sum(1).double()
    # empty rows count as 0 among B
    want = {
        "seq-mean-token-mean": const * (lengths > 0).double().mean(),
        "token-mean": const * float(mask.any()),
        "seq-mean-token-sum": const * lengths.mean(),
        "seq-mean-token-sum-norm": const * lengths.sum() / (B * max_len),
    }
    for mode, w in want.items():
        got = agg(x, mask, mode, max_len=max_len)
        assert torch.allclose(got, T(float(w)), atol=1e-12), (
            f"{mode}: constant {const}, lengths {lengths.tolist()} "
            f"gave {got.item()}, closed form {float(w)}"
        )


@SET
@given(agg_case, st.integers(1, 9))
def test_per_token_gradient_weights_of_the_three_main_modes(c, max_len):
    x, mask = agg_unpack(c)
    B = x.size(0)
    lengths = mask.sum(1, keepdim=True).double()
    want = {
        "seq-mean-token-mean": (1 / (B * lengths)).expand_as(x),
        "token-mean": torch.full_like(x, 1 / max(int(mask.sum()), 1)),
        "seq-mean-token-sum-norm": torch.full_like(x, 1 / (B * max_len)),
    }
    for mode, w in want.items():
        leaf = x.clone().requires_grad_(True)
        agg(leaf, mask, mode, max_len=max_len).backward()
        assert torch.allclose(leaf.grad, torch.where(mask, w, 0.0)), (
            f"{mode}: per-token weights {leaf.grad.tolist()}"
        )


def test_fully_masked_rows_give_no_nan_and_count_as_documented():
    x = T([[1.0, 2.0], [NAN, 3.0]])
    mask = torch.tensor([[True, True], [False, False]])
    want = {
        "seq-mean-token-mean": 0.75,
        "token-mean": 1.5,
        "seq-mean-token-sum": 1.5,
        "seq-mean-token-sum-norm": 0.75,
    }
    for mode in AGG_MODES:
        got = agg(x, mask, mode)
        assert torch.isfinite(got) and abs(got.item() - want[mode]) < 1e-12, (
            f"{mode}: {got.item()} vs {want[mode]}"
        )
        assert agg(x, torch.zeros_like(mask), mode) == 0, f"{mode}: an all-masked batch must give 0"


def test_unknown_mode_raises_value_error_listing_the_modes():
    with pytest.raises(ValueError) as err:
        aggregate(T([[1.0]]), torch.tensor([[True]]), "mean")
    assert all(m in str(err.value) for m in AGG_MODES), (
        f"the message must list {AGG_MODES}: {err.value}"
    )


# ---- entropy, value loss -----------------------------------------------------------------------


@SET
@given(
    st.integers(1, 3).flatmap(
        lambda n: st.integers(2, 10).flatmap(
            lambda V: st.lists(
                st.lists(st.floats(-30, 30), min_size=V, max_size=V), min_size=n, max_size=n
            )
        )
    ),
    st.floats(-100, 100),
)
def test_entropy_bounds_shift_invariance_and_agreement_with_torch(rows, shift):
    x = T(rows)
    h = call(entropy, x, shape=x.shape[:-1])
    assert (h >= 0).all() and (h <= math.log(x.size(-1)) + 1e-12).all(), (
        f"0 ≤ H ≤ log V broken: {h.tolist()}"
    )
    assert torch.allclose(entropy(x + shift), h, atol=1e-9), (
        "adding a constant to the logits changed H"
    )
    assert torch.allclose(h, torch.distributions.Categorical(logits=x).entropy(), atol=1e-9), (
        "H ≠ Categorical entropy"
    )


def test_entropy_of_uniform_logits_is_log_v_and_finite_at_extremes():
    assert torch.allclose(entropy(torch.zeros(3, 7)), torch.full((3,), math.log(7))), (
        "uniform logits: H = log V"
    )
    big = torch.tensor([[1e4, -1e4, 0.0], [1e4, 1e4, -1e4]], requires_grad=True)
    h = entropy(big)
    h.sum().backward()
    assert torch.isfinite(h).all() and torch.isfinite(big.grad).all(), (
        f"entropy at logits ±1e4: {h}, grad {big.grad}"
    )
    assert torch.allclose(h.detach(), torch.tensor([0.0, math.log(2)])), (
        f"one-hot -> 0, two-way tie -> log 2: {h}"
    )


value_case = st.integers(1, 3).flatmap(
    lambda B: st.integers(1, 5).flatmap(
        lambda L: st.tuples(
            *[st.lists(st.lists(st.floats(-5, 5), min_size=L, max_size=L), min_size=B, max_size=B)]
            * 3,
            st.lists(st.integers(0, L), min_size=B, max_size=B),
        )
    )
)


@SET
@given(value_case, st.floats(0.01, 2.0))
def test_value_loss_is_the_hand_formula_clipping_only_increases_it_and_padding_is_ignored(c, clip):
    v, v_old, ret, lengths = (T(c[0]), T(c[1]), T(c[2]), c[3])
    mask = right_padded(lengths, v.size(1))
    plain = call(value_loss, v, v_old, ret, mask, shape=v.shape)
    assert torch.allclose(plain, torch.where(mask, 0.5 * (v - ret) ** 2, 0.0)), (
        "clip=None must be ½(V − R)²"
    )
    leaf = garbage(v, mask).requires_grad_(True)
    clipped = call(
        value_loss, leaf, garbage(v_old, mask), garbage(ret, mask), mask, shape=v.shape, clip=clip
    )
    # clip(V, V_old − c, V_old + c)
    v_clip = torch.minimum(torch.maximum(v, v_old - clip), v_old + clip)
    want = torch.where(mask, 0.5 * torch.maximum((v - ret) ** 2, (v_clip - ret) ** 2), 0.0)
    assert torch.allclose(clipped, want), (
        f"clipped value loss: {clipped.tolist()} vs ½·max(...) {want.tolist()}"
    )
    assert (clipped >= plain).all(), (
        "clipping must only ever increase the value loss (it takes the max)"
    )
    clipped.sum().backward()
    assert torch.isfinite(leaf.grad).all() and (leaf.grad[~mask] == 0).all(), (
        "masked garbage reached the gradient"
    )


def test_value_loss_hand_example():
    v, v_old, ret = T([[1.0, 3.0, 9.0]]), T([[0.5, 1.0, NAN]]), T([[2.0, 0.0, 1e4]])
    mask = torch.tensor([[True, True, False]])
    assert torch.allclose(value_loss(v, v_old, ret, mask), T([[0.5, 4.5, 0.0]]))
    # token 0: V clipped to 0.7 -> (0.7 − 2)² = 1.69 > 1 -> 0.845; token 1: clipped 1.2 -> 1.44 < 9
    # -> 4.5
    assert torch.allclose(value_loss(v, v_old, ret, mask, clip=0.2), T([[0.845, 4.5, 0.0]]))


def test_forking_token_mask_keeps_exactly_the_valid_positions_where_the_reference_had_a_choice():
    from minigrpo.objectives.entropy_control import forking_token_mask

    ent = torch.tensor([[2.3, 0.001, 0.7, 5.0], [0.05, 0.2, 0.0, 9.9]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    got = forking_token_mask(ent, mask, 0.1)
    assert got.tolist() == [[True, False, True, False], [False, True, False, True]]
    assert torch.equal(forking_token_mask(ent, mask, 0.0), mask), (
        "threshold 0 keeps every valid token"
    )
    assert not (got & ~mask).any(), "a padded position never carries the loss"
