"""util/opcount.py: torch calls counted by what a chosen function was calling."""

import torch

from minigrpo.exact import frontier
from minigrpo.util.opcount import TorchCalls


def test_calls_are_counted_by_the_roots_callee_and_reads_of_a_value_as_syncs():
    p, r = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64), torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    with TorchCalls(root="minigrpo/exact/frontier.py:optimum", inside=("minigrpo/exact/frontier.py:_solve",)) as c:
        frontier.optimum(p, r, 0.5)
        p.sum()  # outside the root
    assert c.counts[("(outside it)", "own")] == 1
    assert c.counts[("_solve", "model")] > 10 and c.counts[("_solve", "own")] == 0  # _solve is `inside`
    assert c.counts[("_check", "own")] > 0 and c.syncs[("_check", "own")] >= 1  # its p.sum().item()
    assert set(k[0] for k in c.counts) <= {"(outside it)", "_solve", "_check", "_betas", "(its own code)"}, c.counts
