"""Sampler corrections: rollouts drawn from a π_sampler other than π_old, and the importance weights
w = π_old/π_sampler that correct the policy loss (TRL's vllm_importance_sampling_correction, verl's
rollout correction: per_token_loss *= w before the KL term is added; the KL, entropy and
preservation terms are not weighted).

    --sample-temperature T, --sample-top-p P, --sample-stale N   where the rollouts come from
                           (rl/rollout.Sampler; the truncated mass of top-p can never be sampled:
                           no weight corrects that part)
    --is-correction tis    min(w, C), --is-cap C (verl's 2) (objectives/importance.py)
    --is-correction mis    w·1[LOW ≤ w ≤ HIGH], --is-band LOW,HIGH (verl's 0.5,2; IcePop)
    --is-level sequence    w = Π_t w_t over the completion, on each of its tokens
Departures: MIS zeroes the weight and keeps the token in the aggregation's denominator (TRL's mask),
where verl's rejection removes it; our band has a lower edge (TRL masks only above the cap). π_old's
log-probs come from the first update's forward pass (TRL recomputes them with the trainer, as here).
Without a --sample-* flag the sampler is π_old through the KV cache: a correction then only corrects
its rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

from minigrpo.objectives.importance import CORRECTIONS, correction
from minigrpo.rl.rollout import Sampler
from minigrpo.util.cli import UsageError, check_ranges, flag, require

PANELS = [
    (
        "sampler mismatch: mean IS weight, share capped / masked, KL(π_sampler‖π_old)",
        ["is_weight_mean", "is_capped", "is_masked", "sampler_kl"],
    )
]


@dataclass
class SamplerFlags:
    """sampler ≠ trainer: where rollouts come from, and the importance correction"""

    sample_temperature: float | None = flag(
        None,
        "sample the rollouts at this temperature (default --temperature; π_old stays at "
        "--temperature)",
    )
    sample_top_p: float | None = flag(
        None,
        "sample the rollouts from the top-p nucleus of the sampler's distribution (default: no "
        "truncation)",
    )
    sample_stale: int = flag(
        0,
        "sample the rollouts from the policy as it was N steps earlier (asynchronous RL; 0 = the "
        "current one)",
    )
    is_correction: str = flag(
        "none",
        "importance weights π_old/π_sampler on the per-token policy loss: truncated (tis) or "
        "masked (mis, IcePop) (objectives/importance.py)",
        choices=["none", *CORRECTIONS],
    )
    is_level: str = flag(
        "token",
        "the weight per token, or Π_t over the completion (sequence)",
        choices=["token", "sequence"],
    )
    is_cap: float | None = flag(None, "TIS: the cap C >= 1 of min(w, C) (default 2, verl's)")
    is_band: str | None = flag(
        None, "MIS: LOW,HIGH, the band of weights kept, LOW <= 1 <= HIGH (default 0.5,2, verl's)"
    )


def make_sampler(cfg) -> Sampler | None:
    """Where the rollouts come from when a --sample-* flag is set; None: from π_old itself."""
    mismatch = (
        cfg.sample_temperature is not None or cfg.sample_top_p is not None or cfg.sample_stale > 0
    )
    return Sampler(cfg.sample_temperature, cfg.sample_top_p, cfg.sample_stale) if mismatch else None


def is_weights(algo, old_logp, mask, sampler_logp) -> tuple:
    """A run's --is-correction weights π_old/π_sampler (N, T), None without one, and its figures:
    the sampler's KL and the correction's (objectives/importance.correction). GRPO asks for them
    when the rollout's sampler is not π_old or a correction is asked for."""
    cfg = algo.cfg
    level, cap = cfg.is_level, cfg.is_cap or 2.0
    return correction(cfg.is_correction, old_logp, sampler_logp, mask, level, cap, band(cfg))


def band(cfg) -> tuple[float, float]:
    """--is-band LOW,HIGH as two floats (default verl's 0.5, 2)."""
    if cfg.is_band is None:
        return 0.5, 2.0
    try:
        low, high = (float(x) for x in cfg.is_band.split(","))
    except ValueError:
        raise UsageError(f"--is-band must be LOW,HIGH (two numbers), got {cfg.is_band!r}") from None
    if not (0 <= low <= 1 <= high < float("inf")):
        raise UsageError(
            f"--is-band needs 0 <= LOW <= 1 <= HIGH (a weight of 1 must pass), got {cfg.is_band!r}"
        )
    return low, high


def check(cfg) -> None:
    """Ranges, and no flag that the chosen correction would ignore."""
    check_ranges(
        cfg, {"sample_temperature": (1e-3, None), "sample_top_p": (1e-6, 1), "is_cap": (1, None)}
    )
    require(cfg, "sample_stale", cfg.sample_stale >= 0, ">= 0")
    band(cfg)
    ignored = [
        (cfg.is_level != "token", "--is-level", "tis or mis"),
        (cfg.is_cap is not None, "--is-cap", "tis"),
        (cfg.is_band is not None, "--is-band", "mis"),
    ]
    for given, name, kinds in ignored:
        if given and cfg.is_correction not in kinds.split(" or "):
            raise UsageError(
                f"{name} belongs to --is-correction {kinds}, got --is-correction "
                f"{cfg.is_correction}"
            )
