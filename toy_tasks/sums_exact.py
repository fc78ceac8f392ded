"""A model measured exactly against the sums world (sums_world.py): the probability of every
declared completion of a prompt, teacher-forced over the prefix tree (lm/logprobs), so that
everything a run reports about thinking is computed, not sampled.

For prompts x with supports S(x) (every declared completion, direct and worked, with their slips)
and p(y) = π(y + EOS | x):

    accuracy       mean_x Σ_{y ∈ S(x), answer(y) = v(x)} p(y)       = pass@1
    think_rate     mean_x Σ_{y ∈ S(x) worked} p(y)
    pass_at_k      mean_x 1 − (1 − accuracy(x))^k                   (Chen et al. 2107.03374)
    len_mean       mean_x Σ_{y ∈ S(x)} p(y)·|y| / Σ_{y ∈ S(x)} p(y)  tokens, the end token
                   included; len_mean_correct / len_mean_wrong: over the right / wrong answers
    entropy        mean_x −Σ_{y ∈ S(x)} p(y) log p(y)               nats per completion: the
                   support's share of the sequence entropy, a lower bound of it (exact where
                   malformed is 0)
    malformed      mean_x 1 − Σ_{y ∈ S(x)} p(y)                     the mass outside the support

A conditional length of a prompt with no mass on its condition (no right answer at all) leaves the
prompt out of that mean. Supports differ in size (53 to 77 completions): they are laid out as
(P, K_max) with zero probability in a shorter row's padding.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from minigrpo.exact.frontier import pass_at_k
from minigrpo.lm.logprobs import completion_logprobs
from toy_tasks.sums_world import (
    DIRECT_RIGHT,
    HELDOUT,
    OPERANDS,
    P_WORKED,
    PROMPTS,
    STEP_OFFSETS,
    outcomes,
    value,
)

PASS_AT = (4, 16, 64)


@dataclass(frozen=True)
class SupportLayout:
    """Every declared completion of some prompts, laid out (P, K) with K the longest support."""

    prompts: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...]  # (prompt, completion) of every real slot, row by row
    slot: torch.Tensor  # (len(pairs),) long: each pair's flat slot in (P, K)
    real: torch.Tensor  # (P, K) bool: the slot holds a completion
    worked: torch.Tensor  # (P, K) bool
    correct: torch.Tensor  # (P, K) bool: its answer is the true sum
    length: torch.Tensor  # (P, K) float64: tokens, the end token included
    declared: torch.Tensor  # (P, K) float64: the student's probability


@functools.lru_cache(maxsize=8)
def layout(prompts: tuple[str, ...]) -> SupportLayout:
    rows = [outcomes(p) for p in prompts]
    P, K = len(rows), max(map(len, rows))
    real = torch.zeros(P, K, dtype=torch.bool)
    worked, correct = real.clone(), real.clone()
    length, declared = (
        torch.zeros(P, K, dtype=torch.float64),
        torch.zeros(P, K, dtype=torch.float64),
    )
    pairs, slot = [], []
    for i, (p, row) in enumerate(zip(prompts, rows)):
        for k, o in enumerate(row):
            real[i, k], worked[i, k], correct[i, k] = True, o.worked, o.answer == value(p)
            length[i, k], declared[i, k] = len(o.text) + 1, o.probability
            pairs.append((p, o.text))
            slot.append(i * K + k)
    return SupportLayout(
        tuple(prompts), tuple(pairs), torch.tensor(slot), real, worked, correct, length, declared
    )


@torch.no_grad()
def support_probs_many(models, tok, prompts: list[str], chunk: int = 8192) -> torch.Tensor:
    """Exact π(y + EOS | x) of every declared completion under each of M models (GPTs, or their
    weights stacked: lm/logprobs.completion_logprobs) -> (M, P, K) float64, 0 in padding."""
    lay = layout(tuple(prompts))
    xs, ys = [p for p, _ in lay.pairs], [c for _, c in lay.pairs]
    logp = torch.cat(
        [
            completion_logprobs(models, tok, xs[i : i + chunk], ys[i : i + chunk]).cpu()
            for i in range(0, len(xs), chunk)
        ],
        1,
    )
    out = torch.zeros(logp.size(0), lay.real.numel(), dtype=torch.float64)
    out[:, lay.slot] = logp.double().exp()
    return out.view(-1, *lay.real.shape)


def _share(probs: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Σ_k probs over the slots `where` -> (M, P)."""
    return (probs * where).sum(-1)


