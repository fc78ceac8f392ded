"""The rows of P members as one (P, N, ...) batch: each member's sampled completions (or one shared
set of rows, the anchor's), padded to one shape, and their log-probs under each member's own weights
in one forward.

    rows = Rows.of([gen_0, gen_1, ...])            # each member's Generation (lm/sampling.py), N
                                                   # rows each
    rows = Rows.shared(anchor.gen, P)              # the same rows for every member
    subs = rows.select([index, ...])               # index (P, n): each member's own rows (PPO's
                                                   # minibatches)
    mine = rollouts.members(at, index)             # some members' step (Rollouts: a lockstep
                                                   # update's input)
    logp, logits = rows.logprobs(stack, temperature)   # (P, N, T), (P, N, T, V):
                                                       # lm/logprobs.generation_logprobs

Layout: prompts left-padded to the widest member's prompt, completions right-padded to the longest
completion, so completion token j of every row sits in slot prompt_len + j. Padding is never
attended to and never counted (the completion mask is False there). The forward runs over prefix
trees (lm/prefix_tree.py), each distinct prefix once: each member's own rows through the tree its
single run builds of them (all members' built as one, each a segment, padded to one shape: Trees);
rows every member shares (the anchor's) through their one tree. So a member's log-probs are its
single run's, to float rounding. Rows picked out of them (`select`: PPO's minibatches) get trees of
their own, as a single run's minibatch does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minigrpo.lm.logprobs import completion_token_logprobs
from minigrpo.lm.prefix_tree import GROUP_SIZE, PrefixTree, build_prefix_tree
from minigrpo.lm.sampling import Generation
from minigrpo.lm.tokenizer import PAD_ID
from minigrpo.population.stacked import Stack


@dataclass
class Rows:
    ids: torch.Tensor  # (P, N, W + T) long
    key_mask: torch.Tensor  # (P, N, W + T) bool: real prompt and completion tokens
    prompt_len: int  # W
    completion_mask: torch.Tensor  # (P, N, T) bool
    # the members' prefix trees of the next-token forward; None: the plain forward
    tree: "Trees | None" = None

    @classmethod
    def of(cls, gens: list[Generation]) -> "Rows":
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
        return cls(ids, key_mask, W, key_mask[:, :, W:], Trees.build(ids, key_mask))

    @classmethod
    def shared(cls, gen: Generation, members: int) -> "Rows":
        """The same rows for every member (expanded, not copied), computed once per distinct prefix
        as the single run computes them (each member's weights over the one prefix tree)."""
        grow = lambda x: x[None].expand(members, *x.shape)
        return cls(
            grow(gen.ids),
            grow(gen.key_mask),
            gen.prompt_len,
            grow(gen.completion_mask),
            Trees.shared(gen.prefix_tree(), members),
        )

    def select(self, indices: list[torch.Tensor]) -> list["Rows"]:
        """For each index (P, n) of `indices`, member p's rows index[p] in that order
        (RolloutBatch.select of each member: PPO's minibatches) -> one Rows each. Their trees are
        built as one where every n is the same: each (index, member) a segment, so each minibatch's
        are its single run's (a few calls a step, not a few each)."""
        pick = lambda x, i: x.gather(1, i.view(*i.shape, 1).expand(-1, -1, x.size(2)))
        picked = [
            (pick(self.ids, i), pick(self.key_mask, i), pick(self.completion_mask, i))
            for i in indices
        ]
        if len({i.shape for i in indices}) == 1:
            trees = Trees.build(
                torch.cat([ids for ids, _, _ in picked]),
                torch.cat([key_mask for _, key_mask, _ in picked]),
            ).split(len(indices))
        else:
            trees = [Trees.build(ids, key_mask) for ids, key_mask, _ in picked]
        return [
            Rows(ids, key_mask, self.prompt_len, completion, tree)
            for (ids, key_mask, completion), tree in zip(picked, trees)
        ]

    def states(self, stack: Stack) -> torch.Tensor:
        """The final hidden states (P, N, L − 1, C) at every input slot of the next-token forward,
        each member through its own weights (its nodes through its tree, gathered into its rows)."""
        if self.tree is None:
            return stack.states(self.ids[..., :-1], self.key_mask[..., :-1])
        t = self.tree
        return t.gather(stack.hidden(t.tokens, t.pos, t.mask))

    def logprobs(self, stack: Stack, temperature: float = 1.0, states: bool = False) -> tuple:
        """-> log-probs (P, N, T) of the completion tokens (0 where masked) and the logits (P, N, T,
        V) that gave them, each member through its own weights; differentiable (no_grad for π_old
        and π_ref). states: also the final hidden states they came from (P, N, T, C) (a value head's
        input)."""
        h = self.states(stack)
        logits = stack.head(h)
        # x / 1 is x: one pass fewer
        out = self.logprobs_of(logits if temperature == 1.0 else logits / temperature)
        return (*out, h[:, :, self.prompt_len - 1 :]) if states else out

    def logprobs_of(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward's logits over every slot (P, N, L − 1, V) -> the completion tokens' log-probs
        and logits."""
        P, N, L = self.ids.shape
        logp = completion_token_logprobs(
            logits.reshape(P * N, L - 1, -1),
            self.ids.reshape(P * N, L),
            self.prompt_len,
            self.completion_mask.reshape(P * N, -1),
        )
        return logp.view(P, N, -1), logits[:, :, self.prompt_len - 1 :]


@dataclass
class Rollouts:
    """One step's rollouts of P members, what a lockstep update reads (rl/rollout.RolloutBatch of
    each member)."""

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

    def members(
        self, at: list[int], index: torch.Tensor, ref: bool = True, old: bool = True
    ) -> "Rollouts":
        """Members `at`'s rollouts (index: `at` on the rows' device): their rows (without trees: for
        their masks, not for a forward), rewards, π_ref's log-probs and logits (ref) and π_old's
        (old) where given, and their runs' own objects."""
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


