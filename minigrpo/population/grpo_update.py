"""GRPO's update (grpo.py, `GRPO.update`) for P members at once: each recipe's advantages and loss
on its members' slice (population/grpo_recipe.py), and one forward, one backward and one optimiser
step for all members.

    update = LockstepGRPO(cfg, anchor, grpo, cfgs)  # cfg: the first member's GRPOConfig, cfgs:
                                                    # every member's; anchor: population/anchor.py;
                                                    # grpo: the trainer (minigrpo.grpo)
    figures = update(stack, ref, opt, step)         # step: the members' rollouts
                                                    # (population/rows.Rollouts)
    row = update.row(mine, algo)                    # member p's figures {name: float} -> its
                                                    # metrics row's part

-> figures {name: (P,)}: the step's, and each inner update's (rl/report.packed), read back by the
caller in one go; `row` combines a member's inner updates as its single run combines them
(rl/report.py). Each member's figures are those of its single run, to float rounding
(tests/test_lockstep.py, test_grpo_recipe.py).

Members may follow different recipes (grpo_recipe.RECIPE: compare's presets of one μ, say; each
member's settings beyond its recipe are the others'): their rows, forward, backward, optimiser step
and trust region are one, and each recipe takes its members' slice of the log-probs (all of them, no
copy, where every member follows one). Not in lockstep (`unsupported`): the sampled anchor, each
member's own rows, whose π_ref logits its single run takes from another forward than its policy's,
so that at π_θ = π_ref their gradient is rounding that Adam's first step amplifies, and no lockstep
member could match it; those runs go alone (population/engine.py).
"""

from __future__ import annotations

import torch

from minigrpo.lm.optim import AdamW, clip_grad_norm
from minigrpo.population.anchor import MembersAnchor
from minigrpo.population.grpo_recipe import Recipe, recipe_of
from minigrpo.population.rows import Rollouts
from minigrpo.population.stacked import Stack
from minigrpo.rl.report import combine_stats, packed, unpacked


def unsupported(cfgs: list) -> str | None:
    """Why a lockstep population cannot run these members' configs (None: it can)."""
    cfg = cfgs[0]
    reasons = {"--preserve-anchor sampled": cfg.preserve and cfg.preserve_anchor == "sampled"}
    return next((name for name, yes in reasons.items() if yes), None)


