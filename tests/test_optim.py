import pytest
import torch

from minigrpo.lm.optim import AdamW, clip_grad_norm


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
