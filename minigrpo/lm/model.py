"""A small decoder-only transformer (GPT), written from scratch, with an optional KV cache.

    logits = model(idx)                      # idx (B, T) -> logits (B, T, V)

Pre-norm blocks: x + attn(ln(x)), then x + mlp(ln(x)). Learned token and position embeddings; the
output head shares its weights with the token embedding (as GPT-2 and nanoGPT).

Padding and positions. Rows of a batch may be left-padded (prompts of different lengths). Two
optional tensors describe that:
  key_mask (B, T_total) bool  True where a position holds a real token (T_total counts cached keys
                              too)
  pos      (B, T) long        the position id of each new token; `positions(key_mask)` numbers the
           real
                              tokens of each row 0, 1, 2, ... so a padded row computes exactly what
                              the same row without padding would.
Without them every row is full and positions are 0..T-1 (after the cached ones).

KV cache. `model.new_cache(B, T_max)` preallocates keys and values for every layer; a forward with
`cache=` appends the new tokens' keys/values and attends over everything cached so far. Careful:
`F.scaled_dot_product_attention(is_causal=True)` aligns its causal mask to the TOP-LEFT corner,
which is wrong when the T new queries sit after L cached keys, so every cached step builds its own
mask with query i allowed keys j <= L + i.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 32
    block_size: int = 48  # longest sequence, BOS and EOS included
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64

    def check_length(self, n: int) -> None:
        """ValueError unless a sequence of n tokens fits the learned positions (block_size)."""
        if n > self.block_size:
            raise ValueError(f"sequence of {n} tokens exceeds block_size {self.block_size}")


class KVCache:
    """Keys and values of every layer: k, v of shape (n_layer, B, H, T_max, D); `length` filled so
    far."""

    def __init__(self, cfg: GPTConfig, batch: int, t_max: int, device, dtype):
        shape = (cfg.n_layer, batch, cfg.n_head, t_max, cfg.n_embd // cfg.n_head)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0


def positions(key_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool -> (B, T) long: 0, 1, 2, ... over the real tokens of each row (padding gets
    0)."""
    return (key_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def causal_mask(
    offset: int, T: int, key_mask: torch.Tensor | None = None, device=None
) -> torch.Tensor | None:
    """The attention mask of T new tokens after `offset` cached ones: bool (B or 1, 1, T, offset+T),
    True = may attend; None where attention() needs none (no padding, and either nothing cached or a
    single new query). Query i (absolute position offset+i) may see key j iff j <= offset+i and key
    j is real (key_mask (B, ≥ offset+T)); it always sees itself, so a padding query never has an
    empty row (which would give NaN)."""
    if key_mask is None and (offset == 0 or T == 1):
        return None
    # one query (a decoding step): every key before it is causal, so it sees the real keys and
    # itself
    if T == 1:
        mask = key_mask[:, : offset + 1].clone()
        mask[:, offset] = True
        return mask[:, None, None]  # (B, 1, 1, offset+1)
    q_abs = torch.arange(offset, offset + T, device=device)[:, None]  # (T, 1)
    k_abs = torch.arange(offset + T, device=device)[None, :]  # (1, T_keys)
    causal = k_abs <= q_abs  # (T, T_keys)
    if key_mask is None:
        return causal[None, None]  # (1, 1, T, T_keys)
    # (B, 1, T, T_keys), over heads
    return ((causal & key_mask[:, None, : offset + T]) | (k_abs == q_abs))[:, None]


def attention(
    q, k, v, attn_mask=None, cache: KVCache | None = None, layer: int = 0
) -> torch.Tensor:
    """Causal scaled dot-product attention of T new queries, over the cached keys too:
    softmax(QKᵀ/√D)·V.

    q, k, v: (B, H, T, D) for the T new tokens. attn_mask: None, or bool (B or 1, 1, T, T_keys),
    True = may attend. cache: None, or a KVCache whose layer `layer` holds L = cache.length earlier
    keys/values: k, v are first written into slots [L, L+T) and the queries then attend over all L+T
    keys (T_keys = L+T). Do not advance cache.length: GPT.hidden does, once every layer has written.
    Without attn_mask: plain causal attention (query i sees keys 0..i) when there is no cache; with
    a cache, GPT.hidden passes a mask whenever T > 1, and a single query (T = 1) sees every key.
    -> (B, H, T, D). (Vaswani et al. 2017, 1706.03762 eq. 1; the cache: GPT-2 inference.)
    """
    if cache is not None:
        L, T = cache.length, q.size(2)
        cache.k[layer, :, :, L : L + T] = k
        cache.v[layer, :, :, L : L + T] = v
        k = cache.k[layer, :, :, : L + T]  # (B, H, L+T, D)
        v = cache.v[layer, :, :, : L + T]
    if q.size(2) == 1 and q.is_cuda:  # a decoding step on a GPU: see one_query_attention
        return one_query_attention(q, k, v, attn_mask)
    # plain causal attention over a full (uncached) sequence, or one cached query
    if attn_mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=q.size(2) > 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


def one_query_attention(q, k, v, attn_mask=None) -> torch.Tensor:
    """attention() of one query per row and head, written out: softmax(qKᵀ/√D)·V. q (B, H, 1, D); k,
    v (B, H, T_keys, D); attn_mask None or bool (B or 1, 1, 1, T_keys) -> (B, H, 1, D). A GPU's
    fused attention kernels work on tiles of 64 queries, so a decoding step (one query) leaves 63/64
    of each tile idle; these three matrix operations read each key and value once. Equal to
    F.scaled_dot_product_attention's to float rounding (tests/test_model.py)."""
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))  # (B, H, 1, T_keys)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return scores.softmax(-1) @ v


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0, "n_embd must be divisible by n_head"
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x, attn_mask=None, cache: KVCache | None = None, layer: int = 0):
        B, T, C = x.shape
        H, D = self.n_head, C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        v = v.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        y = attention(q, k, v, attn_mask, cache, layer)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, H, T, D) -> (B, T, C)
        return self.proj(y)