@dataclass
class Trees:
    """P members' prefix trees (lm/prefix_tree.PrefixTree) as one batch: member p's packed
    sequences, padded to G sequences of K slots (a padding slot attends to itself only, and no real
    node to it)."""

    tokens: torch.Tensor  # (P, G, K) long
    pos: torch.Tensor  # (P, G, K) long
    mask: torch.Tensor  # (P * G, 1, K, K) bool
    index: torch.Tensor  # (P, N, L − 1) long: the flat slot (g·K + k) of each row's slot's node

    @classmethod
    def build(
        cls, ids: torch.Tensor, key_mask: torch.Tensor, group_size: int = GROUP_SIZE
    ) -> "Trees":
        """The trees of the next-token forward over each member's rows ids, key_mask (P, N, L) (what
        lm/prefix_tree.next_token_tree builds of one member's), built as one: each member a segment,
        sharing no node with another."""
        P, N, L = ids.shape
        target = key_mask[..., :-1] & key_mask[..., 1:]  # an input slot whose next token is real
        t = build_prefix_tree(
            ids[..., :-1].reshape(P * N, L - 1),
            target.reshape(P * N, L - 1),
            group_size,
            torch.arange(P, device=ids.device).repeat_interleave(N),
        )
        S, K = t.tokens.shape  # S sequences, each one member's
        count = torch.bincount(t.segment, minlength=P)
        # within its member
        rank = torch.arange(S, device=ids.device) - (count.cumsum(0) - count)[t.segment]
        G = int(count.max())
        tokens = torch.full((P, G, K), PAD_ID, dtype=torch.long, device=ids.device)
        pos = torch.zeros((P, G, K), dtype=torch.long, device=ids.device)
        mask = torch.eye(K, dtype=torch.bool, device=ids.device).repeat(P, G, 1, 1)
        tokens[t.segment, rank], pos[t.segment, rank], mask[t.segment, rank] = (
            t.tokens,
            t.pos,
            t.mask[:, 0],
        )
        # a padding slot: some node of its member's
        index = (rank[t.index // K] * K + t.index % K).view(P, N, L - 1)
        return cls(tokens, pos, mask.view(P * G, 1, K, K), index)

    @classmethod
    def shared(cls, tree: PrefixTree, members: int) -> "Trees":
        """One tree, every member's (expanded, not copied)."""
        grow = lambda x: x[None].expand(members, *x.shape)
        G, _, K, _ = tree.mask.shape
        return cls(
            grow(tree.tokens),
            grow(tree.pos),
            grow(tree.mask).reshape(members * G, 1, K, K),
            grow(tree.index),
        )

    def split(self, parts: int) -> list["Trees"]:
        """The trees of `parts` equal runs of segments (the first dim, in order) -> each run's as a
        Trees."""
        return [
            Trees(*x)
            for x in zip(*(t.chunk(parts) for t in (self.tokens, self.pos, self.mask, self.index)))
        ]

    def gather(self, nodes: torch.Tensor) -> torch.Tensor:
        """Per-node values (P, G, K, D) -> each row's (P, N, L − 1, D) (PrefixTree.gather of each
        member)."""
        P, N, L = self.index.shape
        flat = nodes.flatten(1, 2)
        return flat.gather(1, self.index.view(P, N * L, 1).expand(-1, -1, flat.size(-1))).view(
            P, N, L, -1
        )
