"""The preservation anchor's loss (rl/preserve.py) for P members at once: every member's KL to π_ref on all of the
anchor's rows (the tree anchor: the same rows for every member), in one forward over their one prefix tree.

    anchor = MembersAnchor(cfg, run.anchor)     # None where preservation is off
    term = anchor.term(stack, ref)              # (P,) --preserve-coef × each member's anchor loss (differentiable)
"""

from __future__ import annotations

import torch

from minigrpo.population.rows import Rows
from minigrpo.population.stacked import Stack
from minigrpo.rl.preserve import Anchor, weighted_kl


def anchor_losses(stack: Stack, anchor: Anchor, rows: Rows, ref_logits: torch.Tensor,
                  direction: str = "forward") -> torch.Tensor:
    """rl/preserve.anchor_loss of every member on all of the anchor's rows (`rows`: Rows.shared(anchor.gen, P)),
    against π_ref's logits there (P, M, T, V) -> (P,)."""
    where = anchor.gen.completion_mask if anchor.kl_mask is None else anchor.kl_mask
    return weighted_kl(rows.logprobs(stack)[1], ref_logits, where, anchor.weights, direction)


class MembersAnchor:
    def __init__(self, cfg, anchor: Anchor):
        self.cfg, self.anchor, self.rows, self.ref_logits = cfg, anchor, None, None

    def term(self, stack: Stack, ref: Stack) -> torch.Tensor:
        """--preserve-coef × each member's anchor loss, against π_ref's logits on the anchor computed once by the
        forward the members' own go through (the anchor's own, of the tree forward, differ by rounding, and where
        π_θ = π_ref a gradient of rounding noise is what Adam's first step would amplify)."""
        P = stack.w["wte.weight"].size(0)
        if self.rows is None or self.rows.ids.size(0) != P:  # at the start, and after members left
            self.rows = Rows.shared(self.anchor.gen, P)
            with torch.no_grad():
                self.ref_logits = self.rows.logprobs(ref)[1]
        return self.cfg.preserve_coef * anchor_losses(stack, self.anchor, self.rows, self.ref_logits,
                                                      self.cfg.preserve_kl)
