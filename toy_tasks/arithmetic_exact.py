"""A model measured exactly against the arithmetic world (arithmetic_world.py): the probability of
every declared completion of a prompt, teacher-forced in batched forwards (exact_outcomes), so
1 - their sum is the mass off the declared support; the exact and the sampled accuracy; and the
pretraining report, every figure against its declared truth within BAR.
"""

from __future__ import annotations

import torch

from minigrpo.lm.logprobs import completion_logprobs
from minigrpo.lm.sampling import encode_prompts, generate, read_completions
from toy_tasks.arithmetic_world import (
    BLOCK_SIZE,
    HELDOUT,
    KINDS,
    NUMBERS,
    OUTCOMES,
    P_CORRECT,
    P_RIGHT_NUMBER,
    P_WELL_FORMED,
    PROMPTS,
    WRITINGS,
    answer,
    completions,
)


@torch.no_grad()
def _probs(models, tok, prompts: list[str], comps: list[str], chunk: int = 8192) -> torch.Tensor:
    """Exact P(completion + EOS | prompt) for each pair under each of M models (GPTs, or their
    weights stacked: lm/logprobs.completion_logprobs) -> (M, N), in as few batched forwards
    as `chunk` allows."""
    out = [
        completion_logprobs(models, tok, prompts[i : i + chunk], comps[i : i + chunk]).exp()
        for i in range(0, len(prompts), chunk)
    ]
    return torch.cat(out, 1).cpu()


def exact_accuracy(model, tok, prompts: list[str]) -> float:
    """Mean over prompts of the exact probability of the right, well-formed answer ("11." + EOS)."""
    return exact_accuracy_many([model], tok, prompts)[0]


def exact_accuracy_many(models, tok, prompts: list[str]) -> list[float]:
    """exact_accuracy of each of M models (GPTs, or their weights stacked)."""
    return [row.mean().item() for row in _probs(models, tok, prompts, [answer(p) for p in prompts])]


def exact_outcomes(model, tok, prompts: list[str]) -> torch.Tensor:
    """(len(prompts), len(KINDS)): the exact probability of each declared outcome's completion."""
    return exact_outcomes_many([model], tok, prompts)[0]


def exact_outcomes_many(models, tok, prompts: list[str]) -> torch.Tensor:
    """exact_outcomes of each of M models (GPTs, or their weights stacked) -> (M, len(prompts),
    len(KINDS))."""
    comps = [c for p in prompts for c in completions(p)]
    probs = _probs(models, tok, [p for p in prompts for _ in KINDS], comps)
    return probs.view(-1, len(prompts), len(KINDS))


@torch.no_grad()
def sampled_accuracy(
    model, tok, prompts: list[str], n_per_prompt: int, generator=None, chunk: int = 4096
) -> float:
    """Share of sampled completions (temperature 1) that are exactly the right, well-formed
    answer."""
    rows = [p for p in prompts for _ in range(n_per_prompt)]
    device = model.wte.weight.device
    hits = 0
    for i in range(0, len(rows), chunk):
        part = rows[i : i + chunk]
        ids, mask = encode_prompts(tok, part, device)
        gen = generate(model, ids, mask, max_new_tokens=BLOCK_SIZE, generator=generator)
        texts, done = read_completions(tok, [gen])[0]
        hits += sum(d and t == answer(p) for p, t, d in zip(part, texts, done))
    return hits / len(rows)


def exact_figures(model, tok, prompts: list[str], probs: torch.Tensor | None = None) -> dict:
    """Means over prompts of exact figures: P(right answer "v."), P(right number, any declared
    writing), P(well-formed, any declared number), mass off the 12 declared completions, and the TV
    to the model. `probs` (P, K): exact_outcomes of `prompts`, when already computed."""
    probs = exact_outcomes(model, tok, prompts) if probs is None else probs  # (P, K)
    declared = torch.tensor([q for _, q, _, _ in OUTCOMES])
    off = (1 - probs.sum(1)).clamp(min=0)
    tv = 0.5 * ((probs - declared).abs().sum(1) + off)
    kinds = dict(zip(KINDS, probs.mean(0).tolist()))
    return {
        "right": kinds["right/ok"],
        "right_number": sum(kinds[f"right/{w}"] for w, _, _ in WRITINGS),
        "well_formed": sum(kinds[f"{n}/ok"] for n, _, _ in NUMBERS),
        "off_support": off.mean().item(),
        "mean_tv": tv.mean().item(),
        "kinds": kinds,
    }


BAR = {
    "right": 0.05,
    "right_number": 0.05,
    "well_formed": 0.05,
    "off_support": 0.03,
    "mean_tv": 0.10,
}
_TRUTH = {
    "right": P_CORRECT,
    "right_number": P_RIGHT_NUMBER,
    "well_formed": P_WELL_FORMED,
    "off_support": 0.0,
    "mean_tv": 0.0,
}


def pretrain_report(model, tokenizer) -> dict:
    """Exact figures on PROMPTS and HELDOUT; `ok` = every figure is within BAR of the declared
    truth."""
    rows = {
        "prompts": exact_figures(model, tokenizer, PROMPTS),
        "heldout": exact_figures(model, tokenizer, HELDOUT),
    }
    ok = all(abs(r[k] - _TRUTH[k]) <= BAR[k] for r in rows.values() for k in BAR)
    return {**rows, "ok": ok}


def format_report(report: dict) -> str:
    lines = [
        f"{'':<9}" + "".join(f"{c:>13}" for c in BAR),
        f"{'declared':<9}" + "".join(f"{_TRUTH[c]:>13.4f}" for c in BAR),
    ]
    for name in ("prompts", "heldout"):
        lines.append(f"{name:<9}" + "".join(f"{report[name][c]:>13.4f}" for c in BAR))
    verdict = "PASS" if report["ok"] else "FAIL"
    lines.append(f"{'bar ±':<9}" + "".join(f"{BAR[c]:>13.2f}" for c in BAR) + f"   {verdict}")
    return "\n".join(lines)
