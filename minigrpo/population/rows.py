"""P members' rows as one lm/draws.Generation of (P, N, ...) tensors, and their step's rollouts as
one rl/rollout.RolloutBatch over it: lm/logprobs.generation_logprobs scores member p's rows under
its own weights (stacked), and RolloutBatch.select picks each member's own rows.

Prompts left-padded to the widest member's, completions right-padded to the longest, so completion
token j of every row sits in slot prompt_len + j. The Generation's prefix tree is a batch of P trees
(lm/prefix_tree.py), each the one its single run builds: its log-probs are its single run's to float
rounding (tests/test_rows.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from minigrpo.lm.draws import Generation
from minigrpo.lm.tokenizer import PAD_ID
from minigrpo.rl.rollout import RolloutBatch


def stacked_rows(gens: list[Generation]) -> Generation:
    """Each member's rows (every member the same number N) -> (P, N, W + T)."""
    W, T = max(g.prompt_len for g in gens), max(g.completion_mask.size(1) for g in gens)
    P, N, device = len(gens), gens[0].ids.size(0), gens[0].ids.device
    ids = torch.full((P, N, W + T), PAD_ID, dtype=torch.long, device=device)
    key_mask = torch.zeros((P, N, W + T), dtype=torch.bool, device=device)
    # members of one shape are copied in as one (a few copies, not 2 P)
    shapes: dict[tuple, list[int]] = {}
    for p, g in enumerate(gens):
        shapes.setdefault((g.prompt_len, g.completion_mask.size(1)), []).append(p)
    for (w, t), at in shapes.items():
        index = torch.tensor(at, device=device)
        ids[index, :, W - w : W + t] = torch.stack([gens[p].ids for p in at])
        key_mask[index, :, W - w : W + t] = torch.stack([gens[p].key_mask for p in at])
    return Generation(ids, key_mask, W, key_mask[:, :, W:], None, None)


def shared_rows(gen: Generation, members: int) -> Generation:
    """The same rows for every member (expanded, not copied) over their one prefix tree."""
    out = gen.map(lambda x: x[None].expand(members, *x.shape))
    out._tree = gen.prefix_tree().expand(members)
    return out


@dataclass
class Rollouts(RolloutBatch):
    """One step's rollouts of P members: a RolloutBatch of (P, ...) tensors (no texts: each
    member's own RolloutBatch has them)."""

    batches: list = field(default_factory=list)  # each member's RolloutBatch (None: it failed)
    runs: list = field(default_factory=list)  # each member's rl/loop.Run
    algos: list = field(default_factory=list)  # each member's algorithm object (PPO's: its β)

    def members(self, at: list[int], index: torch.Tensor, ref=True, old=True) -> Rollouts:
        """Members `at`'s rollouts (index: `at` on the rows' device), π_ref's (ref) and π_old's
        (old) log-probs where given."""
        take = lambda x, keep=True: x.index_select(0, index) if x is not None and keep else None
        return replace(
            self,
            gen=self.gen.map(take),
            rewards=take(self.rewards),
            ref_logp=take(self.ref_logp, ref),
            ref_logits=take(self.ref_logits, ref),
            old_logp=take(self.old_logp, old),
            batches=[self.batches[p] for p in at],
            runs=[self.runs[p] for p in at],
            algos=[self.algos[p] for p in at],
        )
