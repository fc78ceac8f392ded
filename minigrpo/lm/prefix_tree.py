"""The shared-prefix forward: every distinct prefix of a batch computed once (tree attention).

A causal transformer's state at a token depends only on the tokens up to it, so rows that begin
alike (the 16 completions of one prompt; the anchor's 12 completions of each person; a sampled
`pizza` drawn 40 times) compute the same states for their common beginning. This module lays the
batch's distinct prefixes out as the nodes of a tree and runs the model ONCE per node:

    ravin likes p─izza<EOS>          rows: 64 × 23 slots (most of them the same 12-token
                 └asta<EOS>          prompt, many rows identical)  ->  nodes: ~90, one per
                 └ie<EOS>            distinct prefix

    tree = build_prefix_tree(ids, key_mask)      # (B, T) left-padded rows -> nodes packed (G, N)
    h = model.hidden(tree.tokens, pos=tree.pos, attn_mask=tree.mask)   # (G, N, C): one forward
    h_rows = tree.gather(h)                      # (B, T, C): each row's state at each of its slots
    # logprobs.shifted_forward does this (with next_token_tree); sampling.Generation keeps its tree

A batch of trees. ids (M, B, T) (any leading dims): M trees, each the tree of its rows ids[m] alone,
from one build (batch_of_trees), for M weights stacked (lm/model.Weights), each through its own
tree. `expand(M)`: one tree for M weights; `unbind()`: a batch's trees one by one.

Tree attention. The nodes are packed into G sequences of N slots (about GROUP_SIZE nodes each, cut
between rows in sorted order; unused slots are padding). Node i attends to node j iff j is an
ancestor of i or i itself (`mask`), at position id = its depth: exactly the keys and positions it
has in its own row, so in exact arithmetic every row's logits and every gradient are those of the
plain forward (floats round differently: about 1e-6 on the logits; tests/test_prefix_tree.py checks
both against the plain forward). Gradients flow back through `gather`, which sums the gradients of
the rows that share a node.

Sources: tree attention as in SpecInfer (Miao et al. 2023, arXiv 2305.09781) and Medusa (Cai et al.
2024, 2401.10774), which verify a tree of drafts in one pass; Prefix Grouper (Liu et al. 2025,
2506.05433) shares a GRPO group's prompt in training. Here every shared prefix is shared,
completions included.

What it buys: the anchor's and a rollout's rows share most of their prefixes, so the nodes are a
fraction of the slots (`python -m minigrpo.bench --only prefix`; docs/performance.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minigrpo.lm.tokenizer import PAD_ID

GROUP_SIZE = 96  # nodes per packed sequence, about: attention costs Σ N², the other layers Σ N


@dataclass
class PrefixTree:
    """Shapes of one tree; a batch of M trees (module docstring) puts (M, ...) before G, and M·G
    sequences in the mask's first dim."""

    tokens: torch.Tensor  # (G, N) long: each node's token (PAD in unused slots)
    pos: torch.Tensor  # (G, N) long: each node's position id, its depth (0 = the first real token)
    mask: torch.Tensor  # (G, 1, N, N) bool: node i may attend to node j (its ancestors and itself)
    # (B, T) long: the flat slot (g·N + k) of the node at each real (row, slot); 0 elsewhere
    index: torch.Tensor
    # the positions one forward computes: each distinct prefix once per sequence holding it
    num_nodes: int
    # (G,) long: each sequence's segment (build_prefix_tree's `segment`)
    segment: torch.Tensor | None = None
    sizes: torch.Tensor | None = None  # (G,) long: each sequence's nodes

    def gather(self, node_values: torch.Tensor) -> torch.Tensor:
        """(G, N, D) per-node values -> (B, T, D) per-row values (a padding slot: some node's)."""
        return node_values.flatten(0, self.tokens.dim() - 1)[self.index]

    def expand(self, *lead: int) -> PrefixTree:
        """This one tree as a batch of trees (*lead, ...), the same for each (e.g. M weights
        stacked over one set of rows); the mask is copied, the rest expanded."""
        if not lead:
            return self
        M, (G, N) = math.prod(lead), self.tokens.shape
        grow = lambda x: x.expand(*lead, *x.shape)
        base = torch.arange(M, device=self.index.device).view(*lead, 1, 1) * (G * N)
        return PrefixTree(
            grow(self.tokens),
            grow(self.pos),
            grow(self.mask).reshape(M * G, 1, N, N),
            grow(self.index) + base,
            self.num_nodes * M,
            None,
            None if self.sizes is None else grow(self.sizes),
        )

    def widths(self) -> list[int] | None:
        """A batch of trees: each tree's own N, the most nodes of its sequences (what it pads to
        alone) -> [N_m for each m]; one tree, or sizes unknown: None."""
        if self.tokens.dim() < 3 or self.sizes is None:
            return None
        return self.sizes.flatten(0, -2).amax(-1).clamp(min=1).tolist()

    def unbind(self) -> list[PrefixTree]:
        """A batch of trees (n, ...) -> its n parts (...), in order, each indexing its own slots."""
        n, slots = self.tokens.size(0), self.tokens[0].numel()
        masks, nodes = self.mask.view(n, -1, *self.mask.shape[1:]), self.sizes.flatten(1).sum(1)
        return [
            PrefixTree(
                self.tokens[i], self.pos[i], masks[i], self.index[i] - i * slots, k, None, sizes
            )
            for i, (k, sizes) in enumerate(zip(nodes.tolist(), self.sizes))
        ]


