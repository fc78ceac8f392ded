"""A small decoder-only transformer (GPT), written from scratch, with an optional KV cache.

    logits = model(idx)                      # idx (B, T) -> logits (B, T, V)

Pre-norm blocks: x + attn(ln(x)), then x + mlp(ln(x)). Learned token and position embeddings; the
output head shares its weights with the token embedding (as GPT-2 and nanoGPT).

One forward. GPT holds the parameters (its modules, their names, their init); the computation is
written once, `Weights.hidden`, over one model's weights or P models' stacked (P, ...), each
computing its own rows in one pass; GPT.forward and decode.Decoder call it.
Written out rather than torch.func.vmap(functional_call): the KV cache is written in place, which
vmap does not map.

Padding and positions. Rows of a batch may be left-padded (prompts of different lengths). Two
optional tensors describe that:
  key_mask (B, T_total) bool  True where a position holds a real token (T_total counts cached keys
                              too)
  pos      (B, T) long        the position id of each new token; `positions(key_mask)` numbers the
                              real tokens of each row 0, 1, 2, ... so a padded row computes exactly
                              what the same row without padding would.
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
    """Keys and values of every layer: k, v (n_layer, B, H, T_max, D), filled up to `length`."""

    def __init__(self, cfg: GPTConfig, batch: int, t_max: int, device, dtype):
        shape = (cfg.n_layer, batch, cfg.n_head, t_max, cfg.n_embd // cfg.n_head)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0


def positions(key_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool -> (B, T) long: 0, 1, 2, ... over each row's real tokens (padding: 0)."""
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
    q, k, v, attn_mask=None, cache: KVCache | None = None, layer: int = 0, lengths=None
) -> torch.Tensor:
    """Causal scaled dot-product attention of T new queries, over the cached keys too:
    softmax(QKᵀ/√D)·V.

    q, k, v: (B, H, T, D) for the T new tokens. attn_mask: None, or bool (B or 1, 1, T, T_keys),
    True = may attend. cache: None, or a KVCache whose layer `layer` holds L = cache.length earlier
    keys/values: k, v are first written into slots [L, L+T) and the queries then attend over all L+T
    keys (T_keys = L+T). Do not advance cache.length: Weights.hidden does, once every layer has
    written. Without attn_mask: plain causal attention, a single query seeing every key
    (causal_mask returns None only where that is right). lengths: None, or (stacked weights, no
    cache) each model's own length: own_lengths.
    -> (B, H, T, D). (Vaswani et al. 2017, 1706.03762 eq. 1; the cache: GPT-2 inference.)
    """
    if lengths is not None and min(lengths) < q.size(2):
        return own_lengths(q, k, v, attn_mask, lengths)
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


def own_lengths(q, k, v, attn_mask, lengths: list[int]) -> torch.Tensor:
    """attention() of P models' rows, each over its own length: q, k, v (P·G, H, T, D), model p's G
    rows first; attn_mask None or bool (P·G, 1, T, T); lengths (P,) ints ≤ T. Model p's queries and
    keys are cut to their first lengths[p] slots, one call per distinct length; the slots past a
    model's length (padding that nobody reads) get 0. -> (P·G, H, T, D).

    Why: the CPU's fused attention (flash) kernel splits the queries into blocks whose size depends
    on their count, and a block of another size rounds otherwise, so rows padded to the widest
    model's length do not compute what the same rows of that model compute alone (to the bit);
    each model over its own length does."""
    P, T = len(lengths), q.size(2)
    parts, order = [], []
    for n in sorted(set(lengths)):
        at = [p for p, m in enumerate(lengths) if m == n]
        index = torch.tensor(at, device=q.device)
        mine = lambda x: x.unflatten(0, (P, -1))[index]  # (models, G, ...)
        cut = lambda x: mine(x)[..., :n, :].flatten(0, 1)  # (models·G, H, n, D)
        mask = None if attn_mask is None else mine(attn_mask)[..., :n, :n].flatten(0, 1)
        y = attention(cut(q), cut(k), cut(v), mask)
        parts.append(F.pad(y, (0, 0, 0, T - n)).unflatten(0, (len(at), -1)))
        order += at
    back = torch.tensor(order, device=q.device).argsort()
    return torch.cat(parts)[back].flatten(0, 1)


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


