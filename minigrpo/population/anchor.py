"""The preservation term of P members: rl/preserve.anchor_loss of one Anchor whose rows are each
member's own anchor's (own_rows: one --person's shared).

    anchor = MembersAnchor(cfg)              # None where preservation is off
    term = anchor.term(stack, ref, anchors)  # (P,) --preserve-coef × each member's anchor loss
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minigrpo.lm.draws import Generation
from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.population.rows import shared_rows, stacked_rows
from minigrpo.population.stacked import Stack
from minigrpo.rl.preserve import Anchor, anchor_loss


def own_rows(gens: list[Generation], per_row: list[list[torch.Tensor]]) -> tuple:
    """Member p's rows gens[p] (M_p of them) and, for each list of per_row, its (M_p, ...) tensor
    -> one (P, M, ...) Generation and tensors. One Generation for all: shared_rows and each list's
    first. Else each member's rows padded to M by repeating its last (no new prefix-tree node), its
    tensors with zeros, completion positions to the widest."""
    if all(g is gens[0] for g in gens):
        return shared_rows(gens[0], len(gens)), [tensors[0] for tensors in per_row]
    M = max(len(g.ids) for g in gens)
    last = lambda g: torch.tensor([*range(len(g.ids)), *[len(g.ids) - 1] * (M - len(g.ids))])
    rows = stacked_rows([g.select(last(g).to(g.ids.device)) for g in gens])
    T, out = rows.completion_mask.size(-1), []
    for tensors in per_row:
        padded = [F.pad(x, (0, T - x.size(1))) if x.dim() > 1 else x for x in tensors]
        out.append(
            torch.stack([torch.cat([x, x.new_zeros(M - len(x), *x.shape[1:])]) for x in padded])
        )
    return rows, out


class MembersAnchor:
    def __init__(self, cfg):
        self.cfg, self.anchors = cfg, None

    def term(self, stack: Stack, ref: Stack, anchors: list[Anchor]) -> torch.Tensor:
        """(P,) --preserve-coef × each member's anchor_loss, against π_ref's logits from the
        members' own forward (not the anchor's: at π_θ = π_ref their rounding would be a gradient
        that Adam's first step amplifies)."""
        if self.anchors is None or list(map(id, anchors)) != list(map(id, self.anchors)):
            self.anchors = anchors  # at the start, and when members left
            gen, (where, weights) = own_rows(
                [a.gen for a in anchors], [[a.where for a in anchors], [a.weights for a in anchors]]
            )
            with torch.no_grad():
                ref_logits = generation_logprobs(ref, gen, return_logits=True)[1]
            self.anchor = Anchor(gen, ref_logits, weights, None, where)
        return self.cfg.preserve_coef * anchor_loss(stack, self.anchor, None, self.cfg.preserve_kl)
