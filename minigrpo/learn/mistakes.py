"""The typical mistakes, each recognised by what the learner's function DOES on one small input, and
the message that points at it. `grade` shows the messages of the mistakes a failing function shows.

A probe returns True when the function behaves like the mistake; a function that raises shows no
mistake here (the tests report the error). Every probe is checked against the library (no false
alarm) and against a planted copy of its mistake (tests/test_learn.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Mistake:
    exercise: str  # the function's name
    key: str
    probe: Callable  # fn -> bool
    message: str


def _t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def _close(x, want, tol=1e-3) -> bool:
    return (
        isinstance(x, torch.Tensor)
        and x.shape == torch.as_tensor(want).shape
        and bool(torch.allclose(x.detach().double(), _t(want), atol=tol))
    )


def _surrogate_grad(fn, ratio: float, adv: float, **kw) -> tuple[float, float]:
    """(loss, d loss / d logp) of one token with π_θ/π_old = ratio and advantage adv."""
    logp = _t([[math.log(ratio)]], grad=True)
    loss = fn(logp, _t([[0.0]]), _t([adv]), torch.ones(1, 1, dtype=torch.bool), **kw)
    loss.sum().backward()
    return loss.sum().item(), logp.grad.item()


def _population_std(fn):
    return _close(fn(_t([[1, 1, 1, 1, 0, 0, 0, 0.0]]), eps=0.0), [[1, 1, 1, 1, -1, -1, -1, -1.0]])


def _no_equal_guard(fn):
    # std 0; the mean of eight 0.1s is not exactly 0.1
    out = fn(_t([[0.1] * 8, [0.7] * 8]), eps=0.0)
    return isinstance(out, torch.Tensor) and not bool((out == 0).all())


def _std_underflows(fn):
    # deviations of 5e-201: their squares underflow to 0
    out = fn(_t([[0.0, 1e-200, 0.0, 1e-200]]), eps=0.0)
    return isinstance(out, torch.Tensor) and not bool(torch.isfinite(out).all())


def _mean_includes_self(fn):
    return _close(fn(_t([[1.0, 0.0, 0.0, 0.0]])), [[0.75, -0.25, -0.25, -0.25]])


def _rloo_equal_noise(fn):
    out = fn(_t([[0.1] * 3, [0.7] * 3]))  # the mean of three 0.1s is not exactly 0.1
    return isinstance(out, torch.Tensor) and not bool((out == 0).all())


def _surrogate_sign(fn):
    loss, grad = _surrogate_grad(fn, 1.0, 1.0)
    return abs(loss - 1.0) < 1e-6 and grad > 0


def _clip_wrong_side(fn):
    (_, g_low), (_, g_high) = _surrogate_grad(fn, 0.5, -1.0), _surrogate_grad(fn, 1.5, -1.0)
    return g_low != 0 or g_high == 0  # A < 0: clipped (no gradient) below 1−ε, unclipped above 1+ε


def _sign_swapped(swapped_value):
    """A probe: does the estimator give, at π_θ(x) = 0.5 and π_ref(x) = 0.25, what it gives with the
    two swapped?"""
    return lambda fn: _close(fn(_t([math.log(0.5)]), _t([math.log(0.25)])), [swapped_value], 1e-6)


def _exact_swapped(fn):
    p, q = _t([[math.log(0.9), math.log(0.1)]]), _t([[math.log(0.5), math.log(0.5)]])
    return _close(fn(p, q), [0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)], 1e-6)


def _padded_length(fn):
    x, mask = (
        torch.ones(2, 4, dtype=torch.float64),
        torch.tensor([[True] + [False] * 3, [True] * 4]),
    )
    return any(
        _close(fn(x, mask, mode), 0.625, 1e-9) for mode in ("seq-mean-token-mean", "token-mean")
    )


def _mask_multiplied(fn):
    x = _t([[1.0, float("nan")]])
    out = fn(x, torch.tensor([[True, False]]), "token-mean")
    return isinstance(out, torch.Tensor) and bool(torch.isnan(out).any())


def _gae_bootstrap(fn):
    adv, _ = fn(
        _t([[0.0, 1.0, 0.0]]), _t([[0.5, 0.5, 9.0]]), torch.tensor([[True, True, False]]), 1.0, 1.0
    )
    return isinstance(adv, torch.Tensor) and abs(adv[0, 1].item() - 0.5) > 1e-6


def _after_eos(fn):
    logits, ids = torch.zeros(1, 3, 4, dtype=torch.float64), torch.tensor([[0, 1, 2, 3]])
    return _close(fn(logits, ids, 2, torch.tensor([[True, False]])), [[-math.log(4)] * 2], 1e-6)


def _off_by_one(fn):
    logits = torch.log(_t([[[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.6, 0.2], [0.25] * 4]]))
    # right: log 0.6, log 0.25
    out = fn(logits, torch.tensor([[0, 1, 2, 3]]), 2, torch.tensor([[True, True]]))
    first = out[0, 0].item()
    # logits[P+j] or ids[P−1+j]
    return abs(first - math.log(0.25)) < 1e-6 or abs(first - math.log(0.1)) < 1e-6


def _attention_unscaled(fn):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 3, 4, generator=g, dtype=torch.float64) for _ in range(3))
    unscaled = (q @ k.transpose(-1, -2)).masked_fill(
        ~torch.ones(3, 3, dtype=torch.bool).tril(), -math.inf
    )
    return _close(fn(q, k, v), (unscaled.softmax(-1) @ v).tolist(), 1e-9)


def _kl_subtracted(fn):
    from minigrpo.grpo import GRPOConfig

    logits = _t([[[0.0, 2.0]]])
    ref = _t([[[0.0, 0.0]]])
    logp = torch.log_softmax(logits, -1)[..., 1]
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, policy_loss, kl_tok, _ = fn(
        logp,
        logp.detach(),
        torch.log_softmax(ref, -1)[..., 1],
        logits,
        ref,
        _t([0.0]),
        mask,
        GRPOConfig(beta=0.5, max_new_tokens=1),
    )
    return loss.item() < policy_loss.item() - 1e-9


CATALOGUE = (
    Mistake(
        "group_advantages",
        "population_std",
        _population_std,
        "you divide by the POPULATION std (÷G): GRPO's code and TRL use Bessel's correction "
        "(÷(G−1)), torch.std's default; [1,1,1,1,0,0,0,0] must give ±0.935, not ±1 (and honour "
        "unbiased=False)",
    ),
    Mistake(
        "group_advantages",
        "no_equal_group_guard",
        _no_equal_guard,
        "a group whose rewards are all equal must get exactly 0: its std is 0 (or rounding noise), "
        "so (r − mean)/std is NaN or noise blown up by 1/ε. Guard it: advantages.equal_groups and "
        "torch.where",
    ),
    Mistake(
        "group_advantages",
        "std_underflows",
        _std_underflows,
        "the tiny-std pitfall: deviations of 1e-200 square to 0, the std underflows and A becomes "
        "±inf. Divide the deviations by the largest |deviation| before squaring (std(s·y) = "
        "s·std(y)): advantages._std",
    ),
    Mistake(
        "rloo_advantages",
        "mean_includes_self",
        _mean_includes_self,
        "your baseline includes the completion itself: RLOO's is the mean of the OTHER G−1 "
        "rewards, r_i − (Σ_j r_j − r_i)/(G−1) = G/(G−1)·(r_i − r̄)",
    ),
    Mistake(
        "rloo_advantages",
        "no_equal_group_guard",
        _rloo_equal_noise,
        "an all-equal group must get exactly 0, but G/(G−1)·(r − r̄) leaves rounding noise there "
        "(the mean of "
        "three 0.1s is not exactly 0.1): set those rows with equal_groups and torch.where",
    ),
    Mistake(
        "clipped_surrogate",
        "sign",
        _surrogate_sign,
        "sign: the function returns a LOSS to minimise, −min(ρA, clip(ρ)A). With +, gradient "
        "descent pushes good completions DOWN",
    ),
    Mistake(
        "clipped_surrogate",
        "clip_wrong_side",
        _clip_wrong_side,
        "the clip is on the wrong side for a negative advantage: with A < 0, min(ρA, clip(ρ)A) "
        "takes the "
        "CLIPPED value (no gradient) when ρ < 1−ε and the unclipped ρA (a gradient) when ρ > 1+ε",
    ),
    Mistake(
        "k1",
        "sign",
        _sign_swapped(-math.log(2)),  # right: +log 2
        "the KL's sign: k1 = log π_θ(x) − log π_ref(x) (positive where the policy likes x more "
        "than the reference); swapping them estimates nothing useful",
    ),
    # Δ = +log 2; right: Δ = −log 2, 0.193
    Mistake(
        "k3",
        "sign",
        _sign_swapped(2 - math.log(2) - 1),
        "the KL's sign: Δ = log π_ref(x) − log π_θ(x), then k3 = e^Δ − Δ − 1. With Δ the other way "
        "round it is still ≥ 0 but is not an unbiased estimate of KL(π_θ‖π_ref) under x ~ π_θ",
    ),
    Mistake(
        "exact",
        "swapped",
        _exact_swapped,
        "KL(p‖q) weights by p = softmax(logits), the POLICY: Σ p (log p − log q). Yours computes "
        "KL(q‖p)",
    ),
    Mistake(
        "aggregate",
        "padded_length",
        _padded_length,
        "you divide by the padded width T: padding is no part of a completion. |o_i| = "
        "mask.sum(dim=1) (and Σ_i |o_i| for token-mean)",
    ),
    Mistake(
        "aggregate",
        "mask_multiplied",
        _mask_multiplied,
        "masked slots may hold NaN: x * mask keeps it (NaN·0 = NaN). Select with "
        "torch.where(mask, x, 0)",
    ),
    Mistake(
        "gae",
        "bootstrap_past_the_end",
        _gae_bootstrap,
        "GAE bootstraps past the end: after the last valid token the completion has ENDED, so "
        "V_{t+1} = 0 there; yours used the value of a padding slot",
    ),
    Mistake(
        "completion_token_logprobs",
        "tokens_after_eos",
        _after_eos,
        "you count tokens after the first EOS: they are PAD, not completion. Return exactly 0 "
        "where completion_mask is False",
    ),
    Mistake(
        "completion_token_logprobs",
        "off_by_one",
        _off_by_one,
        "off by one: logits[:, t] predicts ids[:, t+1], so completion token j (slot P+j) is scored "
        "by logits[:, P−1+j], not logits[:, P+j]",
    ),
    Mistake(
        "attention",
        "no_scaling",
        _attention_unscaled,
        "scale the scores by 1/√D before the softmax: q·kᵀ/√D (without it the softmax saturates "
        "as D grows)",
    ),
    Mistake(
        "grpo_loss",
        "kl_subtracted",
        _kl_subtracted,
        "the KL is a PENALTY: the loss we minimise ADDS β·aggregate(KL_t); subtracting it pays the "
        "policy to move away from π_ref",
    ),
)


def diagnose(name: str, fn) -> list[Mistake]:
    """The catalogued mistakes that `fn` (the learner's function called `name`) shows."""
    found = []
    for m in CATALOGUE:
        if m.exercise != name:
            continue
        try:
            if m.probe(fn):
                found.append(m)
        except Exception:  # noqa: BLE001
            # a function that raises on the probe shows no catalogued mistake
            pass
    return found
