import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minigrpo.lm.optim import AdamW, clip_grad_norm, scheduled_lr


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


SHAPES = [(5, 4), (7,), (3, 2, 2)]


ALL = [True] * 4


@settings(max_examples=40, deadline=None)
@example(  # tests/test_lockstep.py's case of MembersAdamW, the stacked AdamW before this one
    P=3,
    seed=0,
    steps=[
        (ALL, True),
        ([True, False, True, True], False),
        (ALL, False),
        ([False, *ALL[1:]], False),
    ],
    decay=0.1,
)
@given(
    P=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    steps=st.lists(
        st.tuples(st.lists(st.booleans(), min_size=4, max_size=4), st.booleans()),
        min_size=1,
        max_size=4,
    ),
    decay=st.sampled_from([0.0, 0.1]),
)
def test_a_stacked_step_is_each_slices_own_adamw_and_a_skipped_slice_is_untouched(
    P, seed, steps, decay
):
    """AdamW over tensors stacked (P, ...), a count and (random) rate per slice, some steps taken by
    some slices only: each slice's weights, moments and count are its own AdamW's (to the bit, on
    the CPU), a slice that skips a step keeps them to the bit; the per-slice clip is each slice's
    own clip_grad_norm."""
    gen = torch.Generator().manual_seed(seed)
    ws = [torch.randn(P, *s, generator=gen) for s in SHAPES]
    stacked = [w.clone().requires_grad_() for w in ws]
    alone = [[w[p].clone().requires_grad_() for w in ws] for p in range(P)]
    together = AdamW(stacked, 1e-2, weight_decay=decay, t=torch.zeros(P, dtype=torch.long))
    opts = [AdamW(a, 1e-2, weight_decay=decay) for a in alone]
    for mask, alike in steps:
        active = torch.tensor(mask[:P])
        rates = torch.full((P,), 3e-3) if alike else torch.rand(P, generator=gen) * 1e-2
        together.param_groups[0]["lr"] = rates.double()
        grads = [torch.randn(P, *s, generator=gen) * 3 for s in SHAPES]
        for w, g in zip(stacked, grads):
            w.grad = g.clone()
        before = [x.clone() for x in stacked + together.m + together.v]
        norms = clip_grad_norm(stacked, 1.0, per_slice=True)
        together.step(active)
        for p in range(P):
            for a, g in zip(alone[p], grads):
                a.grad = g[p].clone()
            assert torch.equal(clip_grad_norm(alone[p], 1.0), norms[p])
            assert all(torch.equal(a.grad, w.grad[p]) for a, w in zip(alone[p], stacked))
            if active[p]:
                opts[p].param_groups[0]["lr"] = float(rates.double()[p])
                opts[p].step()
            else:
                after = stacked + together.m + together.v
                assert all(torch.equal(x[p], y[p]) for x, y in zip(before, after))
    assert together.t.tolist() == [o.t for o in opts]
    for p, o in enumerate(opts):
        assert all(torch.equal(a, w[p]) for a, w in zip(alone[p], stacked)), p
        assert all(torch.equal(a, w[p]) for a, w in zip(o.m + o.v, together.m + together.v)), p


def test_the_per_slice_clip_sums_each_slice_in_its_own_layout():
    """Slices laid out as transposes (a GPT's Linear weights: lm/model.in_out_order; a population
    stacks them so, population/stacked.stacked): each slice's norm is that of a run alone whose
    gradient has that layout, to the bit (a norm sums in memory order: summed in the contiguous
    order, about a third of these differ in the last bit)."""
    from minigrpo.lm.model import in_out_order

    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        grads = [torch.randn(3, 96, 32, generator=gen) * 10.0 ** -(seed % 4) for _ in range(3)]
        stacked = [
            torch.nn.Parameter(g.transpose(1, 2).contiguous().transpose(1, 2)) for g in grads
        ]
        for w, g in zip(stacked, grads):
            w.grad = g.transpose(1, 2).contiguous().transpose(1, 2)
        norms = clip_grad_norm(stacked, 1e-3, per_slice=True)
        for p in range(3):
            alone = [torch.nn.Parameter(in_out_order(g[p])) for g in grads]
            for a, g in zip(alone, grads):
                a.grad = in_out_order(g[p])
            assert torch.equal(clip_grad_norm(alone, 1e-3), norms[p]), (seed, p)
            assert all(torch.equal(a.grad, w.grad[p]) for a, w in zip(alone, stacked))


