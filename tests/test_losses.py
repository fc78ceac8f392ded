"""Properties of the loss terms (minigrpo/losses.py): surrogate, aggregation, entropy, value loss."""

import math

import torch
from hypothesis import given, settings, strategies as st

from minigrpo.losses import AGG_MODES, aggregate, clipped_surrogate, entropy, surrogate_stats, value_loss

SET = settings(deadline=None, max_examples=60)


def T(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


case = st.integers(1, 4).flatmap(lambda B: st.integers(1, 6).flatmap(lambda L: st.tuples(
    st.lists(st.lists(st.floats(-1.0, 1.0), min_size=L, max_size=L), min_size=B, max_size=B),  # log-ratio
    st.lists(st.floats(-3, 3), min_size=B, max_size=B),  # advantages
    st.lists(st.integers(0, L), min_size=B, max_size=B))))  # valid lengths


def unpack(c):
    log_ratio, adv, lengths = c
    lr = T(log_ratio)
    mask = torch.arange(lr.size(1))[None, :] < torch.tensor(lengths)[:, None]
    old = torch.full_like(lr, -1.0)
    return old + lr, old, T(adv), mask


def grad_wrt_logp(logp, old, adv, mask, **kw):
    logp = logp.clone().requires_grad_(True)
    clipped_surrogate(logp, old, adv[:, None], mask, **kw).sum().backward()
    return logp.grad


@SET
@given(case)
def test_at_ratio_one_the_gradient_is_minus_the_advantage(c):
    _, old, adv, mask = unpack(c)
    g = grad_wrt_logp(old.clone(), old, adv, mask)
    expected = torch.where(mask, -adv[:, None].expand_as(old), 0.0)
    assert torch.allclose(g, expected), f"grad {g.tolist()} vs -A {expected.tolist()}"


@SET
@given(case, st.floats(0.05, 0.4), st.floats(0.05, 0.4))
def test_gradient_is_zero_exactly_where_the_clip_acts_and_not_inside(c, eps_low, eps_high):
    logp, old, adv, mask = unpack(c)
    g = grad_wrt_logp(logp, old, adv, mask, eps_low=eps_low, eps_high=eps_high)
    ratio = (logp - old).exp()
    A = adv[:, None].expand_as(ratio)
    clipped = mask & (((A > 0) & (ratio > 1 + eps_high)) | ((A < 0) & (ratio < 1 - eps_low)))
    inside = mask & (A != 0) & (ratio > 1 - eps_low + 1e-9) & (ratio < 1 + eps_high - 1e-9)
    assert (g[clipped] == 0).all(), "the clip must stop the gradient"
    assert (g[inside] != 0).all(), "inside the clip range the gradient must flow"
    s = surrogate_stats(logp, old, adv[:, None], mask, eps_low, eps_high)
    n = max(int(mask.sum()), 1)
    low = mask & (A < 0) & (ratio < 1 - eps_low)
    assert abs(s["clip_frac_low"].item() - low.sum().item() / n) < 1e-12
    assert abs(s["clip_frac_high"].item() - (mask & (A > 0) & (ratio > 1 + eps_high)).sum().item() / n) < 1e-12


@SET
@given(case, st.floats(0.05, 0.4), st.floats(0.0, 0.3))
def test_clipped_objective_never_exceeds_unclipped_and_clip_higher_never_lowers_it(c, eps, extra):
    logp, old, adv, mask = unpack(c)
    clipped_obj = -clipped_surrogate(logp, old, adv[:, None], mask, eps)
    unclipped_obj = torch.where(mask, (logp - old).exp() * adv[:, None], 0.0)
    assert (clipped_obj <= unclipped_obj + 1e-12).all()
    higher = -clipped_surrogate(logp, old, adv[:, None], mask, eps, eps + extra)
    assert (higher >= clipped_obj - 1e-12).all()


@SET
@given(case, st.floats(1.5, 5.0))
def test_dual_clip_bounds_the_loss_for_negative_advantages(c, dual):
    logp, old, adv, mask = unpack(c)
    logp = logp * 4  # push ratios far above 1
    loss = clipped_surrogate(logp, old, adv[:, None], mask, dual_clip=dual)
    A = adv[:, None].expand_as(loss)
    neg = mask & (A < 0)
    assert (loss[neg] <= dual * A[neg].abs() + 1e-9).all()
    plain = clipped_surrogate(logp, old, adv[:, None], mask)
    assert torch.equal(loss[mask & (A >= 0)], plain[mask & (A >= 0)]), "dual clip must not touch A >= 0"


def test_gspo_sequence_ratio_ignores_padding_and_is_the_mean_log_ratio():
    logp = T([[-1.0, -2.0, 5.0], [-1.5, 7.0, 9.0]])
    old = T([[-1.2, -1.8, float("nan")], [-1.0, float("nan"), 1e4]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    loss = clipped_surrogate(logp, old, T([1.0, 1.0]), mask, eps_low=10, level="sequence")
    s0 = math.exp(((-1.0 + 1.2) + (-2.0 + 1.8)) / 2)
    s1 = math.exp(-1.5 + 1.0)
    assert torch.allclose(loss, T([[-s0, -s0, 0], [-s1, 0, 0]])), loss
    garbage = logp.clone()
    garbage[~mask] = float("nan")
    assert torch.equal(clipped_surrogate(garbage, old, T([1.0, 1.0]), mask, eps_low=10, level="sequence"), loss)


def test_masked_garbage_reaches_neither_value_nor_gradient():
    logp = T([[-1.0, float("nan"), 1e4]], grad=True)
    old = T([[-1.1, 3.0, -1e4]])
    mask = torch.tensor([[True, False, False]])
    for level in ("token", "sequence"):
        loss = clipped_surrogate(logp, old, T([2.0]), mask, level=level)
        assert torch.isfinite(loss).all() and (loss[0, 1:] == 0).all()
        logp.grad = None
        aggregate(loss, mask, "token-mean").backward()
        assert torch.isfinite(logp.grad).all() and (logp.grad[0, 1:] == 0).all()


# ---- aggregation -----------------------------------------------------------------------------

agg_case = st.integers(1, 4).flatmap(lambda B: st.integers(1, 6).flatmap(lambda L: st.tuples(
    st.lists(st.lists(st.floats(-5, 5), min_size=L, max_size=L), min_size=B, max_size=B),
    st.lists(st.integers(0, L), min_size=B, max_size=B))))


def agg_unpack(c):
    vals, lengths = c
    x = T(vals)
    return x, torch.arange(x.size(1))[None, :] < torch.tensor(lengths)[:, None]


@SET
@given(agg_case, st.sampled_from(AGG_MODES))
def test_masked_garbage_changes_neither_value_nor_gradient_in_every_mode(c, mode):
    x, mask = agg_unpack(c)
    a = x.clone().requires_grad_(True)
    b = torch.where(mask, x, T(float("nan"))).requires_grad_(True)
    va, vb = aggregate(a, mask, mode), aggregate(b, mask, mode)
    assert torch.isfinite(vb) and torch.equal(va, vb)
    va.backward()
    vb.backward()
    assert torch.equal(a.grad, b.grad) and (b.grad[~mask] == 0).all()


@SET
@given(agg_case, st.sampled_from(AGG_MODES), st.randoms())
def test_extra_masked_columns_and_row_permutations_change_nothing(c, mode, rnd):
    x, mask = agg_unpack(c)
    base = aggregate(x, mask, mode, max_len=x.size(1))
    wide = torch.cat([x, torch.full((x.size(0), 2), 1e4, dtype=x.dtype)], 1)
    wmask = torch.cat([mask, torch.zeros(x.size(0), 2, dtype=torch.bool)], 1)
    assert torch.allclose(aggregate(wide, wmask, mode, max_len=x.size(1)), base, atol=1e-12)
    if mode == "seq-mean-token-sum-norm":  # default max_len = T: the documented factor T / (T + 2)
        assert torch.allclose(aggregate(wide, wmask, mode), base * x.size(1) / (x.size(1) + 2), atol=1e-12)
    perm = list(range(x.size(0)))
    rnd.shuffle(perm)
    assert torch.allclose(aggregate(x[perm], mask[perm], mode), aggregate(x, mask, mode), atol=1e-12)


@SET
@given(agg_case, st.floats(-3, 3))
def test_a_constant_loss_gives_each_modes_closed_form(c, const):
    x, mask = agg_unpack(c)
    x = torch.full_like(x, const)
    B, L = x.shape
    lengths = mask.sum(1).double()
    nonempty = (lengths > 0).double()
    assert torch.allclose(aggregate(x, mask, "seq-mean-token-mean"), const * nonempty.mean())
    assert torch.allclose(aggregate(x, mask, "token-mean"), T(const if mask.any() else 0.0))
    assert torch.allclose(aggregate(x, mask, "seq-mean-token-sum"), const * lengths.mean())
    assert torch.allclose(aggregate(x, mask, "seq-mean-token-sum-norm", max_len=9), const * lengths.sum() / (B * 9))


@SET
@given(agg_case)
def test_per_token_gradient_weights_of_the_three_main_modes(c):
    x, mask = agg_unpack(c)
    B = x.size(0)
    lengths = mask.sum(1, keepdim=True).double().clamp(min=1)
    expected = {"seq-mean-token-mean": 1 / (B * lengths).expand_as(x),
                "token-mean": torch.full_like(x, 1 / max(int(mask.sum()), 1)),
                "seq-mean-token-sum-norm": torch.full_like(x, 1 / (B * 7))}
    for mode, w in expected.items():
        a = x.clone().requires_grad_(True)
        aggregate(a, mask, mode, max_len=7).backward()
        assert torch.allclose(a.grad, torch.where(mask, w, 0.0)), f"{mode}: weights {a.grad.tolist()}"


def test_fully_masked_rows_give_no_nan():
    x = T([[1.0, 2.0], [float("nan"), 3.0]])
    mask = torch.tensor([[True, True], [False, False]])
    for mode in AGG_MODES:
        assert torch.isfinite(aggregate(x, mask, mode)), mode
    assert torch.isfinite(aggregate(x, torch.zeros_like(mask), "token-mean"))


def test_unknown_mode_names_the_choices():
    try:
        aggregate(T([[1.0]]), torch.tensor([[True]]), "mean")
    except ValueError as e:
        assert all(m in str(e) for m in AGG_MODES)
    else:
        raise AssertionError("expected ValueError")


# ---- entropy, value loss -----------------------------------------------------------------------

@SET
@given(st.lists(st.floats(-30, 30), min_size=2, max_size=10), st.floats(-100, 100))
def test_entropy_bounds_shift_invariance_and_agreement_with_torch(logits, shift):
    x = T(logits)
    h = entropy(x)
    assert -1e-9 <= h <= math.log(len(logits)) + 1e-9
    assert torch.allclose(entropy(x + shift), h, atol=1e-9)
    assert torch.allclose(h, torch.distributions.Categorical(logits=x).entropy(), atol=1e-9)


def test_entropy_of_uniform_is_log_v_and_finite_at_extremes():
    assert torch.allclose(entropy(torch.zeros(3, 7)), torch.full((3,), math.log(7)))
    assert torch.isfinite(entropy(torch.tensor([[1e4, -1e4, 0.0]]))).all()


def test_value_loss_hand_formula_and_clipping():
    v, v_old, ret = T([[1.0, 3.0, 9.0]]), T([[0.5, 1.0, float("nan")]]), T([[2.0, 0.0, 1e4]])
    mask = torch.tensor([[True, True, False]])
    plain = value_loss(v, v_old, ret, mask)
    assert torch.allclose(plain, T([[0.5, 4.5, 0.0]]))
    clipped = value_loss(v, v_old, ret, mask, clip=0.2)
    # row 0: V clipped to 0.7 -> (0.7-2)^2 = 1.69 > 1 -> 0.845; row 1: V clipped to 1.2 -> 1.44 < 9 -> 4.5
    assert torch.allclose(clipped, T([[0.845, 4.5, 0.0]]))
    assert (clipped >= plain).all(), "the clipped value loss only ever takes the larger error"