def in_out_order(w: torch.Tensor) -> torch.Tensor:
    """The same (out, in) matrix, laid out in memory as its transpose (in, out): w.t() is then
    contiguous.

    Why: a decoding step multiplies a few rows by every weight, and for so few rows MKL's sgemm runs
    x @ W with W contiguous (in, out) faster than nn.Linear's x @ Wᵀ over W (out, in)
    (docs/performance.md). The values and shapes are nn.Linear's, state_dicts and checkpoints are
    the same, copy_, deepcopy and .to() keep the order, and autograd gives each gradient the
    parameter's order. Only the last bit can change: sgemm picks its kernel by layout and size."""
    return w.t().contiguous().t()


EPS = 1e-5  # every LayerNorm's ε (nn.LayerNorm's default)
# a block's parts, each a (weight, bias) pair: names under blocks.{i}. (Block)
PARTS = ("ln1", "attn.qkv", "attn.proj", "ln2", "mlp.0", "mlp.2")


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ wᵀ + b. One model: w (out, in), b (out,) or None, x (..., in) (F.linear). Stacked: w (P,
    out, in), b (P, out) or None, x (P, ..., in), each model's rows through its own weights (one
    batched matmul). -> (..., out)."""
    if w.dim() == 2:
        return F.linear(x, w, b)
    rows, wt = x.reshape(x.size(0), -1, x.size(-1)), w.transpose(1, 2)  # (P, R, in), (P, in, out)
    y = torch.bmm(rows, wt) if b is None else torch.baddbmm(b[:, None, :], rows, wt)
    return y.view(*x.shape[:-1], -1)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """LayerNorm over the last dim (Ba et al. 2016, 1607.06450): (x − mean) / √(var + ε) · w + b, w,
    b (C,); or stacked, w, b (P, C) and x (P, ..., C), each model its own scale and shift."""
    if w.dim() == 1:
        return F.layer_norm(x, w.shape, w, b, EPS)
    if not x.is_cuda:
        return StackedLayerNorm.apply(x, w, b)
    shape = (w.size(0),) + (1,) * (x.dim() - 2) + (-1,)
    return torch.addcmul(b.view(shape), F.layer_norm(x, x.shape[-1:], eps=EPS), w.view(shape))


class StackedLayerNorm(torch.autograd.Function):
    """layer_norm of stacked weights on the CPU: x (P, ..., C), w, b (P, C). The forward is the
    stacked one (normalise, then b + x̂·w: the same numbers as F.layer_norm's fused kernel); the
    backward is F.layer_norm's own (aten.native_layer_norm_backward with w[p], b[p]), model by
    model. Why: that kernel computes the input's gradient as (rstd·dy)·w, a chain rule through the
    stacked forward as rstd·(dy·w), which rounds otherwise; model p's gradients are then those of
    its run alone to the bit. A GPU takes the stacked autograd (one launch, not P)."""

    @staticmethod
    def forward(ctx, x, w, b):
        x_hat, mean, rstd = torch.native_layer_norm(x, x.shape[-1:], None, None, EPS)
        ctx.save_for_backward(x, w, b, mean, rstd)
        shape = (w.size(0),) + (1,) * (x.dim() - 2) + (-1,)
        return torch.addcmul(b.view(shape), x_hat, w.view(shape))

    @staticmethod
    def backward(ctx, dy):
        x, w, b, mean, rstd = ctx.saved_tensors
        need = list(ctx.needs_input_grad)
        each = [
            torch.ops.aten.native_layer_norm_backward(
                dy[p], x[p], x.shape[-1:], mean[p], rstd[p], w[p], b[p], need
            )
            for p in range(w.size(0))
        ]
        return tuple(torch.stack(g) if want else None for g, want in zip(zip(*each), need))


def embedding(idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Rows w[idx] of a table w (V, C); stacked, w (P, V, C) and idx (P, ...), each model's own."""
    if w.dim() == 2:
        return F.embedding(idx, w)
    return w[torch.arange(w.size(0), device=idx.device).view(-1, *[1] * (idx.dim() - 1)), idx]


class Weights:
    """A GPT's weights as plain tensors by parameter name (GPT.named_parameters()): one model's, or
    P models' of one config stacked along a new first dim (every tensor (P, ...); the rows then
    carry that dim too). What the forward computes with."""

    def __init__(self, cfg: GPTConfig, w: dict[str, torch.Tensor]):
        self.cfg, self.w = cfg, w

    def hidden(
        self,
        idx: torch.Tensor,
        pos: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        last: bool = False,
        lengths: list[int] | None = None,
    ) -> torch.Tensor:
        """The forward up to the head: final hidden states (B, T, C), stacked (P, B, T, C); last:
        only each row's last position, (B, C) or (P, B, C).

        idx, pos (B, T) long, stacked (P, B, T): tokens and their position ids. attn_mask, cache,
        lengths: attention()'s, over the R = B (stacked: P*B, member by member) rows; the cache's
        length advances by T."""
        w, (B, T), lead = self.w, idx.shape[-2:], idx.shape[:-2]
        C, H, R = self.cfg.n_embd, self.cfg.n_head, math.prod(idx.shape[:-1])
        x = (embedding(idx, w["wte.weight"]) + embedding(pos, w["wpe.weight"])).view(
            *lead, B * T, C
        )
        for i in range(self.cfg.n_layer):
            # (weight, bias) of each part of block i
            ln1, qkv, proj, ln2, fc, out = (
                (w[f"blocks.{i}.{m}.weight"], w[f"blocks.{i}.{m}.bias"]) for m in PARTS
            )
            h = layer_norm(x, *ln1)
            # 3 x (R, H, T, D)
            q, k, v = linear(h, *qkv).view(R, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
            y = attention(q, k, v, attn_mask, cache, i, lengths)
            y = y.transpose(1, 2).reshape(*lead, B * T, C)
            x = x + linear(y, *proj)
            x = x + linear(F.gelu(linear(layer_norm(x, *ln2), *fc)), *out)
        if cache is not None:
            cache.length += T
        x = x.view(*lead, B, T, C)
        return layer_norm(x[..., -1, :] if last else x, w["ln_f.weight"], w["ln_f.bias"])

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden states (..., C) -> logits (..., V) through the tied head (the token embedding)."""
        return linear(h, self.w["wte.weight"])

    def new_cache(self, rows: int, t_max: int) -> KVCache:
        w = self.w["wte.weight"]
        return KVCache(self.cfg, rows, t_max, w.device, w.dtype)


class Block(nn.Module):
    """One block's parameters, by the names Weights.hidden reads (PARTS)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0, "n_embd must be divisible by n_head"
        C = cfg.n_embd
        self.ln1 = nn.LayerNorm(C, eps=EPS)
        self.attn = nn.ModuleDict({"qkv": nn.Linear(C, 3 * C), "proj": nn.Linear(C, C)})
        self.ln2 = nn.LayerNorm(C, eps=EPS)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))


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
        return self.weights().new_cache(batch, t_max)

    def weights(self) -> Weights:
        """This model's parameters as Weights (its own tensors: differentiable)."""
        return Weights(self.cfg, dict(self.named_parameters()))

    def hidden(self, idx, pos=None, key_mask=None, cache: KVCache | None = None, attn_mask=None):
        """Final hidden states (B, T, C): everything but the output head (Weights.hidden), its
        arguments checked. attn_mask: a ready bool mask (B, 1, T, T), True = may attend
        (prefix_tree.py's tree attention, with pos its depths), instead of key_mask and the
        cache."""
        (B, T), offset = idx.shape, cache.length if cache is not None else 0
        if attn_mask is not None and pos is None:
            raise ValueError("attn_mask needs pos: the position id of each token (a tree's depths)")
        self.cfg.check_length(offset + T if attn_mask is None else int(pos.max()) + 1)
        if pos is None:
            pos = torch.arange(offset, offset + T, device=idx.device).expand(B, T)
        if attn_mask is None:
            attn_mask = causal_mask(offset, T, key_mask, idx.device)
        elif key_mask is not None or cache is not None:
            raise ValueError("attn_mask replaces key_mask and the cache: pass one or the other")
        return self.weights().hidden(idx, pos, attn_mask, cache)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, T, C) -> logits (B, T, V) through the tied output head."""
        return F.linear(h, self.wte.weight)

    def forward(self, idx, pos=None, key_mask=None, cache: KVCache | None = None):
        """idx (B, T) -> logits (B, T, V). See the module docstring for pos, key_mask and cache."""
        return self.head(self.hidden(idx, pos, key_mask, cache))
