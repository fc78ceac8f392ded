"""How far the policy π_θ has moved from the reference π_ref: KL(π_θ ‖ π_ref).

Per-token estimators (Schulman, "Approximating KL Divergence", 2020) from a token x sampled by π_θ,
with the log-ratio Δ = log π_ref(x) − log π_θ(x):

    k1 = −Δ              unbiased, high variance, can be negative
    k2 = ½ Δ²            biased, low variance, ≥ 0
    k3 = e^Δ − Δ − 1     unbiased, low variance, ≥ 0     (GRPO's choice, DeepSeekMath 2402.03300 eq.
                         4)

and `exact`, the KL summed over the whole vocabulary (cheap at character level: the best yardstick).
Two corrections of k3 as a loss term (the table that names them all: variants/kl.py):

    k3_plus   value k3, gradient k2's (straight-through; verl's "k3+")     E[∇] = ∇KL(π_θ ‖ π_ref)
              on-policy
    k3_iw     ρ·k3 with ρ = π_θ/π_old, x ~ π_old, ρ NOT detached            E_{π_old}[∇] = ∇KL(π_θ ‖
              π_ref) (DeepSeek-V3.2 2512.02556, TRL use_bias_correction_kl)     (detaching ρ gives
              ∇KL(π_ref ‖ π_θ))

Used as a LOSS term (the sampled token held fixed, gradient only through log π_θ(x)), their expected
on-policy gradients are not the gradient of the KL they estimate:
    E[∇k1] = 0                  (k1 regularises nothing)
    E[∇k2] = ∇KL(π_θ ‖ π_ref)   (the reverse KL: the "right" gradient)
    E[∇k3] = ∇KL(π_ref ‖ π_θ)   (the forward KL; close to k2's near π_θ ≈ π_ref)
tests/test_kl.py proves all three by exact enumeration.

Departure: k3 clamps Δ to ±LOG_RATIO_CLAMP = 20 before exp, as verl does, so it stays finite (its
gradient is 0 beyond); verl also clamps k3's value to ±10, which we don't. Set LOG_RATIO_CLAMP to
math.inf to remove the clamp. k3 is computed as expm1(Δ) − Δ, exact to rounding for tiny Δ (e^Δ − 1
would cancel) and never negative.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOG_RATIO_CLAMP = 20.0


def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log π_θ(x) − log π_ref(x) = −Δ, any shape -> same shape (Schulman 2020).

    Unbiased for KL(π_θ‖π_ref) when x ~ π_θ, but high variance and often negative per token.
    As a loss its expected on-policy gradient is 0: it regularises nothing.
    """
    return logp - ref_logp


def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log π_θ(x) − log π_ref(x))² = ½ Δ², any shape -> same shape (Schulman 2020).

    ≥ 0 and low variance, but biased (bias ≈ O(Δ³)). As a loss its expected on-policy gradient is
    exactly ∇KL(π_θ‖π_ref), the reverse KL it estimates.
    """
    return 0.5 * (logp - ref_logp) ** 2


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = e^Δ − Δ − 1 with Δ = log π_ref(x) − log π_θ(x), any shape -> same shape (Schulman 2020).

    ≥ 0, = 0 iff Δ = 0, unbiased and low variance for KL(π_θ‖π_ref) (GRPO, DeepSeekMath eq. 4).
    As a LOSS its expected on-policy gradient is ∇KL(π_ref‖π_θ): the FORWARD KL, not the reverse KL
    it estimates (k2's gradient is ∇KL(π_θ‖π_ref), k1's is 0).
    Δ is clamped to ±20 before exp (verl) so the value is finite; computed as expm1(Δ) − Δ.
    """
    delta = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.expm1(delta) - delta


def exact(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(logits) ‖ softmax(ref_logits)) = Σ_v p_v·(log p_v − log q_v) per position.

    logits, ref_logits: (..., V) -> (...). Built from log_softmax, so finite at logits ±1e4 (a
    probability that underflows to 0 multiplies a finite log-ratio). Clamped at 0 against rounding.
    """
    logp = F.log_softmax(logits, dim=-1)
    ref_logp = F.log_softmax(ref_logits, dim=-1)
    return (logp.exp() * (logp - ref_logp)).sum(dim=-1).clamp(min=0.0)


# ---- k3 with the reverse-KL gradient (verl's "k3+") and importance-weighted k3 (DeepSeek-V3.2)
# ----


def k3_plus(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3's VALUE with k2's GRADIENT:  sg(k3) + k2 − sg(k2),  any shape -> same shape.

    Straight-through (verl's "+" suffix, e.g. "low_var_kl+"): logged and added to the loss as k3
    (unbiased, ≥ 0), differentiated as k2, so its expected on-policy gradient is ∇KL(π_θ‖π_ref), the
    reverse KL it estimates, where plain k3's is the forward KL's (tests/test_kl.py, by exact
    enumeration).
    """
    value, grad_carrier = k3(logp, ref_logp), k2(logp, ref_logp)
    return value.detach() + (grad_carrier - grad_carrier.detach())  # + exactly 0 in value


def k3_iw(logp: torch.Tensor, ref_logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """Importance-weighted k3 for tokens sampled by π_old:  ρ·k3,  ρ = exp(log π_θ − log π_old),
    any shape.

    DeepSeek-V3.2 (arXiv 2512.02556, its "unbiased KL estimate"): with x ~ π_old and μ > 1 updates
    per batch, π_θ ≠ π_old and plain k3 estimates the KL of the wrong sampler; weighting by ρ
    restores it:
        E_{x~π_old}[ρ·k3] = E_{x~π_θ}[k3] = KL(π_θ‖π_ref).
    ρ carries its gradient, as in TRL's use_bias_correction_kl (per_token_kl * coef_1, coef_1 not
    detached). Then ∇(ρ·k3) = ρ·(k3 + 1 − π_ref/π_θ)·∇log π_θ = ρ·(log π_θ − log π_ref)·∇log π_θ, so
        E_{x~π_old}[∇(ρ·k3)] = ∇KL(π_θ‖π_ref)   (the reverse KL, exactly, for any π_old),
    and at ρ = 1 the per-sample gradient is k2's. With ρ detached the expectation is ∇KL(π_ref‖π_θ),
    plain k3's forward-KL gradient. log ρ is clamped to ±LOG_RATIO_CLAMP before exp, as everywhere.
    """
    ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    return ratio * k3(logp, ref_logp)
