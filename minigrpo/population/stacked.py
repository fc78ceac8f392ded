"""P GPTs of one shape as one computation: their weights stacked (P, ...), each Linear a batched
matmul, the attention of every member's rows in one call (P folded into the batch).

    stack = Stack(models)                                   # stacks the weights once
                                                            # (differentiable)
    h = stack.hidden(idx, pos, attn_mask)                   # idx, pos (P, B, T) -> final hidden
                                                            # states (P, B, T, C)
    h = stack.hidden(ids, pos, attn_mask, cache)            # through a KV cache of P*B rows (the
                                                            # sampler's)
    logits = stack.head(h)                                  # (P, B, T, V), each member through its
                                                            # own tied head
    weights = Stack(models, trainable=True)                 # the stacked weights as leaves: a
                                                            # lockstep population's
    weights.copy_to(models)                                 # parameters (lockstep.py), copied back
                                                            # where a member's own GPT computes
                                                            # (population/evaluation.py)

It computes what `models[p].hidden(idx[p], pos[p], attn_mask=attn_mask[p])` computes (lm/model.py,
the readable path and the oracle of tests/test_population.py), to float rounding. `torch.stack`
keeps the gradient: a loss on member p's slice reaches member p's own parameters, so every member
keeps its own weights and optimiser (the run folders of a population are those of single runs:
model.pt is one member's GPT).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from minigrpo.lm.model import GPT, KVCache, attention, causal_mask, positions


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x (P, R, in), w (P, out, in), b (P, out) or None -> x @ wᵀ + b of each member, (P, R,
    out)."""
    return (
        torch.bmm(x, w.transpose(1, 2))
        if b is None
        else torch.baddbmm(b[:, None, :], x, w.transpose(1, 2))
    )


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dim with each member's own scale and shift: x (P, R, C), w, b (P,
    C)."""
    return torch.addcmul(b[:, None, :], F.layer_norm(x, x.shape[-1:], eps=eps), w[:, None, :])


class Stack:
    """The weights of `models` (GPTs of one config) stacked along a new first dim, in the models'
    order. trainable=False: a differentiable stack of the models' own parameters (their gradients
    reach them); trainable=True: a copy whose stacked tensors are leaves of their own
    (`parameters()`, one optimiser for all)."""

    def __init__(self, models: list[GPT], trainable: bool = False):
        self.cfg = models[0].cfg
        self.eps = models[0].ln_f.eps
        named = [dict(m.named_parameters()) for m in models]
        self.w = {name: torch.stack([n[name] for n in named]) for name in named[0]}
        if trainable:
            self.w = {name: w.detach().requires_grad_() for name, w in self.w.items()}

    def parameters(self) -> list[torch.Tensor]:
        return list(self.w.values())

    def rows(self, members: list[int]) -> "Stack":
        """The stack of the given members only (a copy, not differentiable back to this one's
        leaves)."""
        out = copy.copy(self)
        index = torch.tensor(members, device=self.w["wte.weight"].device)
        out.w = {name: w.detach().index_select(0, index) for name, w in self.w.items()}
        return out

    def copy_to(self, models: list[GPT], rows: list[int] | None = None) -> None:
        """Write member rows[i]'s weights into models[i] (rows: every member, in order), into its
        own tensors."""
        self.copy_into([dict(m.named_parameters()) for m in models], rows)

    @torch.no_grad()
    def copy_into(self, params: list[dict], rows: list[int] | None = None) -> None:
        """Write member rows[i]'s weight `name` into params[i][name] (rows: every member, in order),
        in one call."""
        names, rows = list(self.w), range(len(params)) if rows is None else rows
        each = {name: self.w[name].detach().unbind(0) for name in names}
        torch._foreach_copy_(
            [own[name] for own in params for name in names],
            [each[name][p] for p in rows for name in names],
        )

    def states(self, ids: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """The final hidden states of left-padded rows, the plain forward (GPT.hidden with a key
        mask, member by member): ids, key_mask (P, B, L) -> (P, B, L, C)."""
        P, B, L = ids.shape
        km = key_mask.reshape(P * B, L)
        return self.hidden(ids, positions(km).view(P, B, L), causal_mask(0, L, km, ids.device))

    def hidden(
        self,
        idx: torch.Tensor,
        pos: torch.Tensor,
        attn_mask: torch.Tensor,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """idx, pos (P, B, T) long; attn_mask (P*B, 1, T, T_keys) bool, True = may attend (T_keys =
        L + T with a cache holding L keys, whose rows are the P*B rows member by member) -> (P, B,
        T, C)."""
        w, (P, B, T), H = self.w, idx.shape, self.cfg.n_head
        C = self.cfg.n_embd
        members = torch.arange(P, device=idx.device)[:, None, None]
        x = (w["wte.weight"][members, idx] + w["wpe.weight"][members, pos]).view(P, B * T, C)
        for i in range(self.cfg.n_layer):
            p = f"blocks.{i}."
            h = _layer_norm(x, w[p + "ln1.weight"], w[p + "ln1.bias"], self.eps)
            qkv = linear(h, w[p + "attn.qkv.weight"], w[p + "attn.qkv.bias"])  # (P, B*T, 3C)
            q, k, v = qkv.view(P * B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)  # 3 x (P*B, H, T, D)
            y = attention(q, k, v, attn_mask, cache, i).transpose(1, 2).reshape(P, B * T, C)
            x = x + linear(y, w[p + "attn.proj.weight"], w[p + "attn.proj.bias"])
            h = _layer_norm(x, w[p + "ln2.weight"], w[p + "ln2.bias"], self.eps)
            h = F.gelu(linear(h, w[p + "mlp.0.weight"], w[p + "mlp.0.bias"]))
            x = x + linear(h, w[p + "mlp.2.weight"], w[p + "mlp.2.bias"])
        if cache is not None:
            cache.length += T
        return _layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], self.eps).view(P, B, T, C)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """(P, B, T, C) -> logits (P, B, T, V) through each member's tied output head."""
        P, B, T, C = h.shape
        return linear(h.view(P, B * T, C), self.w["wte.weight"]).view(P, B, T, -1)

    def new_cache(self, rows: int, t_max: int) -> KVCache:
        w = self.w["wte.weight"]
        return KVCache(self.cfg, rows, t_max, w.device, w.dtype)
