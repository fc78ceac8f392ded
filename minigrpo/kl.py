"""Per-token estimators of KL(π_θ ‖ π_ref) from tokens sampled by π_θ (Schulman, "Approximating KL
Divergence", 2020; REFERENCE.md §4), and the exact KL over the whole vocabulary.

With Δ = log π_ref(x) − log π_θ(x) for a token x ~ π_θ:
    k1 = −Δ                 unbiased, high variance, can be negative
    k2 = ½ Δ²               biased, low variance, ≥ 0
    k3 = e^Δ − Δ − 1        unbiased, low variance, ≥ 0   (GRPO's choice, DeepSeekMath §4.1)
Used as LOSS terms their on-policy expected gradients differ (the sample x held fixed):
    E[∇k1] = 0 (regularises nothing), E[∇k2] = ∇KL(π_θ‖π_ref), E[∇k3] = ∇KL(π_ref‖π_θ) (forward KL).
Departure: the log-ratio is clamped to ±20 before exp (as verl does) so k3 stays finite.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOG_RATIO_CLAMP = 20.0


def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log π_θ − log π_ref, any shape -> same shape. Unbiased for KL(π_θ‖π_ref); E[∇k1] = 0."""
    return logp - ref_logp


def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log π_θ − log π_ref)², any shape -> same shape. ≥ 0; E[∇k2] = ∇KL(π_θ‖π_ref)."""
    return 0.5 * (logp - ref_logp) ** 2


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = e^Δ − Δ − 1 with Δ = log π_ref − log π_θ, any shape -> same shape.

    ≥ 0, = 0 iff Δ = 0, unbiased for KL(π_θ‖π_ref). As a LOSS its expected gradient on-policy is
    ∇KL(π_ref‖π_θ): it optimises the FORWARD KL, not the reverse KL it estimates (close to k2's near
    π_θ ≈ π_ref). Δ is clamped to ±20 for finiteness.
    """
    delta = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(delta) - delta - 1


ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3}


def exact(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(logits) ‖ softmax(ref_logits)) = Σ_v p_v (log p_v − log q_v) per position.

    logits, ref_logits (..., V) -> (...). Computed from log_softmax, so finite at logits ±1e4.
    """
    logp = F.log_softmax(logits, dim=-1)
    logq = F.log_softmax(ref_logits, dim=-1)
    return (logp.exp() * (logp - logq)).sum(-1).clamp(min=0.0)
