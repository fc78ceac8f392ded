"""util/opcount.py: torch calls counted by what a chosen function was calling."""

import torch

from minigrpo.objectives.losses import aggregate
from minigrpo.util.opcount import TorchCalls


def test_calls_are_counted_by_the_roots_callee_and_reads_of_a_value_as_syncs():
    x, mask = torch.ones(2, 3), torch.tensor([[True, True, False], [True, False, False]])
    with TorchCalls(root="minigrpo/objectives/losses.py:aggregate",
                    inside=("minigrpo/objectives/losses.py:_token_mean",)) as c:
        out = aggregate(x, mask, "token-mean")
        assert out.item() == 1.0  # outside the root: one call, a read
    assert c.counts[("(outside it)", "own")] == 1 and c.syncs[("(outside it)", "own")] == 1
    assert c.counts[("_token_mean", "model")] >= 3 and c.counts[("_token_mean", "own")] == 0  # it is `inside`
    assert c.counts[("zero_like", "own")] >= 1 and c.counts[("(its own code)", "own")] >= 1  # aggregate's torch.where
    assert set(k[0] for k in c.counts) == {"(outside it)", "_token_mean", "zero_like", "(its own code)"}, c.counts
