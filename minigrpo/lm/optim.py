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
    def __init__(
        self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0
    ):
        self.params = [p for p in params if p.requires_grad]
        self.param_groups = [{"lr": lr}]  # the one group; schedules set param_groups[0]["lr"]
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        self.t = 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        lr, (b1, b2) = self.param_groups[0]["lr"], self.betas
        self.t += 1
        bias1, bias2 = 1 - b1**self.t, 1 - b2**self.t
        live = [k for k, p in enumerate(self.params) if p.grad is not None]
        if not live:
            return
        p, g = [self.params[k] for k in live], [self.params[k].grad for k in live]
        m, v = [self.m[k] for k in live], [self.v[k] for k in live]
        # each line is one tensor's update done to every tensor in one call (torch._foreach_*, as
        # torch.optim does):
        # the same arithmetic, with one call instead of one per tensor (on a GPU, a few launches
        # instead of hundreds)
        torch._foreach_mul_(m, b1)
        torch._foreach_add_(m, g, alpha=1 - b1)  # m ← β1·m + (1−β1)·g
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, g, g, value=1 - b2)  # v ← β2·v + (1−β2)·g²
        if self.weight_decay:
            torch._foreach_mul_(p, 1 - lr * self.weight_decay)  # θ ← θ − lr·λ·θ
        denom = torch._foreach_div(v, bias2)
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, self.eps)  # sqrt(v / (1−β2^t)) + ε
        # θ ← θ − lr · (m / (1−β1^t)) / denom
        torch._foreach_addcdiv_(p, m, denom, value=-lr / bias1)

    def state_dict(self) -> dict:
        return {
            "t": self.t,
            "m": [m.cpu() for m in self.m],
            "v": [v.cpu() for v in self.v],
            "lr": self.param_groups[0]["lr"],
        }

    def load_state_dict(self, state: dict) -> None:
        self.t = state["t"]
        self.param_groups[0]["lr"] = state["lr"]
        for mine, saved in zip(self.m + self.v, state["m"] + state["v"]):
            mine.copy_(saved)


@torch.no_grad()
def clip_grad_norm(params, max_norm: float) -> torch.Tensor:
    """Scale the gradients so their global L2 norm is at most max_norm: g ← g · min(1, max_norm /
    (‖g‖ + 1e-6)), ‖g‖ over all parameters as one vector. -> ‖g‖ before clipping (a 0-dim tensor).

    torch.nn.utils.clip_grad_norm_ computes the same, to the bit (tests/test_optim.py), but
    multiplies every gradient by the coefficient even when it is exactly 1, so as not to make a GPU
    wait for the comparison. Here the norm is read at once anyway (it is logged), and skipping that
    no-op halves the clip's time. A NaN norm still reaches every
    gradient, as in torch."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    coef = max_norm / (norm + 1e-6)
    if not bool(coef >= 1.0):  # coef < 1, or NaN
        torch._foreach_mul_(grads, coef)
    return norm
