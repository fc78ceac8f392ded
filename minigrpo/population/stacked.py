"""P GPTs of one shape as one computation: their weights stacked (P, ...), computed by lm/model's
one forward (Weights: each Linear a batched matmul, every member's attention in one call).

    stack = Stack(models)                    # differentiable to the models' own parameters
    stack = Stack(models, trainable=True)    # leaves of their own: a lockstep population's
    h = stack.hidden(idx, pos, attn_mask)    # (P, B, T) -> (P, B, T, C)
    stack.copy_to(models)                    # each member's weights back into its own GPT

Member p computes what models[p] computes, to float rounding (tests/test_population.py).
"""

from __future__ import annotations

import copy

import torch

from minigrpo.lm.model import GPT, Weights


def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.stack of tensors of one shape and layout -> (P, ...), each slice laid out as they are
    (lm/model.in_out_order), so the CPU's kernels compute a slice's matmuls and gradient norm as its
    model alone does, to the bit. Differentiable."""
    first = tensors[0]
    order = sorted(range(first.dim()), key=lambda d: -first.stride(d))  # outermost dim first
    back = [0, *(1 + order.index(d) for d in range(first.dim()))]
    return torch.stack([t.permute(order) for t in tensors]).permute(back)


def select(w: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """w.index_select(0, index) with each slice laid out as w's are (a new tensor; see stacked)."""
    order = [0, *sorted(range(1, w.dim()), key=lambda d: -w.stride(d))]
    back = [order.index(d) for d in range(w.dim())]
    return w.permute(order).index_select(0, index).permute(back)


class Stack(Weights):
    """The weights of `models` (GPTs of one config) stacked along a new first dim (`stacked`)."""

    def __init__(self, models: list[GPT], trainable: bool = False):
        named = [dict(m.named_parameters()) for m in models]
        w = {name: stacked([n[name] for n in named]) for name in named[0]}
        if trainable:
            w = {name: t.detach().requires_grad_() for name, t in w.items()}
        super().__init__(models[0].cfg, w)

    def parameters(self) -> list[torch.Tensor]:
        return list(self.w.values())

    def rows(self, members: list[int]) -> "Stack":
        """The stack of the given members only (a detached copy)."""
        out = copy.copy(self)
        index = torch.tensor(members, device=self.w["wte.weight"].device)
        out.w = {name: select(w.detach(), index) for name, w in self.w.items()}
        return out

    def copy_to(self, models: list[GPT], rows: list[int] | None = None) -> None:
        """Member rows[i]'s weights into models[i]'s own tensors (rows None: every member)."""
        self.copy_into([dict(m.named_parameters()) for m in models], rows)

    @torch.no_grad()
    def copy_into(self, params: list[dict], rows: list[int] | None = None) -> None:
        """Member rows[i]'s weight `name` into params[i][name] (rows None: every member)."""
        names, rows = list(self.w), range(len(params)) if rows is None else rows
        each = {name: self.w[name].detach().unbind(0) for name in names}
        torch._foreach_copy_(
            [own[name] for own in params for name in names],
            [each[name][p] for p in rows for name in names],
        )