def in_out_order(w: torch.Tensor) -> torch.Tensor:
    """The same (out, in) matrix, laid out in memory as its transpose (in, out): w.t() is then
    contiguous.

    Why: a decoding step multiplies a few rows by every weight, and for so few rows MKL's sgemm runs
    x @ W with W contiguous (in, out) faster than nn.Linear's x @ Wᵀ over W (out, in)
    (docs/performance.md). With this layout the sampler (decode.py) uses w.t() as it is, with no
    copy per generate() call. The values and shapes are nn.Linear's, state_dicts and checkpoints are
    the same, copy_, deepcopy and .to() keep the order, and autograd gives each gradient the
    parameter's order. Only the last bit can change: sgemm picks its kernel by layout and size, so
    some products round differently (pretraining came out bit-identical, RL runs did not)."""
    return w.t().contiguous().t()


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        )

    def forward(self, x, attn_mask=None, cache=None, layer=0):
        x = x + self.attn(self.ln1(x), attn_mask, cache, layer)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale the residual projections by depth
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))
        # each Linear's W (out, in) lies in memory as Wᵀ (in, out): see in_out_order
        for m in self.modules():
            if isinstance(m, nn.Linear):
                m.weight = nn.Parameter(in_out_order(m.weight.detach()))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch: int, t_max: int) -> KVCache:
        w = self.wte.weight
        return KVCache(self.cfg, batch, t_max, w.device, w.dtype)

    def inputs(self, idx, pos=None, key_mask=None, cache: KVCache | None = None, attn_mask=None):
        """hidden's arguments checked, with their defaults -> (pos (B, T), attn_mask: (B, 1, T, T)
        bool, or None where plain causal attention is meant)."""
        B, T = idx.shape
        offset = cache.length if cache is not None else 0
        if attn_mask is not None and pos is None:
            raise ValueError("attn_mask needs pos: the position id of each token (a tree's depths)")
        # a tree's positions: depths
        self.cfg.check_length(offset + T if attn_mask is None else int(pos.max()) + 1)
        if pos is None:
            pos = torch.arange(offset, offset + T, device=idx.device).expand(B, T)
        if attn_mask is not None and (key_mask is not None or cache is not None):
            raise ValueError("attn_mask replaces key_mask and the cache: pass one or the other")
        return pos, causal_mask(offset, T, key_mask, idx.device) if attn_mask is None else attn_mask

    def hidden(self, idx, pos=None, key_mask=None, cache: KVCache | None = None, attn_mask=None):
        """Final hidden states (B, T, C): everything but the output head. attn_mask: a ready bool
        mask (B, 1, T, T), True = may attend (prefix_tree.py's tree attention), instead of key_mask
        and the cache."""
        pos, attn_mask = self.inputs(idx, pos, key_mask, cache, attn_mask)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for layer, block in enumerate(self.blocks):
            x = block(x, attn_mask, cache, layer)
        if cache is not None:
            cache.length += idx.size(1)
        return self.ln_f(x)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, T, C) -> logits (B, T, V) through the tied output head."""
        return self.linear(h, self.wte.weight)

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x @ weightᵀ + bias on this model's states (its output head; a critic's value head):
        F.linear here, one batched product over the members in a population
        (population/member.py)."""
        return F.linear(x, weight, bias)

    def forward(self, idx, pos=None, key_mask=None, cache: KVCache | None = None):
        """idx (B, T) -> logits (B, T, V). See the module docstring for pos, key_mask and cache."""
        return self.head(self.hidden(idx, pos, key_mask, cache))