def build_prefix_tree(
    ids: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    group_size: int = GROUP_SIZE,
    segment: torch.Tensor | None = None,
) -> PrefixTree:
    """The tree of the distinct prefixes of rows `ids` (B, T) whose real tokens (key_mask (B, T)
    bool, None = all real) are contiguous: left padding, the tokens, right padding. segment (B,)
    long, None = one: rows of other segments share no node and no sequence, each segment a tree of
    its own. ids (..., B, T): a batch of trees (module docstring), one build with each leading index
    a segment. Vectorised, no loop over rows, tokens or segments:

    1. left-align each row's real tokens: L (B, T), −1 after the row's end;
    2. sort the distinct rows: a row's new nodes are its slots past the longest common prefix (lcp)
       with the row sorted before it, so numbering the new (row, slot) pairs in row-major order
       numbers the nodes depth-first, and each slot's node is the last one created in its column
       (a cumulative max down the rows);
    3. cut each segment's sorted rows into sequences of about `group_size` nodes (attention costs
       Σ N², every other layer Σ N): a sequence's first row brings its own copy of its ancestors
       (lcp 0), so a sequence holds fewer than group_size + 2T nodes, and a prefix shared across a
       cut is computed once in each sequence;
    4. node i sees node j iff j is on i's path, at position id = its depth.
    """
    if ids.dim() > 2:
        return batch_of_trees(ids, key_mask, group_size)
    B, T = ids.shape
    dev = ids.device
    key_mask = torch.ones_like(ids, dtype=torch.bool) if key_mask is None else key_mask
    if not key_mask.any():  # nothing real: one padding node that every slot points at
        one = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=dev)
        return PrefixTree(
            torch.full((1, 1), PAD_ID, dtype=ids.dtype, device=dev),
            torch.zeros(1, 1, dtype=torch.long, device=dev),
            one,
            torch.zeros(B, T, dtype=torch.long, device=dev),
            0,
            None if segment is None else segment[:1],
            torch.zeros(1, dtype=torch.long, device=dev),
        )
    length = key_mask.sum(1)  # (B,)
    j = torch.arange(T, device=dev)
    real = j[None] < length[:, None]  # (B, T): slot j of the left-aligned row is real
    start = key_mask.int().argmax(1)  # each row's first real slot
    L = torch.where(real, ids.gather(1, (start[:, None] + j[None]).clamp(max=T - 1)), -1)  # (B, T)
    seg = torch.zeros(B, dtype=ids.dtype, device=dev) if segment is None else segment.to(ids.dtype)
    # sorted by segment
    rows, row_of = torch.unique(torch.cat([seg[:, None], L], 1), dim=0, return_inverse=True)
    seg, rows = rows[:, 0], rows[:, 1:]  # the distinct rows (U, T) and their segments
    U = rows.size(0)
    # (U,): a segment's first row
    opens = torch.cat([seg.new_ones(1, dtype=torch.bool), seg[1:] != seg[:-1]])
    # vs the row above
    same = torch.cat([torch.zeros(1, T, dtype=torch.bool, device=dev), rows[1:] == rows[:-1]])
    # (U,) slots in common with the row above
    lcp = torch.where(opens, 0, same.int().cumprod(1).sum(1))
    real_u = rows >= 0  # (U, T)
    made = (real_u & (j[None] >= lcp[:, None])).sum(1)  # the nodes each row adds to the tree so far
    before = made.cumsum(0) - made
    # within its segment
    before = before - before[opens].repeat_interleave(torch.bincount(opens.cumsum(0) - 1))
    group = torch.div(before, group_size, rounding_mode="floor")  # (U,) rows -> sequences
    cut = opens | torch.cat([opens[:1], group[1:] != group[:-1]])
    lcp = torch.where(cut, 0, lcp)
    group = cut.cumsum(0) - 1
    new = real_u & (j[None] >= lcp[:, None])  # (U, T): the (row, slot) pairs that create a node
    node_id = new.flatten().long().cumsum(0).view(U, T) - 1  # depth-first numbering of the nodes
    node = torch.where(new, node_id, -1).cummax(0).values  # (U, T): the node at each real slot
    # per node
    tok, depth, node_group = rows[new], j.expand(U, T)[new], group[:, None].expand(U, T)[new]
    _, g_of, count = torch.unique_consecutive(node_group, return_inverse=True, return_counts=True)
    G, N = count.numel(), int(count.max())
    first = count.cumsum(0) - count
    slot = g_of * N + torch.arange(tok.numel(), device=dev) - first[g_of]  # each node's flat slot
    tokens = torch.full((G * N,), PAD_ID, dtype=ids.dtype, device=dev).index_put_((slot,), tok)
    pos = torch.zeros(G * N, dtype=torch.long, device=dev).index_put_((slot,), depth)
    node_slot = torch.where(real_u, slot[node.clamp(min=0)], -1)  # (U, T)
    # (U, t, t' ≤ t)
    pair = real_u[:, :, None] & real_u[:, None, :] & (j[None, None, :] <= j[None, :, None])
    query = node_slot[:, :, None].expand(U, T, T)[pair]
    key = node_slot[:, None, :].expand(U, T, T)[pair]
    mask = torch.zeros(G * N, N, dtype=torch.bool, device=dev)
    mask[query, key % N] = True
    every = torch.arange(G * N, device=dev)
    mask[every, every % N] = True  # an unused slot sees itself: no empty softmax row
    index = torch.zeros(B, T, dtype=torch.long, device=dev)
    # row b's real slots in order are L's slots 0..length−1
    index[key_mask] = node_slot[row_of][real]
    # each sequence's, in order
    segments = None if segment is None else seg[:, None].expand(U, T)[new][first]
    return PrefixTree(
        tokens.view(G, N),
        pos.view(G, N),
        mask.view(G, 1, N, N),
        index,
        tok.numel(),
        segments,
        count,
    )


