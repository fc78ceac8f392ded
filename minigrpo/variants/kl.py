"""KL estimators, one table: the per-token KL(π_θ‖π_ref) that GRPO's --kl names, and where --kl-in
puts it.

Each entry holds its function (the math: objectives/kl.py), the inputs it reads, and whether it is a
value that can be folded into the reward (k1, k2, k3; k3+ and k3_iw differ from k3 only in their
gradient). The CLI choices, the check and the logged metric names (kl_<name>) come from this table:
adding an estimator is one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from minigrpo.objectives.kl import exact, k1, k2, k3, k3_iw, k3_plus
from minigrpo.objectives.losses import aggregate
from minigrpo.util.cli import UsageError, flag


@dataclass(frozen=True)
class KLEstimator:
    fn: Callable[..., torch.Tensor]  # keyword inputs (below) -> (N, T)
    needs: tuple[str, ...]  # of logp, ref_logp, old_logp (N, T) and logits, ref_logits (N, T, V)
    reward_penalty: bool  # a value alone: can be folded into the reward as β·Σ_t k (--kl-in reward)


KL_ESTIMATORS = {
    "exact": KLEstimator(exact, ("logits", "ref_logits"), False),  # Σ_v over the whole vocabulary
    "k1": KLEstimator(k1, ("logp", "ref_logp"), True),
    "k2": KLEstimator(k2, ("logp", "ref_logp"), True),
    "k3": KLEstimator(k3, ("logp", "ref_logp"), True),  # the GRPO paper's
    "k3+": KLEstimator(k3_plus, ("logp", "ref_logp"), False),  # k3's value, k2's gradient (verl)
    "k3_iw": KLEstimator(k3_iw, ("logp", "ref_logp", "old_logp"), False),  # ρ·k3 (DeepSeek-V3.2)
}
KL_PANEL = ("KL to π_ref per token (lower = closer)", [f"kl_{name}" for name in KL_ESTIMATORS])


@dataclass
class KLFlags:
    """KL to the reference π_ref"""

    beta: float = flag(0.3, "β: KL(π‖π_ref) weight (the paper: 0.04; see grpo.py)")
    kl: str = flag(
        "exact",
        "KL estimator per token (exact: full vocabulary; the paper uses k3; k3+: k3's value, k2's "
        "gradient; k3_iw: ρ·k3, DeepSeek-V3.2; objectives/kl.py)",
        choices=list(KL_ESTIMATORS),
    )
    rollout_kl: bool = flag(
        True,
        "log the per-token KL(π‖π_ref) on each rollout even when nothing else needs π_ref's "
        "log-probs (β = 0, no --fork-entropy): one no-grad forward of π_ref a step, which "
        "--no-rollout-kl skips, as TRL does at β = 0 (the exact evaluation's kl_ref is logged "
        "either way)",
    )
    kl_in: str = flag(
        "loss",
        "where the KL goes: a loss term, or subtracted from the reward (β·Σ_t k)",
        choices=["loss", "reward"],
    )


def kl_per_token(logp, ref_logp, logits, ref_logits, kind: str, old_logp=None) -> torch.Tensor:
    """(N, T) per-token KL(π‖π_ref) by the estimator `kind` (KL_ESTIMATORS)."""
    inputs = {
        "logp": logp,
        "ref_logp": ref_logp,
        "old_logp": old_logp,
        "logits": logits,
        "ref_logits": ref_logits,
    }
    estimator = KL_ESTIMATORS[kind]
    return estimator.fn(*(inputs[name] for name in estimator.needs))


def kl_reward_penalty(old_logp, ref_logp, mask, cfg) -> torch.Tensor:
    """--kl-in reward: β·Σ_t k(π_old, π_ref) over each completion's valid tokens, (N, T) -> (N,)."""
    kl_tok = KL_ESTIMATORS[cfg.kl].fn(old_logp, ref_logp)
    return cfg.beta * torch.where(mask, kl_tok, 0.0).sum(1)


@torch.no_grad()
def kl_figures(kl_tok, logits, ref_logits, mask, cfg) -> dict[str, torch.Tensor]:
    """What an update logs of its KL to π_ref: the token-means of --kl's estimate (kl_<name>) and of
    the exact KL (the same tensor where --kl is exact) -> 0-dim tensors (none without π_ref: kl_tok
    None). kl_tok (N, T), logits and ref_logits (N, T, V), mask (N, T). Mappable over a leading
    member dim (population/grpo_update.py)."""
    if kl_tok is None:
        return {}
    mean = lambda x: aggregate(x, mask, "token-mean")
    chosen = mean(kl_tok)
    return {
        f"kl_{cfg.kl}": chosen,
        "kl_exact": chosen if cfg.kl == "exact" else mean(exact(logits, ref_logits)),
    }


def check(cfg) -> None:
    if cfg.kl_in == "reward" and cfg.beta > 0 and not KL_ESTIMATORS[cfg.kl].reward_penalty:
        *names, last = [k for k, e in KL_ESTIMATORS.items() if e.reward_penalty]
        allowed = f"{', '.join(names)} or {last}"
        raise UsageError(
            f"--kl {cfg.kl} works only with --kl-in loss (the reward penalty uses {allowed}; "
            f"k3+ and k3_iw differ from k3 only in their gradient)"
        )
