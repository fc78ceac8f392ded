"""population/guard.py: the members' trust-region KLs against the single run's
(rl/trust_region.sequence_kl), and a probe's groups one-hot encoded once, carried from one step's
guard to the next."""

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from minigrpo.population import guard
from minigrpo.population.guard import sequence_kls
from minigrpo.rl.trust_region import sequence_kl


def test_the_members_sequence_kls_are_the_single_trust_regions():
    torch.manual_seed(0)
    old, new = torch.randn(3, 6, 5, 7), torch.randn(3, 6, 5, 7)
    mask, w, g = torch.rand(3, 6, 5) > 0.3, torch.rand(6), torch.tensor([0, 0, 1, 1, 2, 2])
    got = sequence_kls(old, new, mask, w, g)
    # its one-hot given: the same
    assert torch.equal(sequence_kls(old, new, mask, w, g, F.one_hot(g)), got)
    for p in range(3):
        assert abs(got[p].item() - sequence_kl(old[p], new[p], mask[p], w, g)) < 1e-5
        assert (
            abs(sequence_kls(old, new, mask)[p].item() - sequence_kl(old[p], new[p], mask[p]))
            < 1e-5
        )


def test_members_of_their_own_rows_weights_and_groups_are_their_single_trust_regions():
    """--person: each member's anchor rows its own, weights and groups (P, N) (a row of weight 0:
    padding)."""
    torch.manual_seed(1)
    old, new, mask = torch.randn(3, 6, 5, 7), torch.randn(3, 6, 5, 7), torch.rand(3, 6, 5) > 0.3
    w = torch.rand(3, 6) * torch.tensor([[1.0] * 6, [1.0] * 5 + [0.0], [1.0] * 6])
    g = torch.tensor([[0, 0, 1, 1, 2, 2], [2, 1, 0, 0, 1, 0], [0, 1, 2, 0, 1, 2]])
    got = sequence_kls(old, new, mask, w, g)
    for p in range(3):
        assert abs(got[p].item() - sequence_kl(old[p], new[p], mask[p], w[p], g[p])) < 1e-5


def test_a_probes_groups_are_one_hot_encoded_once_and_carried_to_the_next_guard():
    """Its width, the groups' count, is a read of the device: the anchor probe's group tensor is the
    same each step, so its one-hot matrix is made at the first step only."""
    g = torch.tensor([0, 0, 1, 2])
    first = guard._one_hot(None, "anchor", g)
    assert torch.equal(first, F.one_hot(g)) and guard._one_hot(None, "rollout", None) is None
    previous = SimpleNamespace(probes=[("anchor", None, 0.1, None, (None, g, first))])
    assert guard._one_hot(previous, "anchor", g) is first
    assert guard._one_hot(previous, "anchor", g.clone()) is not first  # other groups: made anew
    assert guard._one_hot(previous, "rollout", g) is not first
