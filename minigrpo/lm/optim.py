"""AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019) and gradient-norm
clipping, written out.

Why not torch.optim.AdamW: constructing any torch.optim optimiser imports torch's compiler stack
(torch._dynamo), a large part of a short run's process (docs/performance.md, "Whole processes").
This is the same algorithm in a few lines, and the update reads like the paper (Algorithm 2):

    g ← ∇L;  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²
    θ ← θ − lr·λ·θ − lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + ε)
"""

from __future__ import annotations

import torch


def scheduled_lr(lr: float, step: int, steps: int, warmup: int, warmdown: float) -> float:
    """The learning rate of step `step` (0-based) of a run of at most `steps`: warm-up, stable,
    warm-down.

        lr · min(1, (step + 1)/warmup) · min(1, (steps − step)/n),   n = round(warmdown · steps)

    a linear warm-up over the first `warmup` steps (0: none), then lr, then a linear fall to 0 at
    step `steps` over its last n steps (warmdown 0: none; 1: the whole run, nanochat's RL). The rate
    of a run that stops early (at its goal) does not depend on the cap, unless the run reaches the
    cap's last n steps. Hägele et al. 2405.18392; nanochat's base_train `warmdown_ratio` (0.2)."""
    rate = lr * min(1.0, (step + 1) / warmup) if warmup else lr
    n = round(warmdown * steps)
    return rate * min(1.0, (steps - step) / n) if n else rate


class AdamW:
    """AdamW over `params`: one model's tensors, or tensors stacked (P, ...) over a leading dim of P
    runs alike in shape, each slice its own AdamW's step (to float rounding; on the CPU to the bit:
    tests/test_optim.py). t, the step count: a number, or a (P,) int64 tensor of each slice's own;
    the rate, param_groups[0]["lr"]: a number, or a (P,) float64 tensor of each slice's own."""

    def __init__(
        self,
        params,
        lr: float,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        t: int | torch.Tensor = 0,
    ):
        self.params = [p for p in params if p.requires_grad]
        self.param_groups = [{"lr": lr}]  # the one group; schedules set param_groups[0]["lr"]
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        self.t = t
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, active: torch.Tensor | None = None) -> None:
        """The update above, for the slices in `active` ((P,) bool, with a (P,) t; None: all); the
        others keep weights, moments and count. A coefficient is a number where the slices agree (so
        one run's step), else a (P, 1, ...) tensor of the numbers each slice's own step takes."""
        lr, (b1, b2) = self.param_groups[0]["lr"], self.betas
        self.t += 1 if active is None else active.to("cpu", torch.long)
        live = [k for k, p in enumerate(self.params) if p.grad is not None]
        if not live:
            return
        p, g = [self.params[k] for k in live], [self.params[k].grad for k in live]
        m, v = [self.m[k] for k in live], [self.v[k] for k in live]
        ts, lrs = torch.as_tensor(self.t), torch.as_tensor(lr, dtype=torch.float64)
        n = max(ts.numel(), lrs.numel())  # each slice's count and rate, as numbers (a count 0:
        ts, lrs = [max(t, 1) for t in ts.expand(n).tolist()], lrs.expand(n).tolist()  # skipped)

        def each(values: list[float]):  # a number, or its float32 rounding per slice
            if len(set(values)) == 1:
                return values[0]
            c = torch.tensor(values, dtype=p[0].dtype, device=p[0].device)
            return [c.view(-1, *[1] * (x.dim() - 1)) for x in p]

        off = None if active is None else ~active.to(p[0].device)
        kept = [(x, x[off]) for x in p + m + v] if off is not None and bool(off.any()) else []
        # each line is one tensor's update done to every tensor in one call (torch._foreach_*, as
        # torch.optim does): on a GPU, a few launches instead of hundreds
        torch._foreach_mul_(m, b1)
        torch._foreach_add_(m, g, alpha=1 - b1)  # m ← β1·m + (1−β1)·g
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, g, g, value=1 - b2)  # v ← β2·v + (1−β2)·g²
        if self.weight_decay:
            torch._foreach_mul_(p, each([1 - r * self.weight_decay for r in lrs]))  # θ ← θ − lr·λ·θ
        denom = torch._foreach_div(v, each([1 - b2**t for t in ts]))
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, self.eps)  # sqrt(v / (1−β2^t)) + ε
        # θ ← θ − lr · (m / (1−β1^t)) / denom; per slice (lr/(1−β1^t))·m as addcdiv's value·m
        rate = each([-r / (1 - b1**t) for r, t in zip(lrs, ts)])
        if isinstance(rate, list):
            torch._foreach_addcdiv_(p, torch._foreach_mul(m, rate), denom)
        else:
            torch._foreach_addcdiv_(p, m, denom, value=rate)
        for x, old in kept:
            x[off] = old

    def state_dict(self) -> dict:
        return adamw_state(self.t, self.param_groups[0]["lr"], self.m, self.v)

    def load_state_dict(self, state: dict) -> None:
        self.t = state["t"]
        self.param_groups[0]["lr"] = state["lr"]
        for mine, saved in zip(self.m + self.v, state["m"] + state["v"]):
            mine.copy_(saved)


def adamw_state(t, lr, m: list, v: list) -> dict:
    """AdamW's checkpoint state: its step count, rate and moments (on the host). The arithmetic is
    elementwise, so a slice of stacked moments (P runs') is one run's state."""
    return {"t": t, "m": [x.cpu() for x in m], "v": [x.cpu() for x in v], "lr": lr}


@torch.no_grad()
def clip_grad_norm(params, max_norm: float, per_slice: bool = False) -> torch.Tensor:
    """Scale the gradients so their global L2 norm is at most max_norm: g ← g · min(1, max_norm /
    (‖g‖ + 1e-6)), ‖g‖ over all parameters as one vector. -> ‖g‖ before clipping (a 0-dim tensor).
    per_slice: each slice along the leading dim (P) on its own, ‖g‖ over its slices -> (P,) norms
    (to the bit each slice's own clip; a NaN reaches its own slice only).

    torch.nn.utils.clip_grad_norm_ computes the same, to the bit (tests/test_optim.py), but
    multiplies every gradient by the coefficient even when it is exactly 1, so as not to make a GPU
    wait for the comparison. Here the norm is read at once anyway (it is logged), and skipping that
    no-op halves the clip's time. A NaN norm still reaches every gradient, as in torch."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    if per_slice:  # each slice's norms: the two reductions below, slice by slice, each slice in
        # its own memory layout (a tensor's norm sums in memory order)
        rows = torch._foreach_norm([x for g in grads for x in g.unbind(0)])
        each = torch.stack(rows).view(len(grads), -1).t().contiguous()  # (P, tensors)
        norm = torch.linalg.vector_norm(each, dim=1)
    else:
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    coef = max_norm / (norm + 1e-6)
    if not bool((coef >= 1.0).all()):  # a coef < 1, or NaN
        if per_slice:  # min(1, coef) per slice (a NaN stays NaN)
            c = coef.clamp(max=1.0)
            coef = [c.view(-1, *[1] * (g.dim() - 1)) for g in grads]
        torch._foreach_mul_(grads, coef)
    return norm