def test_the_per_slice_clip_keeps_a_nan_in_its_own_slice():
    g = torch.ones(3, 4)
    g[1, 2] = float("nan")
    w = torch.nn.Parameter(torch.zeros(3, 4))
    w.grad = g.clone()
    norms = clip_grad_norm([w], 1.0, per_slice=True)
    assert torch.isnan(norms[1]) and torch.isnan(w.grad[1]).all()
    assert torch.equal(norms[[0, 2]], torch.full((2,), 2.0))
    assert torch.allclose(w.grad[[0, 2]], torch.full((2, 4), 0.5 / (1 + 5e-7)))


def test_clip_grad_norm_lets_a_nan_through_like_torch():
    a = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    a[0].grad, a[1].grad = torch.tensor([1.0, float("nan"), 2.0]), torch.tensor([3.0, 4.0])
    assert torch.isnan(clip_grad_norm(a, 1.0))
    # torch multiplies every gradient by the NaN coefficient too
    assert torch.isnan(a[1].grad).all()


@given(
    lr=st.floats(1e-6, 1.0),
    steps=st.integers(1, 400),
    warmup=st.integers(0, 50),
    warmdown=st.floats(0.0, 1.0),
)
def test_the_schedule_warms_up_holds_then_falls_to_zero_at_the_cap(lr, steps, warmup, warmdown):
    rates = [scheduled_lr(lr, s, steps, warmup, warmdown) for s in range(steps + 1)]
    n = round(warmdown * steps)
    for s, rate in enumerate(rates):
        assert 0 <= rate <= lr
        warm = min(1.0, (s + 1) / warmup) if warmup else 1.0
        # before the warm-down: the warm-up's rate, the rate of the run without a warm-down
        if s <= steps - n:
            assert rate == (lr * warm if warmup else lr)
        else:  # the warm-down: falls by lr·warm/n a step, to 0 at the cap
            assert rate == pytest.approx(lr * warm * (steps - s) / n, rel=1e-12)
    if n:
        assert rates[steps] == 0.0 and rates[steps - 1] > 0  # the last step still learns
    after = rates[warmup:]
    assert all(b <= a for a, b in zip(after, after[1:]))  # never rises after the warm-up


def test_the_warm_down_leaves_a_run_that_stops_early_untouched_and_whole_is_nanochats_ramp():
    # a 200-step cap: a run that stops at its goal within 160 steps has the rates of a 10,000-step
    # cap, to the bit
    held = [6e-4 * min(1.0, (s + 1) / 5) for s in range(160)]  # the rate without a warm-down
    assert [scheduled_lr(6e-4, s, 200, 5, 0.2) for s in range(160)] == held
    assert [scheduled_lr(6e-4, s, 10_000, 5, 0.2) for s in range(160)] == held
    assert [scheduled_lr(6e-4, s, 60, 5, 0.2) for s in range(48, 60)] == pytest.approx(
        [6e-4 * (60 - s) / 12 for s in range(48, 60)]
    )  # compare's 60 steps: the last 12 fall
    assert [scheduled_lr(1e-3, s, 50, 0, 1.0) for s in range(50)] == pytest.approx(
        [1e-3 * (1 - s / 50) for s in range(50)]
    )  # warmdown 1: nanochat chat_rl's lrm = 1 − it/steps
