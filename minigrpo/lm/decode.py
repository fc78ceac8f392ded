"""The sampler's forward through the KV cache: a prompt's prefill, then one new token per row per
step.

    step = Decoder(model)                        # once per generate(): the weights, laid out for
                                                 # decoding
    logits = step(ids, pos, cache, key_mask)     # ids, pos (B, T) -> logits (B, V) of each row's
                                                 # next token

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

from minigrpo.lm.model import GPT, KVCache, causal_mask


class Decoder:
    """A GPT's weights (its own tensors) and a copy of the tied head's transpose (C x V, small). Use
    it while the weights stay as they were: generate() builds one per call."""

    def __init__(self, model: GPT):
        self.cfg, self.weights = model.cfg, model.weights()
        self.head_t = model.wte.weight.t().contiguous()  # (C, V): the tied output head

    def __call__(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ids, pos (B, T) long: the T new tokens of each row (a prompt's prefill, or one sampled
        token) and their position ids; key_mask None (every key real) or (B, ≥ L+T) bool over the L
        cached keys and the new ones. -> logits (B, V) of the token after each row's last new one;
        cache.length advances by T."""
        L, T = cache.length, ids.size(1)
        self.cfg.check_length(L + T)
        mask = causal_mask(L, T, key_mask, ids.device)  # None for one new token without padding
        return self.weights.hidden(ids, pos, mask, cache, last=True) @ self.head_t