def _conditional_mean(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """mean over prompts of num/den where den > 0 -> (M,); NaN where no prompt has den > 0."""
    has = den > 0
    ratio = torch.where(has, num / den.clamp(min=1e-300), 0.0)
    return ratio.sum(-1) / has.sum(-1)


def exact_figures_many(probs: torch.Tensor, prompts: list[str]) -> list[dict[str, float]]:
    """The module's figures of M policies, probs (M, P, K) from support_probs_many over `prompts`;
    one dict each (keys exact_accuracy, exact_think_rate, ...)."""
    lay = layout(tuple(prompts))
    on = _share(probs, lay.real)
    right = _share(probs, lay.correct)
    plogp = torch.where(probs > 0, probs * probs.clamp(min=1e-300).log(), 0.0)
    length = probs * lay.length
    figures = {
        "exact_accuracy": right.mean(-1),
        "exact_think_rate": _share(probs, lay.worked).mean(-1),
        "exact_len_mean": _conditional_mean(length.sum(-1), on),
        "exact_len_mean_correct": _conditional_mean(_share(length, lay.correct), right),
        "exact_len_mean_wrong": _conditional_mean(
            _share(length, lay.real & ~lay.correct), on - right
        ),
        "exact_pass_at_1": right.mean(-1),
        **{f"exact_pass_at_{k}": pass_at_k(right.clamp(0, 1), k).mean(-1) for k in PASS_AT},
        "exact_entropy": -plogp.sum(-1).mean(-1),
        "malformed": (1 - on).clamp(min=0).mean(-1),
    }
    rows = torch.stack(list(figures.values()), 1).tolist()
    return [dict(zip(figures, row)) for row in rows]


def declared_figures(prompts: list[str]) -> dict[str, float]:
    """The figures of the student itself (the corpus's distribution) on `prompts`."""
    return exact_figures_many(layout(tuple(prompts)).declared[None], prompts)[0]


# ---- the pretraining report: per number of operands, every figure within BAR of the student -----

# malformed: held closer than arithmetic's 0.03, under the RL runs' every-step bar of 0.02; mean TV:
# over 50 + 27 completions per prompt, looser than arithmetic's 0.10 over 12
BAR = {"exact_accuracy": 0.05, "exact_think_rate": 0.05, "malformed": 0.015, "mean_tv": 0.15}


def report_row(probs: torch.Tensor, prompts: list[str]) -> dict[str, float]:
    """Figures of one model's probs (P, K) on `prompts`, and the mean TV to the student."""
    declared = layout(tuple(prompts)).declared
    off = (1 - probs.sum(-1)).clamp(min=0)
    tv = 0.5 * ((probs - declared).abs().sum(-1) + off)
    return {**exact_figures_many(probs[None], prompts)[0], "mean_tv": tv.mean().item()}


def pretrain_report(model, tokenizer) -> dict:
    """Exact figures on PROMPTS and HELDOUT, by number of operands; `ok` = every figure within BAR
    of the student's (declared) figure."""
    rows = {}
    for name, prompts in (("prompts", PROMPTS), ("heldout", HELDOUT)):
        for n in OPERANDS:
            mine = [p for p in prompts if len(p) == 2 * n]
            probs = support_probs_many([model], tokenizer, mine)[0]
            rows[f"{name} n={n}"] = {
                "got": report_row(probs, mine),
                "declared": {**declared_figures(mine), "mean_tv": 0.0},
            }
    ok = all(abs(r["got"][k] - r["declared"][k]) <= BAR[k] for r in rows.values() for k in BAR)
    return {"rows": rows, "ok": ok}


def format_report(report: dict) -> str:
    cols = list(BAR)
    lines = [f"{'':<14}" + "".join(f"{c.removeprefix('exact_'):>13}" for c in cols)]
    for name, r in report["rows"].items():
        lines.append(f"{name:<14}" + "".join(f"{r['got'][c]:>13.4f}" for c in cols))
        lines.append(f"{'  declared':<14}" + "".join(f"{r['declared'][c]:>13.4f}" for c in cols))
    verdict = "PASS" if report["ok"] else "FAIL"
    lines.append(f"{'bar ±':<14}" + "".join(f"{BAR[c]:>13.3f}" for c in cols) + f"   {verdict}")
    return "\n".join(lines)


# the student's accuracy at once and worked, for the docs and tests
WORKED_RIGHT = {
    n: sum(o.probability for o in outcomes("1+" * (n - 1) + "1=") if o.worked and o.answer == n)
    / P_WORKED
    for n in OPERANDS
}
assert abs(WORKED_RIGHT[2] - STEP_OFFSETS[0]) < 1e-12 and DIRECT_RIGHT[2] == 0.8