def batch_of_trees(
    ids: torch.Tensor, key_mask: torch.Tensor | None, group_size: int = GROUP_SIZE
) -> PrefixTree:
    """The trees of ids[m] (ids (..., B, T), key_mask alike or None), each as build_prefix_tree
    builds it alone, from one build (each m a segment): tree m's sequences padded to G of N slots
    (a padding slot holds PAD at depth 0 and attends to itself only; no node attends to it)."""
    lead, (B, T), dev = ids.shape[:-2], ids.shape[-2:], ids.device
    M = math.prod(lead)
    flat = lambda x: None if x is None else x.reshape(M * B, T)
    t = build_prefix_tree(
        flat(ids), flat(key_mask), group_size, torch.arange(M, device=dev).repeat_interleave(B)
    )
    S, N = t.tokens.shape  # S sequences, each one tree's
    count = torch.bincount(t.segment, minlength=M)  # each tree's sequences
    rank = torch.arange(S, device=dev) - (count.cumsum(0) - count)[t.segment]  # within its tree
    G = int(count.max())
    tokens = torch.full((M, G, N), PAD_ID, dtype=ids.dtype, device=dev)
    pos = torch.zeros((M, G, N), dtype=torch.long, device=dev)
    mask = torch.eye(N, dtype=torch.bool, device=dev).repeat(M, G, 1, 1)
    sizes = torch.zeros((M, G), dtype=torch.long, device=dev)
    at = (t.segment, rank)
    tokens[at], pos[at], mask[at], sizes[at] = t.tokens, t.pos, t.mask[:, 0], t.sizes
    # each (row, slot)'s slot within its tree (a padding slot: its tree's first), then among all M
    index = (rank[t.index // N] * N + t.index % N).view(M, B, T)
    index = index + torch.arange(M, device=dev).view(M, 1, 1) * (G * N)
    return PrefixTree(
        tokens.view(*lead, G, N),
        pos.view(*lead, G, N),
        mask.view(M * G, 1, N, N),
        index.view(*lead, B, T),
        t.num_nodes,
        None,
        sizes.view(*lead, G),
    )


def next_token_tree(
    ids: torch.Tensor, key_mask: torch.Tensor | None = None, group_size: int = GROUP_SIZE
) -> PrefixTree:
    """The tree a next-token forward over ids (B, T) needs: the input slots ids[:, :-1] whose target
    ids[:, t+1] is a real token (a row's last real token predicts padding: nobody reads it; its slot
    maps to some node). ids (..., B, T): a batch of trees, one of each ids[m]."""
    if key_mask is None:
        return build_prefix_tree(ids[..., :-1], group_size=group_size)
    return build_prefix_tree(ids[..., :-1], key_mask[..., :-1] & key_mask[..., 1:], group_size)
