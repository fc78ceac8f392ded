"""Properties of minigrpo/objectives/preference.py: DPO's loss (its value at equal margins, gradient
signs, swap identities, stability) and the preference pairs built from rewarded groups. Float64
throughout."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import SET, T, call, garbage, right_padded
from hypothesis import given
from hypothesis import strategies as st

from minigrpo.lm.logprobs import sequence_logp
from minigrpo.objectives.preference import dpo_loss, preference_pairs

seq = st.floats(-60, 0)
pairs = st.integers(1, 5).flatmap(
    lambda n: st.lists(st.tuples(seq, seq, seq, seq), min_size=n, max_size=n)
)
betas = st.floats(0.01, 2.0)


def columns(rows, grad=False):
    """Four (P,) tensors: policy chosen, policy rejected, reference chosen, reference rejected."""
    return [T([r[k] for r in rows], grad=grad) for k in range(4)]


def margin(pc, pr, rc, rr):
    return (pc - rc) - (pr - rr)


@SET
@given(pairs, betas)
def test_equal_log_ratios_give_log_two(rows, beta):
    pc, pr, rc, _ = columns(rows)
    rr = pr - pc + rc  # the rejected's log-ratio equals the chosen's: margin 0
    loss = call(dpo_loss, pc, pr, rc, rr, beta, shape=pc.shape)
    assert torch.allclose(loss, torch.full_like(loss, math.log(2)), atol=1e-12), (
        f"margin 0 must give log 2: {loss}"
    )


@SET
@given(pairs, betas)
def test_descent_raises_the_chosen_and_lowers_the_rejected_with_weight_beta_sigma_minus_beta_m(
    rows, beta
):
    pc, pr, rc, rr = columns(rows, grad=True)
    dpo_loss(pc, pr, rc, rr, beta).sum().backward()
    w = beta * torch.sigmoid(-beta * margin(pc, pr, rc, rr).detach())
    assert torch.allclose(pc.grad, -w, rtol=1e-12) and (pc.grad < 0).all(), (
        f"∂L/∂log π(y_w) = −βσ(−βm): {pc.grad}"
    )
    assert torch.allclose(pr.grad, w, rtol=1e-12) and (pr.grad > 0).all(), (
        f"∂L/∂log π(y_l) = +βσ(−βm): {pr.grad}"
    )
    assert torch.allclose(rc.grad, w) and torch.allclose(rr.grad, -w), (
        "the reference enters with the opposite signs"
    )


@SET
@given(pairs, betas)
def test_swapping_chosen_and_rejected_gives_the_two_bradley_terry_identities(rows, beta):
    pc, pr, rc, rr = columns(rows)
    forward, swapped = dpo_loss(pc, pr, rc, rr, beta), dpo_loss(pr, pc, rr, rc, beta)
    m = margin(pc, pr, rc, rr)
    assert torch.allclose(forward - swapped, -beta * m, atol=1e-9), "L(w, l) − L(l, w) must be −β·m"
    assert torch.allclose((-forward).exp() + (-swapped).exp(), torch.ones_like(m)), (
        "σ(βm) + σ(−βm) = 1"
    )


@SET
@given(pairs, betas, st.floats(-5, 5), st.floats(0.01, 5))
def test_the_loss_ignores_shifts_of_a_whole_side_and_falls_as_the_margin_grows(
    rows, beta, shift, more
):
    pc, pr, rc, rr = columns(rows)
    base = dpo_loss(pc, pr, rc, rr, beta)
    assert torch.allclose(dpo_loss(pc + shift, pr, rc + shift, rr, beta), base, atol=1e-12), (
        "shift of y_w's side"
    )
    assert (dpo_loss(pc + more, pr, rc, rr, beta) < base).all(), (
        "raising log π(y_w) must lower the loss"
    )


def test_extreme_margins_are_finite_and_exact():
    pc = T([1e4, -1e4, 0.0], grad=True)
    zero = torch.zeros(3, dtype=torch.float64)
    loss = dpo_loss(pc, zero, zero, zero, beta=1.0)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(pc.grad).all(), (
        f"loss {loss}, grad {pc.grad}"
    )
    assert loss[0] == 0 and loss[1] == 1e4 and abs(loss[2] - math.log(2)) < 1e-15, (
        f"−log σ(±1e4), log 2: {loss}"
    )
    assert torch.equal(loss, -F.logsigmoid(pc.detach())), "must be −logsigmoid(β·m)"


def test_sequence_logp_sums_the_valid_tokens_only():
    mask = right_padded([2, 0, 3], 3)
    logp = T([[-1.0, -2.0, 0.0], [0.0, 0.0, 0.0], [-0.5, -0.25, -0.25]])
    leaf = garbage(logp, mask).requires_grad_(True)
    got = call(sequence_logp, leaf, mask, shape=(3,))
    assert torch.equal(got.detach(), T([-3.0, 0.0, -1.0])), (
        f"Σ over valid tokens, 0 for an empty row: {got}"
    )
    got.sum().backward()
    assert torch.equal(leaf.grad, mask.double()), "gradient 1 on valid tokens, 0 (not NaN) on junk"


# ---- pairs ---------------------------------------------------------------------------------------

groups = st.integers(1, 4).flatmap(
    lambda B: st.integers(1, 6).flatmap(
        lambda G: st.lists(
            st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=G, max_size=G),
            min_size=B,
            max_size=B,
        )
    )
)


@SET
@given(groups)
def test_all_pairs_are_exactly_the_strictly_ordered_pairs_of_each_group(rows):
    r = T(rows)
    g, w, l = preference_pairs(r, "all")
    got = sorted(zip(g.tolist(), w.tolist(), l.tolist()))
    want = sorted(
        (b, i, j)
        for b, row in enumerate(rows)
        for i in range(len(row))
        for j in range(len(row))
        if row[i] > row[j]
    )
    assert got == want, (
        f"rewards {rows}: pairs {got}, want every (group, i, j) with r_i > r_j: {want}"
    )
    assert g.dtype == w.dtype == l.dtype == torch.long


@SET
@given(groups)
def test_best_worst_gives_one_pair_per_group_with_contrast_its_best_against_its_worst(rows):
    r = T(rows)
    g, w, l = preference_pairs(r, "best_worst")
    contrast = [b for b, row in enumerate(rows) if max(row) > min(row)]
    assert g.tolist() == contrast, (
        f"one pair per group whose rewards differ: {g.tolist()} vs {contrast}"
    )
    for b, i, j in zip(g.tolist(), w.tolist(), l.tolist()):
        assert (i, j) == (rows[b].index(max(rows[b])), rows[b].index(min(rows[b]))), (
            f"group {b}: ({i}, {j})"
        )


def test_binary_rewards_hand_example_and_unknown_mode():
    r = T([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    g, w, l = preference_pairs(r)
    assert list(zip(g.tolist(), w.tolist(), l.tolist())) == [
        (0, 0, 1),
        (0, 0, 2),
        (0, 3, 1),
        (0, 3, 2),
    ], "2 correct x 2 wrong = 4 pairs from group 0, none from the all-correct group 1"
    with pytest.raises(ValueError, match="best_worst"):
        preference_pairs(r, "top")