class LockstepGRPO:
    def __init__(self, cfg, anchor: MembersAnchor | None, trainer, cfgs: list):
        self.cfg, self.anchor, self.trainer, self.recipes = cfg, anchor, trainer, {}
        self.stacks = []  # nothing to train but the policy (a critic's weights: ppo_update.py)
        recipes = [self.recipe(c) for c in cfgs]
        self.needs_ref = any(r.needs_ref for r in recipes)  # what the caller computes first
        self.needs_old_logp = any(r.needs_old_logp for r in recipes)

    def recipe(self, cfg) -> Recipe:
        """The Recipe a member of this config follows (made for its first member)."""
        key = recipe_of(cfg)
        if key not in self.recipes:
            self.recipes[key] = Recipe(cfg, self.trainer)
        return self.recipes[key]

    def host_state(self, algo, copies, p: int) -> dict:
        """A member's GRPO state (its Clip-Cov generator, its entropy coefficient) is its
        algorithm's own."""
        return algo.state_dict()

    def parts(self, step: Rollouts) -> list:
        """[(recipe, its members' places (P_r,) or None (every member), their step)]."""
        places: dict = {}
        for p, r in enumerate(step.runs):
            places.setdefault(recipe_of(r.cfg), []).append(p)
        if len(places) == 1:
            return [(self.recipe(step.runs[0].cfg), None, step)]
        parts = []
        for at in places.values():
            recipe, index = (
                self.recipe(step.runs[at[0]].cfg),
                torch.tensor(at, device=step.rewards.device),
            )
            parts.append(
                (recipe, index, step.members(at, index, recipe.needs_ref, recipe.needs_old_logp))
            )
        return parts

    def __call__(self, stack: Stack, ref: Stack, opt: AdamW, step: Rollouts) -> dict:
        cfg, parts = self.cfg, self.parts(step)
        # 1. rewards -> one advantage per completion
        signals = [recipe.signal(mine) for recipe, _, mine in parts]
        merge = _Merge([index for _, index, _ in parts])
        active = None  # who updates: every member but those of no group left without an anchor
        if any(sig.active is not None for sig in signals) and self.anchor is None:
            active = merge(
                [
                    torch.ones_like(sig.adv[:, 0], dtype=torch.bool)
                    if sig.active is None
                    else sig.active
                    for sig in signals
                ]
            )
        # 2. μ updates of the clipped surrogate against π_old, with the KL to π_ref
        per_update, ratio, own = [], [], [[] for _ in parts]
        for i in range(cfg.updates):
            logp, logits = step.rows.logprobs(stack, cfg.temperature)
            outs = [
                recipe.loss(sig, i, _take(logp, index), _take(logits, index))
                for (recipe, index, _), sig in zip(parts, signals)
            ]
            loss, s = merge([out[0] for out in outs]), merge([out[1] for out in outs])
            anchor = (
                None
                if self.anchor is None
                else self.anchor.term(stack, ref, [r.anchor for r in step.runs])
            )
            if anchor is not None:
                loss = s["loss"] = loss + anchor
                s["preserve_loss"] = anchor
            if outs[0][2] is not None:
                ratio.append(merge([out[2] for out in outs]))
            opt.zero_grad()
            loss.sum().backward()  # each member's loss reaches only its own slice of the weights
            s["grad_norm"] = clip_grad_norm(
                opt.params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"), per_slice=True
            )
            opt.step(active)
            per_update.append({k: v.detach() for k, v in s.items()})
            # each recipe's figures' names, in its single run's order
            for names, out in zip(own, outs):
                names.append(
                    (
                        [*out[1], *["preserve_loss"] * (anchor is not None), "grad_norm"],
                        [*(out[2] or ())],
                    )
                )
        self.inner = (len(per_update), len(ratio))
        # what a member's row takes, in its run's order
        for (recipe, _, _), sig, names in zip(parts, signals, own):
            recipe.order = [
                *sig.stats,
                *packed([dict.fromkeys(u) for u, _ in names]),
                *packed([dict.fromkeys(r) for _, r in names if r], "ratio"),
            ]
        return {
            **merge([sig.stats for sig in signals]),
            **packed(per_update),
            **packed(ratio, "ratio"),
        }

    def row(self, mine: dict, algo) -> dict:
        """Member p's figures (this update's names, read as floats) -> its row as GRPO.update
        returns it: the step's figures, then its inner updates' combined
        (rl/report.combine_stats)."""
        recipe = self.recipe(algo.cfg)
        if len(self.recipes) > 1:  # its own recipe's figures alone (another's are NaN here)
            mine = {k: mine[k] for k in recipe.order}
        head = {k: v for k, v in mine.items() if isinstance(k, str) and k != "skipped"}
        updates, ratios = self.inner
        inner = unpacked(mine, updates)
        # every group's rewards equal: the anchor's updates alone, as GRPO.preservation_only
        if mine.get("skipped"):
            alone = [
                {k: d[k] for k in ("preserve_loss", "grad_norm")}
                for d in inner
                if "preserve_loss" in d
            ]
            return {
                **{k: head[k] for k in recipe.before if k in head},
                **combine_stats(alone),
                "skipped": 1.0,
            }
        return {**head, **combine_stats(inner), **combine_stats(unpacked(mine, ratios, "ratio"))}


def _take(x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """Members `index`'s slice of x (P, ...), or x itself (index None: every member)."""
    return x if index is None else x.index_select(0, index)


class _Merge:
    """Each recipe's (P_r, ...) tensors (or dicts of them) -> one (P, ...) in the members' order; a
    figure one recipe lacks is NaN for its members. One recipe: its own, as is."""

    def __init__(self, indices: list):
        self.indices, self.whole = indices, indices[0] is None
        if not self.whole:
            order = torch.cat(indices)
            # member p's place among the parts' members, in their order
            self.back = torch.empty_like(order)
            self.back[order] = torch.arange(order.numel(), device=order.device)

    def __call__(self, parts: list):
        if self.whole:
            return parts[0]
        if isinstance(parts[0], dict):
            names = dict.fromkeys(k for part in parts for k in part)
            nan = lambda index: torch.full((index.numel(),), float("nan"), device=index.device)
            return {
                k: self(
                    [
                        part[k] if k in part else nan(index)
                        for part, index in zip(parts, self.indices)
                    ]
                )
                for k in names
            }
        return torch.cat(parts).index_select(0, self.back)
