import torch

from minigrpo.optim import AdamW


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
