"""bench/opcount.py: torch calls and kernels counted by what a chosen function was calling."""

import torch

from minigrpo.bench.opcount import TorchCalls, TorchKernels
from minigrpo.objectives.losses import aggregate


def test_calls_are_counted_by_the_roots_callee_and_reads_of_a_value_as_syncs():
    x, mask = torch.ones(2, 3), torch.tensor([[True, True, False], [True, False, False]])
    with TorchCalls(
        root="minigrpo/objectives/losses.py:aggregate",
        inside=("minigrpo/objectives/losses.py:_token_mean",),
    ) as c:
        out = aggregate(x, mask, "token-mean")
        assert out.item() == 1.0  # outside the root: one call, a read
    assert c.counts[("(outside it)", "own")] == 1 and c.syncs[("(outside it)", "own")] == 1
    # it is `inside`
    assert c.counts[("_token_mean", "model")] >= 3 and c.counts[("_token_mean", "own")] == 0
    # aggregate's torch.where
    assert c.counts[("zero_like", "own")] >= 1 and c.counts[("(its own code)", "own")] >= 1
    assert set(k[0] for k in c.counts) == {
        "(outside it)",
        "_token_mean",
        "zero_like",
        "(its own code)",
    }, c.counts


def test_kernels_are_the_operators_that_compute_the_backwards_included_views_left_out():
    x = torch.ones(4, 3, requires_grad=True)
    with TorchKernels(root="minigrpo/objectives/losses.py:aggregate") as k:
        out = aggregate(x.view(2, 6)[:, :3] * 2, torch.ones(2, 3, dtype=torch.bool), "token-mean")
        out.backward()
    with TorchKernels(root="minigrpo/objectives/losses.py:aggregate") as views:
        x.detach().view(12)[2:].t()
    assert sum(views.counts.values()) == 0  # views and a detach launch nothing
    # the multiply, and the backward's (run outside the root)
    assert k.counts[("(outside it)", "own")] >= 3
    assert sum(n for key, n in k.counts.items() if key[0] != "(outside it)") >= 2  # the mean's
