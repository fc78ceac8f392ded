"""The sampler's forward through the KV cache: a prompt's prefill, then one new token per row per
step.

    step = Decoder(weights)                      # once per generate(): one model's or P models'
                                                 # stacked weights (model.Weights)
    logits = step(ids, pos, cache, key_mask)     # ids, pos (..., B, T) -> logits (..., B, V) of
                                                 # each row's next token

It computes what `model(ids, pos, key_mask, cache)[:, -1]` computes (GPT.forward, the oracle
tests/test_decode.py compares it with, to float rounding), through the same model.Weights.hidden.
At this size a decoding step is ~80 tiny operations whose cost is per-operation overhead, not
arithmetic (about 0.2 MFLOP per token). What it saves: no module calls nor argument checks per
step, the final LayerNorm and the head on each row's last position only, and the head as x @ Wᵀ
with Wᵀ copied once contiguous (C, V), which MKL's sgemm runs faster for a few rows
(model.in_out_order). Only sampling uses it (docs/performance.md).
"""

from __future__ import annotations

import torch

from minigrpo.lm.model import KVCache, Weights, causal_mask


class Decoder:
    """Weights and a copy of the tied head's transpose ((C, V), stacked (P, C, V): small). Use it
    while the weights stay as they were: generate() builds one per call."""

    def __init__(self, weights: Weights):
        self.cfg, self.weights = weights.cfg, weights
        self.head_t = weights.w["wte.weight"].transpose(-1, -2).contiguous()

    def __call__(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ids, pos (..., B, T) long: the T new tokens of each row (a prompt's prefill, or one
        sampled token) and their position ids ((P, B, T) over stacked weights); key_mask None (every
        key real) or (R, ≥ L+T) bool over the R rows' L cached keys and new ones. -> logits (..., B,
        V) of the token after each row's last new one; cache.length advances by T. Without a key
        mask every slot holds a real token, so L + T must fit the block; with one, positions are
        the caller's (sampling keeps them in the block)."""
        L, T = cache.length, ids.size(-1)
        if key_mask is None:
            self.cfg.check_length(L + T)
        mask = causal_mask(L, T, key_mask, ids.device)  # None for one new token without padding
        return self.weights.hidden(ids, pos, mask, cache, last=True) @ self.head_t
