import copy

import torch

from minigrpo.objectives.kl import exact
from minigrpo.rl.rollout import collect
from minigrpo.rl.trust_region import StepGuard, sequence_kl
from toy_tasks import food
from toy_tasks.rewards import make_reward


def _batch(model, tok):
    return collect(
        model,
        model,
        tok,
        ["ravin likes "],
        8,
        make_reward("pizza", food.REWARDS),
        torch.Generator().manual_seed(0),
        max_new_tokens=12,
    )


def _kick(model, size):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(size * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))


def test_a_small_step_is_kept_whole(tiny_pretrained):
    _, model, tok = tiny_pretrained
    model = copy.deepcopy(model)
    guard = StepGuard(model, [("rollout", _batch(model, tok).gen, 10.0, None, None)])
    _kick(model, 1e-3)
    after = [p.detach().clone() for p in model.parameters()]
    stats = guard.enforce(model)
    assert stats["tr_scale"] == 1.0 and all(
        torch.equal(a, p) for a, p in zip(after, model.parameters())
    )


def test_a_large_step_is_halved_until_its_kl_is_within_the_limit(tiny_pretrained):
    _, model, tok = tiny_pretrained
    model = copy.deepcopy(model)
    gen = _batch(model, tok).gen
    before = [p.detach().clone() for p in model.parameters()]
    guard = StepGuard(model, [("rollout", gen, 0.05, None, None)], max_halvings=12)
    _kick(model, 0.05)
    full = [p.detach().clone() for p in model.parameters()]
    stats = guard.enforce(model)
    assert 0 < stats["tr_scale"] < 1 and stats["tr_kl_rollout"] <= 0.05
    for b, f, p in zip(before, full, model.parameters()):  # θ = θ_old + scale · (θ_new − θ_old)
        assert torch.allclose(p, b + stats["tr_scale"] * (f - b), atol=1e-6)
    # the reported KL is the real one
    old = StepGuard(copy.deepcopy(model), [("x", gen, 1.0, None, None)])
    assert (
        abs(
            stats["tr_kl_rollout"]
            - sequence_kl(guard.probes[0][3], old.probes[0][3], gen.completion_mask)
        )
        < 1e-6
    )


def test_a_step_that_stays_too_large_is_rejected(tiny_pretrained):
    _, model, tok = tiny_pretrained
    model = copy.deepcopy(model)
    before = [p.detach().clone() for p in model.parameters()]
    guard = StepGuard(
        model, [("rollout", _batch(model, tok).gen, 1e-12, None, None)], max_halvings=2
    )
    _kick(model, 0.05)
    stats = guard.enforce(model)
    assert stats["tr_scale"] == 0.0 and all(
        torch.equal(b, p) for b, p in zip(before, model.parameters())
    )


def test_a_grouped_probe_reports_its_worst_group():
    torch.manual_seed(0)
    old = torch.randn(4, 3, 5)
    new = old.clone()
    new[2:] += torch.randn(2, 3, 5)  # only the second group moves
    mask = torch.ones(4, 3, dtype=torch.bool)
    both = sequence_kl(old, new, mask)
    worst = sequence_kl(old, new, mask, group=torch.tensor([0, 0, 1, 1]))
    assert worst > both > 0 and abs(worst - 2 * both) < 1e-5  # the first group's KL is 0
    # weights: a row of weight 0 counts for nothing; the group means are weighted means
    rows = torch.where(mask, exact(old, new), 0.0).sum(1)
    w = torch.tensor([1.0, 1.0, 3.0, 0.0])
    got = sequence_kl(old, new, mask, weights=w, group=torch.tensor([0, 0, 1, 1]))
    assert abs(got - rows[2].item()) < 1e-5, "the weighted mean of group 1 is its only weighted row"
