"""P GPTs of one shape as one computation: their weights stacked (P, ...), computed by lm/model's
one forward (Weights.hidden: each Linear a batched matmul, the attention of every member's rows in
one call).

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
                                                            # into the members' own GPTs
                                                            # (population/evaluation.py)

It computes what `models[p].hidden(idx[p], pos[p], attn_mask=attn_mask[p])` computes, to float
rounding (tests/test_population.py). `torch.stack` keeps the gradient: a loss on member p's slice
reaches member p's own parameters, so every member keeps its own weights and optimiser (the run
folders of a population are those of single runs: model.pt is one member's GPT).
"""

from __future__ import annotations

import copy

import torch

from minigrpo.lm.model import GPT, Weights


def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.stack of tensors of one shape and one memory layout -> (P, ...), each slice laid out as
    they are (a GPT's Linear weights lie transposed: lm/model.in_out_order). Why: the CPU's kernels
    pick their order by layout, so a slice in its model's layout computes its matmuls and its
    gradient's norm (lm/optim.clip_grad_norm, per slice) as its model alone does, to the bit; a
    gradient takes its leaf's layout. Differentiable."""
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
    """The weights of `models` (GPTs of one config) stacked along a new first dim, in the models'
    order, each slice in its model's memory layout (`stacked`). trainable=False: a differentiable
    stack of the models' own parameters (their gradients reach them); trainable=True: a copy whose
    stacked tensors are leaves of their own (`parameters()`, one optimiser for all)."""

    def __init__(self, models: list[GPT], trainable: bool = False):
        named = [dict(m.named_parameters()) for m in models]
        w = {name: stacked([n[name] for n in named]) for name in named[0]}
        if trainable:
            w = {name: t.detach().requires_grad_() for name, t in w.items()}
        super().__init__(models[0].cfg, w)

    def parameters(self) -> list[torch.Tensor]:
        return list(self.w.values())

    def rows(self, members: list[int]) -> "Stack":
        """The stack of the given members only (a copy, not differentiable back to this one's
        leaves)."""
        out = copy.copy(self)
        index = torch.tensor(members, device=self.w["wte.weight"].device)
        out.w = {name: select(w.detach(), index) for name, w in self.w.items()}
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
