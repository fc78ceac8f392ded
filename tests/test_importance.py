"""Properties of minigrpo/objectives/importance.py: truncated (TIS) and masked (MIS / IcePop)
importance weights for the sampler-trainer mismatch, per token and per sequence. Float64
throughout."""

import math

import pytest
import torch
from conftest import SET, T, call, garbage
from hypothesis import given
from hypothesis import strategies as st

# batches of per-token values in [−5, 5], lengths
from test_losses import agg_case as case
from test_losses import agg_unpack

from minigrpo.objectives.importance import mis_weights, tis_weights

LEVELS = ["token", "sequence"]


def unpack(c):
    """(log π_old, log π_sampler, mask) from agg_case's (per-token log π_old − log π_sampler,
    lengths)."""
    log_ratio, mask = agg_unpack(c)
    sampler = torch.linspace(-4.0, -0.2, log_ratio.numel(), dtype=torch.float64).view_as(log_ratio)
    return sampler + log_ratio, sampler, mask


def token_ratios(old, sampler, mask):
    """Plain-float ratios π_old/π_sampler of the valid tokens, row by row (for the products)."""
    return [
        [math.exp(old[b, t] - sampler[b, t]) for t in range(old.size(1)) if mask[b, t]]
        for b in range(len(old))
    ]


@SET
@given(case, st.sampled_from(LEVELS))
def test_equal_sampler_and_trainer_give_weights_of_exactly_one_on_valid_tokens(c, level):
    old, _, mask = unpack(c)
    for w in (
        call(tis_weights, old, old.clone(), mask, level=level, shape=old.shape),
        call(mis_weights, old, old.clone(), mask, level=level, shape=old.shape),
    ):
        assert (w[mask] == 1).all() and (w[~mask] == 0).all(), (
            f"{level}: equal log-probs must give 1 (0 masked): {w}"
        )


@SET
@given(case, st.floats(1.0, 4.0))
def test_token_tis_is_the_elementwise_min_of_the_ratio_and_the_cap(c, cap):
    old, sampler, mask = unpack(c)
    w = call(tis_weights, old, sampler, mask, cap=cap, shape=old.shape)
    want = torch.where(mask, (old - sampler).exp().clamp(max=cap), 0.0)
    assert torch.allclose(w, want, rtol=1e-12, atol=0), (
        f"token TIS must be min(π_old/π_sampler, C): {w} vs {want}"
    )
    assert (w <= cap).all(), f"every weight must be ≤ the cap {cap}: {w}"


@SET
@given(case, st.floats(1.0, 4.0))
def test_sequence_tis_is_the_capped_product_of_the_token_ratios_on_every_valid_token(c, cap):
    old, sampler, mask = unpack(c)
    w = call(tis_weights, old, sampler, mask, cap=cap, level="sequence", shape=old.shape)
    for b, ratios in enumerate(token_ratios(old, sampler, mask)):
        want = min(math.prod(ratios), cap)  # the empty product is 1
        assert torch.allclose(w[b][mask[b]], T(want), rtol=1e-9), (
            f"row {b}: {w[b]} vs min(Π w_t, C) = {want}"
        )
        assert (w[b][~mask[b]] == 0).all()


@SET
@given(case, st.floats(0.3, 1.0), st.floats(1.0, 3.0), st.sampled_from(LEVELS))
def test_mis_keeps_the_ratio_inside_the_band_and_zero_outside(c, low, high, level):
    old, sampler, mask = unpack(c)
    w = call(mis_weights, old, sampler, mask, low=low, high=high, level=level, shape=old.shape)
    ratios = token_ratios(old, sampler, mask)
    for b in range(old.size(0)):
        row = ratios[b] if level == "token" else [math.prod(ratios[b])] * len(ratios[b])
        for got, r in zip(w[b][mask[b]].tolist(), row):
            inside = low * (1 - 1e-12) <= r <= high * (1 + 1e-12)
            # skip the rounding band at the edges
            if low * (1 + 1e-9) < r < high * (1 - 1e-9) or not inside:
                want = r if inside else 0.0
                assert math.isclose(got, want, rel_tol=1e-9, abs_tol=0), (
                    f"{level} MIS: ratio {r} in [{low}, {high}] must give {want}, got {got}"
                )
    assert (w[~mask] == 0).all() and (w <= high * (1 + 1e-12)).all()


@pytest.mark.parametrize("level", LEVELS)
def test_masked_junk_leaves_no_trace_and_the_weights_carry_no_gradient(level):
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, False]])
    old = T([[-1.0, -0.5, 0.0], [0.0, 0.0, 0.0], [-2.0, 0.0, 0.0]], grad=True)
    sampler = T([[-1.2, -0.4, 0.0], [0.0, 0.0, 0.0], [-1.5, 0.0, 0.0]])
    for fn in (tis_weights, mis_weights):
        clean = fn(old, sampler, mask, level=level)
        dirty = fn(garbage(old, mask), garbage(sampler, mask), mask, level=level)
        assert torch.isfinite(dirty).all() and torch.equal(dirty, clean), (
            f"{fn.__name__}: junk changed {clean}"
        )
        assert (clean[~mask] == 0).all() and not clean.requires_grad, (
            f"{fn.__name__} must be detached, 0 masked"
        )


def test_long_rows_neither_overflow_nor_give_nan():
    old, sampler = (
        torch.full((2, 60), 0.0, dtype=torch.float64),
        torch.full((2, 60), -20.0, dtype=torch.float64),
    )
    sampler[1] = 20.0  # row 0: Π w = e^1200 (overflows), row 1: e^−1200 (underflows)
    tis = tis_weights(old, sampler, None, cap=3.0, level="sequence")
    assert (tis[0] == 3.0).all() and (tis[1] == 0).all(), (
        f"overflowing product must cap at C, underflow give 0: {tis}"
    )
    mis = mis_weights(old, sampler, None, level="sequence")
    assert torch.isfinite(mis).all() and (mis == 0).all(), (
        "both rows far outside the band: dropped, no inf or NaN"
    )


def test_hand_values_and_argument_checks():
    old, sampler = T([[math.log(3.0), math.log(0.25), 0.0]]), T([[0.0, 0.0, 0.0]])
    assert torch.allclose(tis_weights(old, sampler), T([[2.0, 0.25, 1.0]])), "min(3, 2), 0.25, 1"
    assert torch.allclose(mis_weights(old, sampler), T([[0.0, 0.0, 1.0]])), (
        "3 and 0.25 outside [0.5, 2]: dropped"
    )
    assert torch.allclose(tis_weights(old, sampler, level="sequence"), T([[0.75] * 3])), (
        "3·0.25·1 = 0.75 < 2"
    )
    with pytest.raises(ValueError):
        tis_weights(old, sampler, cap=0.9)
    with pytest.raises(ValueError):
        mis_weights(old, sampler, low=2.0, high=1.0)
    with pytest.raises(ValueError, match="token"):
        tis_weights(old, sampler, level="seq")
