"""The rows of P members as one (P, N, ...) batch: each member's sampled completions (or one shared set of rows, the
anchor's), padded to one shape, and their log-probs under each member's own weights in one forward.

    rows = Rows.of([gen_0, gen_1, ...])            # each member's Generation (lm/sampling.py), N rows each
    rows = Rows.shared(anchor.gen, P)              # the same rows for every member
    sub = rows.select(index)                       # index (P, n): each member's own rows (PPO's minibatches)
    logp, logits = rows.logprobs(stack, temperature)   # (P, N, T), (P, N, T, V): lm/logprobs.generation_logprobs

Layout: prompts left-padded to the widest member's prompt, completions right-padded to the longest completion, so
completion token j of every row sits in slot prompt_len + j. Padding is never attended to and never counted (the
completion mask is False there), so a member's log-probs are its single run's, to float rounding (the single run
shares its rows' common prefixes (lm/prefix_tree.py); here a member's own rows compute every slot, the tests' oracle
path, and rows every member shares (the anchor's) go through their one prefix tree).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minigrpo.lm.logprobs import completion_token_logprobs
from minigrpo.lm.prefix_tree import PrefixTree
from minigrpo.lm.sampling import Generation
from minigrpo.lm.tokenizer import PAD_ID
from minigrpo.population.stacked import Stack


@dataclass
class Rows:
    ids: torch.Tensor  # (P, N, W + T) long
    key_mask: torch.Tensor  # (P, N, W + T) bool: real prompt and completion tokens
    prompt_len: int  # W
    completion_mask: torch.Tensor  # (P, N, T) bool
    tree: PrefixTree | None = None  # rows shared by every member: their prefix tree (lm/prefix_tree.py), once

    @classmethod
    def of(cls, gens: list[Generation]) -> "Rows":
        """Each member's rows (every member the same number N)."""
        W, T = max(g.prompt_len for g in gens), max(g.completion_mask.size(1) for g in gens)
        P, N, device = len(gens), gens[0].ids.size(0), gens[0].ids.device
        ids = torch.full((P, N, W + T), PAD_ID, dtype=torch.long, device=device)
        key_mask = torch.zeros((P, N, W + T), dtype=torch.bool, device=device)
        for p, g in enumerate(gens):
            w, t = g.prompt_len, g.completion_mask.size(1)
            ids[p, :, W - w:W + t], key_mask[p, :, W - w:W + t] = g.ids, g.key_mask
        return cls(ids, key_mask, W, key_mask[:, :, W:])

    @classmethod
    def shared(cls, gen: Generation, members: int) -> "Rows":
        """The same rows for every member (expanded, not copied), computed once per distinct prefix as the single
        run computes them (each member's weights over the one prefix tree)."""
        grow = lambda x: x[None].expand(members, *x.shape)  # noqa: E731
        return cls(grow(gen.ids), grow(gen.key_mask), gen.prompt_len, grow(gen.completion_mask), gen.prefix_tree())

    def select(self, index: torch.Tensor) -> "Rows":
        """Member p's rows index[p] (P, n), in that order (RolloutBatch.select of each member)."""
        pick = lambda x: x.gather(1, index.view(*index.shape, 1).expand(-1, -1, x.size(2)))  # noqa: E731
        return Rows(pick(self.ids), pick(self.key_mask), self.prompt_len, pick(self.completion_mask))

    def logprobs(self, stack: Stack, temperature: float = 1.0, states: bool = False) -> tuple:
        """-> log-probs (P, N, T) of the completion tokens (0 where masked) and the logits (P, N, T, V) that gave
        them, each member through its own weights; differentiable (no_grad for π_old and π_ref). states: also the
        final hidden states they came from (P, N, T, C) (a value head's input; not for shared rows)."""
        P, N, L = self.ids.shape
        if self.tree is None:
            h = stack.states(self.ids[..., :-1], self.key_mask[..., :-1])  # (P, N, L - 1, C)
            logits = stack.head(h) / temperature
            if states:
                return *self.logprobs_of(logits), h[:, :, self.prompt_len - 1:]
        else:  # every member's nodes (P, G, K), gathered into each member's rows
            t, grow = self.tree, lambda x: x[None].expand(P, *x.shape)  # noqa: E731
            G, K = t.tokens.shape
            h = stack.hidden(grow(t.tokens), grow(t.pos), grow(t.mask).reshape(P * G, 1, K, K))
            logits = (stack.head(h) / temperature).flatten(1, 2)[:, t.index]
        return self.logprobs_of(logits)

    def logprobs_of(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward's logits over every slot (P, N, L − 1, V) -> the completion tokens' log-probs and logits."""
        P, N, L = self.ids.shape
        logp = completion_token_logprobs(logits.reshape(P * N, L - 1, -1), self.ids.reshape(P * N, L),
                                         self.prompt_len, self.completion_mask.reshape(P * N, -1))
        return logp.view(P, N, -1), logits[:, :, self.prompt_len - 1:]


@dataclass
class Rollouts:
    """One step's rollouts of P members, what a lockstep update reads (rl/rollout.RolloutBatch of each member)."""
    rows: Rows  # (P, N, ...) every member's completions
    rewards: torch.Tensor  # (P, N)
    ref_logp: torch.Tensor | None  # (P, N, T) π_ref's log-probs, or None where the update needs none
    ref_logits: torch.Tensor | None  # (P, N, T, V)
    old_logp: torch.Tensor | None  # (P, N, T) π_old's, or None (the first update's own forward gives them)
    batches: list = field(default_factory=list)  # each member's RolloutBatch (its prompts, its generation)
    runs: list = field(default_factory=list)  # each member's rl/loop.Run (its generators, models, task)
    algos: list = field(default_factory=list)  # each member's algorithm object (PPO's: its β)
