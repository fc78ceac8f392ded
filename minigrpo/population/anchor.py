"""The preservation anchor's loss (rl/preserve.py) for P members at once: every member's KL to π_ref
on all of its anchor's rows (the tree anchor: the same rows for every member of one --person), in
one forward over their trees.

    anchor = MembersAnchor(cfg)                 # None where preservation is off
    term = anchor.term(stack, ref, anchors)     # (P,) --preserve-coef × each member's anchor loss
                                                # (differentiable); anchors: each member's
                                                # rl/preserve.Anchor
    rows, (w, g) = own_rows(gens, [ws, gs])     # members' rows of their own, padded to one count
                                                # (the probes')
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minigrpo.lm.sampling import Generation
from minigrpo.population.rows import Rows
from minigrpo.population.stacked import Stack
from minigrpo.rl.preserve import Anchor, weighted_kl


def own_rows(
    gens: list[Generation], per_row: list[list[torch.Tensor]]
) -> tuple[Rows, list[torch.Tensor]]:
    """Each member's own rows (gens[p], M_p of them) as one Rows, member p's padded to the most rows
    by repeating its last row (no node its prefix tree lacks) -> the Rows, and each list of per_row
    (member p's (M_p, ...) tensors) stacked (P, M, ...), its padding rows 0 (False), a second dim of
    completion positions padded to the Rows'."""
    M = max(len(g.ids) for g in gens)
    rows = Rows.of(
        [
            g.select(
                torch.tensor(
                    [*range(len(g.ids)), *[len(g.ids) - 1] * (M - len(g.ids))], device=g.ids.device
                )
            )
            for g in gens
        ]
    )
    T, out = rows.completion_mask.size(-1), []
    for tensors in per_row:
        # completion positions
        padded = [F.pad(x, (0, T - x.size(1))) if x.dim() > 1 else x for x in tensors]
        out.append(
            torch.stack([torch.cat([x, x.new_zeros(M - len(x), *x.shape[1:])]) for x in padded])
        )
    return rows, out


class MembersAnchor:
    def __init__(self, cfg):
        self.cfg, self.anchors, self.rows, self.where, self.weights, self.ref_logits = (
            cfg,
            None,
            None,
            None,
            None,
            None,
        )

    def term(self, stack: Stack, ref: Stack, anchors: list[Anchor]) -> torch.Tensor:
        """--preserve-coef × each member's anchor loss, against π_ref's logits on the anchor
        computed once by the forward the members' own go through (the anchor's own, of the tree
        forward, differ by rounding, and where π_θ = π_ref a gradient of rounding noise is what
        Adam's first step would amplify). One anchor for all (one --person): its rows, shared; else
        each member's own rows (own_rows)."""
        # members came or left
        if self.anchors is None or [id(a) for a in anchors] != [id(a) for a in self.anchors]:
            self.anchors = anchors
            where = lambda a: a.gen.completion_mask if a.kl_mask is None else a.kl_mask
            if all(a is anchors[0] for a in anchors):
                self.rows, self.where, self.weights = (
                    Rows.shared(anchors[0].gen, len(anchors)),
                    where(anchors[0]),
                    anchors[0].weights,
                )
            else:
                self.rows, (self.where, self.weights) = own_rows(
                    [a.gen for a in anchors],
                    [[where(a) for a in anchors], [a.weights for a in anchors]],
                )
            with torch.no_grad():
                self.ref_logits = self.rows.logprobs(ref)[1]
        return self.cfg.preserve_coef * weighted_kl(
            self.rows.logprobs(stack)[1],
            self.ref_logits,
            self.where,
            self.weights,
            self.cfg.preserve_kl,
        )
