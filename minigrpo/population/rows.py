"""The rows of P members as one (P, N, ...) batch, scored by lm/logprobs.generation_logprobs under
each member's own weights (stacked) in one forward.

    rows = Rows.of([gen_0, gen_1, ...])               # each member's Generation, N rows each
    rows = Rows.shared(anchor.gen, P)                 # the same rows for every member
    logp, logits = rows.logprobs(stack, temperature)  # (P, N, T), (P, N, T, V)

Prompts left-padded to the widest member's, completions right-padded to the longest, so completion
token j of every row sits in slot prompt_len + j. Each member's rows go through the prefix tree its
single run builds of them (lm/prefix_tree.py: a batch of P trees, built as one; shared rows one
tree), so its log-probs are its single run's to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.lm.prefix_tree import PrefixTree, next_token_tree
from minigrpo.lm.sampling import Generation
from minigrpo.lm.tokenizer import PAD_ID
from minigrpo.population.stacked import Stack
from minigrpo.rl.rollout import take


@dataclass
class Rows:
    """What generation_logprobs reads of a Generation, with (P, ...) before each shape."""

    ids: torch.Tensor  # (P, N, W + T) long
    key_mask: torch.Tensor  # (P, N, W + T) bool: real prompt and completion tokens
    prompt_len: int  # W
    completion_mask: torch.Tensor  # (P, N, T) bool
    # the members' prefix trees of the next-token forward (a batch of P); None: built on first use
    tree: PrefixTree | None = None

    @classmethod
    def of(cls, gens: list[Generation]) -> Rows:
        """Each member's rows (every member the same number N)."""
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
        return cls(ids, key_mask, W, key_mask[:, :, W:])

    @classmethod
    def shared(cls, gen: Generation, members: int) -> Rows:
        """The same rows for every member (expanded, not copied) over their one prefix tree."""
        grow = lambda x: x[None].expand(members, *x.shape)
        return cls(
            grow(gen.ids),
            grow(gen.key_mask),
            gen.prompt_len,
            grow(gen.completion_mask),
            gen.prefix_tree().expand(members),
        )

    def prefix_tree(self) -> PrefixTree:
        """Each member's tree of its rows (next_token_tree of (P, N, L): P trees), built once."""
        if self.tree is None:
            self.tree = next_token_tree(self.ids, self.key_mask)
        return self.tree

    def select(self, indices: list[torch.Tensor]) -> list[Rows]:
        """For each index (P, n), member p's rows index[p] (RolloutBatch.select of each member:
        PPO's minibatches) -> one Rows each, their trees built as one where every n is the same."""
        picked = [
            (take(self.ids, i), take(self.key_mask, i), take(self.completion_mask, i))
            for i in indices
        ]
        if len({i.shape for i in indices}) == 1:
            trees = next_token_tree(
                torch.stack([ids for ids, _, _ in picked]),
                torch.stack([key_mask for _, key_mask, _ in picked]),
            ).unbind()
        else:
            trees = [None] * len(picked)  # each built on first use
        return [
            Rows(ids, key_mask, self.prompt_len, completion, tree)
            for (ids, key_mask, completion), tree in zip(picked, trees)
        ]

    def logprobs(self, stack: Stack, temperature: float = 1.0, states: bool = False) -> tuple:
        """lm/logprobs.generation_logprobs of the members' rows, each through its own weights -> (P,
        N, T) log-probs, (P, N, T, V) logits (states: and (P, N, T, C) final hidden states)."""
        return generation_logprobs(stack, self, temperature, True, states)


@dataclass
class Rollouts:
    """One step's rollouts of P members (rl/rollout.RolloutBatch, (P, ...) before each shape)."""

    rows: Rows  # (P, N, ...) every member's completions
    rewards: torch.Tensor  # (P, N)
    # (P, N, T) π_ref's log-probs, or None where the update needs none
    ref_logp: torch.Tensor | None
    ref_logits: torch.Tensor | None  # (P, N, T, V)
    # (P, N, T) π_old's, or None (the first update's own forward gives them)
    old_logp: torch.Tensor | None
    # each member's RolloutBatch (its prompts, its generation)
    batches: list = field(default_factory=list)
    # each member's rl/loop.Run (its generators, models, task)
    runs: list = field(default_factory=list)
    algos: list = field(default_factory=list)  # each member's algorithm object (PPO's: its β)

    @property
    def gen(self) -> Rows:  # as a single run's RolloutBatch names its rows
        return self.rows

    @property
    def mask(self) -> torch.Tensor:  # (P, N, T)
        return self.rows.completion_mask

    def minibatches(self, indices: list[torch.Tensor]) -> list[Rollouts]:
        """RolloutBatch.minibatches of each member (Rows.select)."""
        rows = self.rows.select(indices)
        tensors = (self.rewards, self.ref_logp, self.ref_logits, self.old_logp)
        return [
            Rollouts(r, *(take(x, i) for x in tensors), self.batches, self.runs, self.algos)
            for i, r in zip(indices, rows)
        ]

    def members(
        self, at: list[int], index: torch.Tensor, ref: bool = True, old: bool = True
    ) -> Rollouts:
        """Members `at`'s rollouts (index: `at` on the rows' device), π_ref's (ref) and π_old's
        (old) log-probs where given."""
        take = lambda x, keep=True: x.index_select(0, index) if x is not None and keep else None
        r = self.rows
        return Rollouts(
            Rows(take(r.ids), take(r.key_mask), r.prompt_len, take(r.completion_mask)),
            take(self.rewards),
            take(self.ref_logp, ref),
            take(self.ref_logits, ref),
            take(self.old_logp, old),
            [self.batches[p] for p in at],
            [self.runs[p] for p in at],
            [self.algos[p] for p in at],
        )
