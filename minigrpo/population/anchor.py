"""The preservation anchor's loss (rl/preserve.py) for P members at once, in one forward over their
anchors' rows (one --person's shared, else each member's own: own_rows).

    anchor = MembersAnchor(cfg)              # None where preservation is off
    term = anchor.term(stack, ref, anchors)  # (P,) --preserve-coef × each member's anchor loss
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
    """Each member's rows (gens[p], M_p of them) as one Rows, and each list of per_row (member p's
    (M_p, ...) tensors) as one tensor. One Generation for all: Rows.shared, each list's first.
    Else member p's rows padded to M rows by repeating its last row (no new prefix-tree node), the
    tensors stacked (P, M, ...) with zero padding, completion positions padded to the Rows'."""
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
        """--preserve-coef × rl/preserve.weighted_kl of each member (P,), against π_ref's logits on
        the anchor computed once by the members' own forward (not the anchor's: at π_θ = π_ref
        their rounding would be a gradient that Adam's first step amplifies)."""
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
