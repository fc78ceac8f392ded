"""rl/trust_region.py over a leading member dim (a lockstep population's guard): each member's KLs
and halvings are its single run's, to the bit on the CPU, and a probe's groups are counted once,
carried from one step's guard to the next."""

from types import SimpleNamespace

import torch

from minigrpo.rl import trust_region
from minigrpo.rl.trust_region import StepGuard, sequence_kl


def test_the_members_sequence_kls_are_their_single_runs_to_the_bit():
    torch.manual_seed(0)
    old, new = torch.randn(3, 6, 5, 7), torch.randn(3, 6, 5, 7)
    mask, w, g = torch.rand(3, 6, 5) > 0.3, torch.rand(6), torch.tensor([0, 0, 1, 1, 2, 2])
    got = sequence_kl(old, new, mask, w, g)
    assert got.shape == (3,) and torch.equal(sequence_kl(old, new, mask, w, g, 3), got)
    for p in range(3):
        assert torch.equal(got[p], sequence_kl(old[p], new[p], mask[p], w, g))
        assert torch.equal(sequence_kl(old, new, mask)[p], sequence_kl(old[p], new[p], mask[p]))


def test_members_of_their_own_rows_weights_and_groups_are_their_single_runs():
    """--person: each member's anchor rows its own, weights and groups (P, N) (a row of weight 0:
    padding)."""
    torch.manual_seed(1)
    old, new, mask = torch.randn(3, 6, 5, 7), torch.randn(3, 6, 5, 7), torch.rand(3, 6, 5) > 0.3
    w = torch.rand(3, 6) * torch.tensor([[1.0] * 6, [1.0] * 5 + [0.0], [1.0] * 6])
    g = torch.tensor([[0, 0, 1, 1, 2, 2], [2, 1, 0, 0, 1, 0], [0, 1, 2, 0, 1, 2]])
    got = sequence_kl(old, new, mask, w, g)
    for p in range(3):
        assert torch.equal(got[p], sequence_kl(old[p], new[p], mask[p], w[p], g[p]))


class _Stacked:
    """Members' linear 'models' (P, V, C) stacked; a probe's rows: inputs (P, N, T, C)."""

    def __init__(self, w):
        self.w = w

    def parameters(self):
        return [self.w]


def forward(model, r):  # (..., N, T, V): each member's own product, as alone
    if model.w.dim() == 2:
        return r.x @ model.w.T
    return torch.stack([x @ w.T for x, w in zip(r.x, model.w)])


def test_each_member_is_halved_or_rejected_as_its_single_run():
    """Three members, one step each: one kept whole, one halved, one rejected; each member's
    weights, scale and KL are those of the same guard run on it alone."""
    torch.manual_seed(2)
    x = torch.randn(3, 4, 5, 6)
    rows = SimpleNamespace(x=x, completion_mask=torch.ones(3, 4, 5, dtype=torch.bool))
    before = torch.randn(3, 7, 6)
    kicks = torch.stack([torch.randn(7, 6) * s for s in (1e-3, 0.2, 5.0)])
    stack = _Stacked(before.clone())
    guard = StepGuard(stack, [("rollout", rows, 0.05, None, None)], 2, forward=forward)
    stack.w += kicks
    stats = guard.enforce(stack)
    assert stats["tr_scale"].tolist() == [1.0, 0.5, 0.0]
    for p in range(3):
        one = _Stacked(before[p].clone())
        alone = SimpleNamespace(x=x[p], completion_mask=rows.completion_mask[p])
        single = StepGuard(one, [("rollout", alone, 0.05, None, None)], 2, forward=forward)
        one.w += kicks[p]
        want = single.enforce(one)
        assert torch.equal(one.w, stack.w[p])
        assert all(torch.equal(want[k], stats[k][p]) for k in want)


def test_a_probes_groups_are_counted_once_and_carried_to_the_next_guard():
    """The count, group.max() + 1, is a read of the device: the anchor probe's group tensor is the
    same each step, so it is counted at the first step only."""
    g = torch.tensor([0, 0, 1, 2])
    first = trust_region._groups(None, "anchor", g)
    assert first == (g, 3) and trust_region._groups(None, "rollout", None) == (None, 1)
    previous = SimpleNamespace(groups={"anchor": (g, 7)})  # 7: not counted again
    assert trust_region._groups(previous, "anchor", g) == (g, 7)
    assert trust_region._groups(previous, "anchor", g.clone())[1] == 3  # other groups: anew
    assert trust_region._groups(previous, "rollout", g)[1] == 3
