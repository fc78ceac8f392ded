"""The sampler's forward through the KV cache: a prompt's prefill, then one new token per row per
step.

    step = Decoder(model.weights())              # once per generate(): the weights, laid out for
                                                 # decoding (or P models' stacked: model.Weights)
    logits = step(ids, pos, cache, key_mask)     # ids, pos (B, T) -> logits (B, V) of each row's
                                                 # next token; stacked: (P, B, T) -> (P, B, V)

It computes what `model(ids, pos, key_mask, cache)[:, -1]` computes (GPT.forward, the oracle
tests/test_decode.py compares it with, to float rounding), through the same function
(model.Weights.hidden), for the calls sampling makes. At this size a decoding step is ~80 tiny
operations and its cost is per-operation overhead, not arithmetic (about 0.2 MFLOP per token). What
it saves: no module calls nor argument checks per step, the final LayerNorm and the head on each
row's last position only, and the head as x @ Wᵀ with Wᵀ copied once contiguous (C, V): for the few
rows of a decoding step MKL's sgemm runs that faster (the Linear weights already lie that way:
model.in_out_order).

Only sampling uses it (its speed against GPT.forward: docs/performance.md); training and every other
forward run GPT.forward.
"""

from __future__ import annotations

import torch

from minigrpo.lm.model import KVCache, Weights, causal_mask


class Decoder:
    """Weights (a GPT's own tensors, or P GPTs' stacked) and a copy of the tied head's transpose
    (C x V, small; stacked P x C x V). Use it while the weights stay as they were: generate() builds
    one per call."""

    def __init__(self, weights: Weights):
        self.cfg, self.weights = weights.cfg, weights
        # (C, V) or (P, C, V): the tied output head
        self.head_t = weights.w["wte.weight"].transpose(-1, -2).contiguous()

    def __call__(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ids, pos (B, T) long: the T new tokens of each row (a prompt's prefill, or one sampled
        token) and their position ids, (P, B, T) over stacked weights (or P = 1 over one model's);
        key_mask None (every key real) or (R, ≥ L+T) bool over the L cached keys and the new ones,
        R = B (P*B) rows. -> logits (B, V) ((P, B, V)) of the token after each row's last new one;
        cache.length advances by T. Without a key mask every slot holds a real token, so L + T must
        fit the block; with one, positions are the caller's (sampling keeps them in the block)."""
        L, T = cache.length, ids.size(-1)
        if key_mask is None:
            self.cfg.check_length(L + T)
        mask = causal_mask(L, T, key_mask, ids.device)  # None for one new token without padding
        if ids.dim() > self.head_t.dim():  # one model's weights, rows (1, B, T): P = 1 of a sampler
            return (self.weights.hidden(ids[0], pos[0], mask, cache, last=True) @ self.head_t)[None]
        return self.weights.hidden(ids, pos, mask, cache, last=True) @ self.head_t
