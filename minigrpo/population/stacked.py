"""P GPTs of one shape as one computation: their weights stacked (P, ...), computed by lm/model's
one forward (Weights: each Linear a batched matmul, every member's attention in one call).

    stack = Stack(models)                    # differentiable to the models' own parameters
    stack = Stack(models, trainable=True)    # leaves of their own: a lockstep population's
    h = stack.hidden(idx, pos, attn_mask)    # (P, B, T) -> (P, B, T, C)
    stack.copy_to(models)                    # each member's weights back into its own GPT
    keep([stack], opt, members)              # members leaving: the stacks and optimiser of the rest

Member p computes what models[p] computes, to float rounding (tests/test_population.py).
"""

from __future__ import annotations

import copy

import torch

from minigrpo.lm.model import GPT, Weights
from minigrpo.lm.optim import AdamW


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

    @torch.no_grad()
    def copy_to(self, models: list[GPT]) -> None:
        """Member p's weights into models[p]'s own tensors."""
        own = [dict(m.named_parameters()) for m in models]
        each = {name: w.detach().unbind(0) for name, w in self.w.items()}
        torch._foreach_copy_(
            [mine[name] for mine in own for name in self.w],
            [each[name][p] for p in range(len(models)) for name in self.w],
        )


@torch.no_grad()
def keep(stacks: list[Stack], opt: AdamW, members: list[int]) -> None:
    """Only `members` (in this order) from now on, in the stacks (the optimiser's parameters, in its
    order) and the optimiser's state."""
    index = torch.tensor(members, device=opt.params[0].device)
    opt.t = opt.t[members]
    lr = opt.param_groups[0]["lr"]
    if torch.is_tensor(lr):
        opt.param_groups[0]["lr"] = lr[members]
    for stack in stacks:
        stack.w = {name: select(w.detach(), index).requires_grad_() for name, w in stack.w.items()}
    opt.params = [w for stack in stacks for w in stack.parameters()]
    opt.m = [select(m, index) for m in opt.m]
    opt.v = [select(v, index) for v in opt.v]
