"""GRPO's inner updates, written once for a run alone and for a lockstep population's members
(grpo.py's GRPO.update and population/grpo_update.py call them): the μ loop with the preservation
term beside each update, a step skipped for want of signal, and the step's metrics row.

    per_update, ratios = inner_updates(μ, forward, terms, anchor_term, step)
    figures = row(stats, before, per_update, ratios)      # the step's row (floats)

What GRPO's stages map over (`m`): `Alone`, one run, here; P members stacked,
population/grpo_update.Members. Each has `each(fn, *args)`: fn(a run's algorithm, its tensors)
run by run; `map(fn, *args)`: a pure fn of one run's tensors, mapped; `keep(sig, keep)`: DAPO's
filter; `batch`: the rollout(s); and `sampler_logp`: π_sampler's log-probs.
"""

from __future__ import annotations

import torch

from minigrpo.rl.report import combine_stats
from minigrpo.rl.rollout import RolloutBatch


class Alone:
    """What GRPO's stages map over (`m`, above) in a run alone: this run."""

    def __init__(self, algo, batch: RolloutBatch):
        self.algo, self.batch = algo, batch

    def each(self, fn, *args):
        return fn(self.algo, *args)

    def map(self, fn, *args):
        return fn(*args)

    @property
    def sampler_logp(self) -> torch.Tensor:
        return self.batch.sampler_logp

    def keep(self, sig, keep: torch.Tensor) -> None:
        """DAPO's filter: the kept rows (keep (N,) bool) alone, or none left: a skipped step."""
        rows = keep.nonzero().flatten()
        if len(rows) == 0:
            sig.skipped = True
            return
        self.batch = b = self.batch.select(rows)
        sig.adv, sig.mask, sig.old_logp = sig.adv[rows], b.mask, b.old_logp
        sig.ref_logp, sig.ref_logits = b.ref_logp, b.ref_logits


def inner_updates(updates: int, forward, terms, anchor_term, step) -> tuple[list, list]:
    """μ = `updates` inner updates: each a forward of π_θ -> (logp, logits), terms(i, logp, logits)
    -> (loss, figures, ratio figures) (None: a skipped step's, the preservation term alone), the
    preservation term anchor_term() (None when off) added, and step(loss) -> the gradient norm
    (backward, clip, optimiser step). -> (each update's figures, each update's ratio figures where
    it has them), detached. Losses may carry a leading member dim: step sums them."""
    per_update, ratios = [], []
    for i in range(updates):
        loss, s, ratio = (None, {}, None) if terms is None else terms(i, *forward())
        anchor = anchor_term()
        if anchor is not None:
            loss = anchor if loss is None else loss + anchor
            if "loss" in s:
                s["loss"] = loss
            s["preserve_loss"] = anchor
        if loss is None:  # no group left, no anchor: no update
            break
        if ratio:
            ratios.append(ratio)
        s["grad_norm"] = step(loss)
        per_update.append({k: v.detach() if torch.is_tensor(v) else v for k, v in s.items()})
    return per_update, ratios


def row(stats: dict, before: list, per_update: list[dict], ratios: list[dict]) -> dict:
    """A step's metrics row: its figures, then its inner updates' combined (rl/report.combine_stats:
    the mean over the μ updates, a maximum the max; the ratio's over updates 2..μ). A skipped step
    (stats "skipped" 1) logs its signal's figures (`before`) and its updates' preservation term and
    gradient norm."""
    head = {k: v for k, v in stats.items() if k != "skipped"}
    if stats.get("skipped"):
        alone = [
            {k: d[k] for k in ("preserve_loss", "grad_norm")}
            for d in per_update
            if "preserve_loss" in d
        ]
        return {**{k: head[k] for k in before if k in head}, **combine_stats(alone), "skipped": 1.0}
    return {**head, **combine_stats(per_update), **combine_stats(ratios)}
