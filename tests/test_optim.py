import math

import pytest
import torch
from hypothesis import given, strategies as st

from minigrpo.lm.optim import DECAYS, AdamW, clip_grad_norm, scheduled_lr


def test_matches_torch_adamw_step_for_step():
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    ours = AdamW(a.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    ref = torch.optim.AdamW(b.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    for step in range(5):
        x = torch.randn(8, 4)
        for model, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6), (pa, pb)


def test_state_dict_round_trip_continues_identically():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(5, 3)
    def step(m, o):
        o.zero_grad()
        m(x).sum().backward()
        o.step()
    step(model, opt)
    twin = torch.nn.Linear(3, 1)
    twin.load_state_dict(model.state_dict())
    twin_opt = AdamW(twin.parameters(), lr=0.5)
    twin_opt.load_state_dict(opt.state_dict())
    step(model, opt)
    step(twin, twin_opt)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))


@pytest.mark.parametrize("max_norm", [1e-3, 0.5, 1e9, float("inf")])
def test_clip_grad_norm_is_torchs_to_the_bit(max_norm):
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(*s)) for s in [(7, 3), (3,), (64, 5)]]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b):
        p.grad = torch.randn_like(p) * 0.1
        q.grad = p.grad.clone()
    ours = clip_grad_norm(a, max_norm)
    theirs = torch.nn.utils.clip_grad_norm_(b, max_norm)
    assert torch.equal(ours, theirs)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a, b))
    if max_norm < 1:  # it did clip: the new norm is max_norm
        assert abs(torch.cat([p.grad.flatten() for p in a]).norm().item() - max_norm) < 1e-6


def test_clip_grad_norm_lets_a_nan_through_like_torch():
    a = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    a[0].grad, a[1].grad = torch.tensor([1.0, float("nan"), 2.0]), torch.tensor([3.0, 4.0])
    assert torch.isnan(clip_grad_norm(a, 1.0))
    assert torch.isnan(a[1].grad).all()  # torch multiplies every gradient by the NaN coefficient too


@given(lr=st.floats(1e-6, 1.0), steps=st.integers(1, 400), warmup=st.integers(0, 50),
       decay=st.sampled_from(DECAYS))
def test_the_schedule_warms_up_linearly_then_only_falls_within_lr_and_zero(lr, steps, warmup, decay):
    rates = [scheduled_lr(lr, s, steps, warmup, decay) for s in range(steps + 1)]
    for s, rate in enumerate(rates):
        assert 0 <= rate <= lr * (1 + 1e-12)
        if s < warmup:
            assert rate == pytest.approx(lr * (s + 1) / warmup, rel=1e-12)
    after = rates[min(warmup, steps):]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(after, after[1:]))  # never rises after the warm-up
    if warmup < steps:
        assert rates[warmup] == pytest.approx(lr, rel=1e-12)  # the warm-up ends at --lr
        end = {"constant": lr, "linear": 0.0, "cosine": 0.0}[decay]
        assert rates[steps] == pytest.approx(end, abs=1e-12 * lr)  # and the decay ends at 0 at --steps


@given(lr=st.floats(1e-6, 1.0), span=st.integers(1, 300), warmup=st.integers(0, 20))
def test_linear_falls_by_equal_amounts_and_cosine_is_symmetric_about_half(lr, span, warmup):
    steps = warmup + span
    lin = [scheduled_lr(lr, warmup + k, steps, warmup, "linear") for k in range(span + 1)]
    assert all(math.isclose(a - b, lr / span, rel_tol=1e-9, abs_tol=1e-15) for a, b in zip(lin, lin[1:]))
    cos = [scheduled_lr(lr, warmup + k, steps, warmup, "cosine") for k in range(span + 1)]
    assert all(math.isclose(cos[k] + cos[span - k], lr, rel_tol=1e-9) for k in range(span + 1))


def test_the_last_rl_step_still_learns_and_pretrainings_cosine_is_the_same_function():
    assert scheduled_lr(6e-4, 59, 60, 5, "linear") == pytest.approx(6e-4 / 55)  # the 60th step of 60: lr/55 > 0
    assert [scheduled_lr(6e-4, s, 60, 5, "linear") for s in range(5)] == [6e-4 * (s + 1) / 5 for s in range(5)]
    from minigrpo.pretrain import PretrainConfig, lr_at
    cfg = PretrainConfig(lr=2e-2, steps=100, warmup=10)
    assert [lr_at(s, cfg) for s in range(100)] == \
        [2e-2 * (s + 1) / 10 if s < 10 else 2e-2 * 0.5 * (1 + math.cos(math.pi * ((s - 10) / 90))) for s in range(100)]
