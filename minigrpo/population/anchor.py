"""The preservation anchor's loss (rl/preserve.py) for P members at once: every member's KL to π_ref
on all of its anchor's rows (the tree anchor: the same rows for every member of one --person), in
one forward over their trees.

    anchor = MembersAnchor(cfg)                 # None where preservation is off
    term = anchor.term(stack, ref, anchors)     # (P,) --preserve-coef × each member's anchor loss
                                                # (differentiable); anchors: each member's
                                                # rl/preserve.Anchor
    rows, (w, g) = own_rows(gens, [ws, gs])     # the members' rows: one --person's shared, else
                                                # each its own, padded to one count (the probes')
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
    """Each member's rows (gens[p], M_p of them) as one Rows -> the Rows, and each list of per_row
    (member p's (M_p, ...) tensors) as one tensor. One Generation for all (one --person's anchor):
    its rows shared (Rows.shared), each list's first tensor. Else member p's rows padded to the most
    rows by repeating its last row (no node its prefix tree lacks), the tensors stacked (P, M, ...),
    their padding rows 0 (False), a second dim of completion positions padded to the Rows'."""
    if all(g is gens[0] for g in gens):
        return Rows.shared(gens[0], len(gens)), [tensors[0] for tensors in per_row]
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
        self.cfg, self.anchors = cfg, None

    def term(self, stack: Stack, ref: Stack, anchors: list[Anchor]) -> torch.Tensor:
        """--preserve-coef × each member's anchor loss (rl/preserve.weighted_kl over the members'
        rows, own_rows), against π_ref's logits on the anchor computed once by the forward the
        members' own go through (the anchor's own, of the tree forward, differ by rounding, and
        where π_θ = π_ref a gradient of rounding noise is what Adam's first step would amplify)."""
        if self.anchors is None or list(map(id, anchors)) != list(map(id, self.anchors)):
            self.anchors = anchors  # at the start, and when members left
            self.rows, (self.where, self.weights) = own_rows(
                [a.gen for a in anchors], [[a.where for a in anchors], [a.weights for a in anchors]]
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
