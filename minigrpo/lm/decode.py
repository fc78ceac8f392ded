"""The sampler's forward through the KV cache, fast: a prompt's prefill, then one new token per row
per step.

    step = Decoder(model)                        # once per generate(): the weights, laid out for
                                                 # decoding
    logits = step(ids, pos, cache, key_mask)     # ids, pos (B, T) -> logits (B, V) of each row's
                                                 # next token

It computes what `model(ids, pos, key_mask, cache)[:, -1]` computes (GPT.forward, the readable path
and the oracle tests/test_decode.py compares it with, to float rounding) for the calls sampling
makes. At this size a decoding step is ~80 tiny operations and its cost is per-operation overhead,
not arithmetic (about 0.2 MFLOP per token). Two things buy the speed:

  1. x @ W with W contiguous (in, out). nn.Linear computes x @ Wᵀ with W stored (out, in); for the
  few rows of a
     decoding step MKL's sgemm runs that transposed product slower. GPT stores every Linear weight
     in (in, out) memory order (model.in_out_order), so w.t() is that matrix as it is.
  2. One flat loop over the layers: no module calls, no attention mask for a single new token
     without padding.
The attention itself, cache writes included, is model.py's `attention`, the same function the
modules call.

Only sampling uses it (its speed against GPT.forward: docs/performance.md); training and every other
forward run GPT.forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minigrpo.lm.model import GPT, KVCache, attention, causal_mask


class Decoder:
    """The model's weights, laid out for one-token steps (see the module docstring): views of a
    GPT's own tensors, plus a copy of the tied head's transpose (V x C, small), and of any Linear
    weight not in (in, out) order. Use it while the weights stay as they were: generate() builds one
    per call."""

    def __init__(self, model: GPT):
        self.cfg = c = model.cfg
        self.n_head, self.head_dim = c.n_head, c.n_embd // c.n_head
        # F.layer_norm's arguments after x
        ln = lambda m: (m.normalized_shape, m.weight, m.bias, m.eps)
        # (bias, W (in, out)) for torch.addmm: GPT's own
        t = lambda lin: (lin.bias, lin.weight.t().contiguous())
        # weights are stored that way (model.in_out_order), so .contiguous() copies only a model
        # built otherwise
        self.layers = [
            (ln(b.ln1), t(b.attn.qkv), t(b.attn.proj), ln(b.ln2), t(b.mlp[0]), t(b.mlp[2]))
            for b in model.blocks
        ]
        self.wte, self.wpe, self.ln_f = model.wte.weight, model.wpe.weight, ln(model.ln_f)
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
        (B, T), L, H, D = ids.shape, cache.length, self.n_head, self.head_dim
        self.cfg.check_length(L + T)
        mask = causal_mask(L, T, key_mask, ids.device)  # None for one new token without padding
        x = (F.embedding(ids, self.wte) + F.embedding(pos, self.wpe)).view(B * T, -1)  # (B*T, C)
        for i, (ln1, qkv, proj, ln2, fc, out) in enumerate(self.layers):
            h = F.layer_norm(x, *ln1)
            # 3 x (B, H, T, D)
            q, k, v = torch.addmm(qkv[0], h, qkv[1]).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
            # model.py's: writes k, v into the cache, attends over L+T keys
            y = attention(q, k, v, mask, cache, i)
            y = y.transpose(1, 2).reshape(B * T, H * D)  # a view when T = 1
            x = x + torch.addmm(proj[0], y, proj[1])
            h = F.layer_norm(x, *ln2)
            x = x + torch.addmm(out[0], F.gelu(torch.addmm(fc[0], h, fc[1])), out[1])
        cache.length = L + T
        return F.layer_norm(x.view(B, T, -1)[:, -1], *self.ln_f) @ self.head_t
