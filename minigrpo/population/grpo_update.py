"""GRPO's update for P members at once: the single run's own stages (grpo.GRPO.signal and .terms in
variants/inner_updates.inner_updates) over a leading member dim, one forward, backward and
optimiser step for all; each member's figures its single run's (tests/test_lockstep.py).

    update = LockstepGRPO(cfg, anchor, algos)  # anchor: population/anchor.py; algos: each GRPO
    figures = update(stack, ref, opt, step)    # step: population/rows.Rollouts -> {name: (P,)}
    row = update.row(mine, algo)               # member p's figures (floats) -> its metrics row

Here only what is about many members: DAPO's filter as masks, and members of several recipes
(RECIPE: compare's presets of one μ), each recipe's stages over its members' slice.
"""

from __future__ import annotations

from dataclasses import fields, replace

import torch
import torch.nn.functional as F
from torch.func import vmap

from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.lm.optim import AdamW
from minigrpo.population.anchor import MembersAnchor
from minigrpo.population.rows import Rollouts
from minigrpo.population.stacked import Stack
from minigrpo.rl.report import packed, unpacked
from minigrpo.rl.run_state import clip_and_step
from minigrpo.variants.advantages import AdvantageFlags
from minigrpo.variants.entropy import EntropyFlags
from minigrpo.variants.inner_updates import inner_updates, row
from minigrpo.variants.policy_losses import PolicyLossFlags

# the settings of a member's recipe (its update's own; --rollout-kl, --is-correction and the sampler
# are the run's)
RECIPE = (
    *(f.name for flags in (PolicyLossFlags, AdvantageFlags, EntropyFlags) for f in fields(flags)),
    "kl",
    "kl_in",
    "beta",
    "loss_agg",
    "preset",
)


def recipe_of(cfg) -> tuple:
    """What members of one recipe share: every RECIPE setting but the preset's name."""
    return tuple(getattr(cfg, k) for k in RECIPE if k != "preset")


class Members:
    """One recipe's members, what GRPO's stages map over (variants/inner_updates.Alone's API)."""

    def __init__(self, step: Rollouts):
        self.algos, self.T, self.device = step.algos, step.mask.size(-1), step.rewards.device
        # a failed member's slot: another's rows and outputs, its update not kept
        self.failed = {p for p, b in enumerate(step.batches) if b is None}
        self.some = next(p for p in range(len(step.batches)) if p not in self.failed)
        self.batch = [b or step.batches[self.some] for b in step.batches]
        self.active = None  # who steps: every member, or those with a group left (`keep`)
        self.kept = torch.ones_like(step.rewards, dtype=torch.bool)  # its forward's rows (`keep`)
        # each member's completion width alone (the batch samples on until all rows have ended)
        self.widths = step.mask.sum(-1).amax(-1).tolist()

    def each(self, fn, *args):
        """fn(member p's GRPO, its slice of each tensor or list argument, a (P, N, T, ...) one at
        its own width as its run has it: Clip-Cov draws for its shape, its sums round as its own),
        member by member -> its outputs stacked (numbers as tensors, other objects as a list)."""

        def pick(x, p):
            if isinstance(x, torch.Tensor) and x.dim() > 2 and x.size(2) == self.T:
                return x[p, :, : self.widths[p]]
            return x[p] if isinstance(x, (torch.Tensor, list)) else x

        call = lambda p: fn(self.algos[p], *(pick(x, p) for x in args))
        outs = {p: call(p) for p in range(len(self.algos)) if p not in self.failed}
        outs = [outs.get(p, outs[self.some]) for p in range(len(self.algos))]
        return _stacked(outs, self.device, self.T, self.failed)

    def map(self, fn, *args):
        """A pure fn of one member's tensors, mapped over their leading dim (None: not mapped)."""
        return vmap(fn, in_dims=tuple(None if a is None else 0 for a in args))(*args)

    @property
    def sampler_logp(self) -> list:
        """Each member's π_sampler log-probs (its Generation's) at its own width (`each`)."""
        return [b.sampler_logp[:, :w] for b, w in zip(self.batch, self.widths)]

    def keep(self, sig, keep: torch.Tensor) -> None:
        """DAPO's filter (keep (P, N) bool): the dropped rows' tokens masked, a mean over sequences
        scaled by N / (the rows kept) (sig.drop); a member with no group left takes the anchor's
        updates alone, or none without an anchor (`active`)."""
        sig.mask = sig.mask & keep[..., None]
        sig.drop = keep.size(-1) / keep.sum(-1).clamp(min=1)
        self.active = keep.any(-1)
        # the forward's rows: its kept rows alone (its prefix tree, so its gradients' sums, its
        # single run's), every row where none is left (its loss is 0 then)
        self.kept = keep | ~self.active[:, None]


def _stacked(outs: list, device, T: int, failed: set):
    """Members' outputs of one kind, stacked: tensors (N, T_p, ...) padded to width T (detached in
    a failed member's slot, another's output: no gradient reaches it), numbers, tuples and dicts
    of them; None."""
    first = outs[0]
    if first is None:
        return None
    if isinstance(first, tuple):
        return tuple(_stacked(list(x), device, T, failed) for x in zip(*outs))
    if isinstance(first, dict):
        return {k: _stacked([o[k] for o in outs], device, T, failed) for k in first}
    if isinstance(first, torch.Tensor):
        pad = lambda o: F.pad(o, (0, 0) * (o.dim() - 2) + (0, T - o.size(1))) if o.dim() > 1 else o
        return torch.stack([pad(o.detach() if p in failed else o) for p, o in enumerate(outs)])
    return torch.tensor(outs, device=device) if isinstance(first, (int, float)) else outs


class LockstepGRPO:
    def __init__(self, cfg, anchor: MembersAnchor | None, algos: list):
        self.cfg, self.anchor = cfg, anchor
        self.stacks = []  # nothing to train but the policy (a critic's weights: ppo_update.py)
        self.needs_ref = any(a.needs_ref for a in algos)  # what the caller computes first
        self.needs_old_logp = any(a.needs_old_logp for a in algos)

    def host_state(self, algo, copies, p: int) -> dict:
        """Member p's GRPO.state_dict: its own, but for a stale sampler's record (the members':
        lockstep.Population.adopt), of which it takes its slices."""
        state = algo.state_dict()
        if "sampler" in state:
            each = state["sampler"]["states"]
            state["sampler"] = {"states": [{k: w[p].clone() for k, w in s.items()} for s in each]}
        return state

    def parts(self, step: Rollouts) -> list:
        """[(a recipe's first member's GRPO, its members' places (P_r,), None: all; their step)]"""
        places: dict = {}
        for p, r in enumerate(step.runs):
            places.setdefault(recipe_of(r.cfg), []).append(p)
        if len(places) == 1:
            return [(step.algos[0], None, step)]
        parts = []
        for at in places.values():
            algo, index = step.algos[at[0]], torch.tensor(at, device=step.rewards.device)
            parts.append(
                (algo, index, step.members(at, index, algo.needs_ref, algo.needs_old_logp))
            )
        return parts

    def __call__(self, stack: Stack, ref: Stack, opt: AdamW, step: Rollouts) -> dict:
        cfg, parts = self.cfg, self.parts(step)
        members = [Members(mine) for _, _, mine in parts]
        signals = [algo.signal(mine, m) for (algo, _, mine), m in zip(parts, members)]
        merge = _merger([index for _, index, _ in parts])
        active = None  # who updates: every member but those of no group left without an anchor
        if any(m.active is not None for m in members) and self.anchor is None:
            every = lambda m: torch.ones(len(m.algos), dtype=torch.bool, device=m.device)
            active = merge([every(m) if m.active is None else m.active for m in members])
        names = [([], []) for _ in parts]  # each recipe's figures' names, in its single run's order

        def terms(i: int, logp: torch.Tensor, logits: torch.Tensor) -> tuple:
            part = lambda x, index: x if index is None else x.index_select(0, index)  # its members'
            outs = [
                algo.terms(sig, i, part(logp, index), part(logits, index))
                for (algo, index, _), sig in zip(parts, signals)
            ]
            for j, (_, s, ratio) in enumerate(outs):
                names[j] = ([*s], [*ratio] if ratio else names[j][1])
            ratio = merge([out[2] for out in outs]) if outs[0][2] else None
            return merge([out[0] for out in outs]), merge([out[1] for out in outs]), ratio

        anchors, rows = [r.anchor for r in step.runs], step.gen
        if any(m.active is not None for m in members):  # DAPO's filter: the rows each one keeps
            mask = lambda x, kept=merge([m.kept for m in members]): x & kept[..., None]
            rows = replace(
                rows, key_mask=mask(rows.key_mask), completion_mask=mask(rows.completion_mask)
            )
        per_update, ratios = inner_updates(
            cfg.updates,
            lambda: generation_logprobs(stack, rows, cfg.temperature, True),
            terms,
            lambda: None if self.anchor is None else self.anchor.term(stack, ref, anchors),
            lambda loss: clip_and_step(opt, loss, opt.params, cfg.grad_clip, 0, active),
        )
        self.inner = (len(per_update), len(ratios))
        # what a member's row takes, in its run's order
        extra, self.own = [*["preserve_loss"] * (self.anchor is not None), "grad_norm"], {}
        for (algo, _, _), sig, (own, ratio) in zip(parts, signals, names):
            self.own[recipe_of(algo.cfg)] = (
                sig.before,
                [
                    *sig.stats,
                    *packed([dict.fromkeys([*own, *extra])] * len(per_update)),
                    *packed([dict.fromkeys(ratio)] * len(ratios), "ratio"),
                ],
            )
        return {
            **merge([sig.stats for sig in signals]),
            **packed(per_update),
            **packed(ratios, "ratio"),
        }

    def row(self, mine: dict, algo) -> dict:
        """Member p's figures (floats) -> its row as GRPO.update returns it (inner_updates.row)."""
        before, order = self.own[recipe_of(algo.cfg)]
        if len(self.own) > 1:  # its own recipe's figures alone (another's are NaN here)
            mine = {k: mine[k] for k in order}
        updates, ratios = self.inner
        stats = {k: v for k, v in mine.items() if isinstance(k, str)}
        return row(stats, before, unpacked(mine, updates), unpacked(mine, ratios, "ratio"))


def _merger(indices: list):
    """-> merge(parts): each recipe's (P_r, ...) tensors (or dicts of them), its members' places
    `indices` (None: one recipe, every member) -> one (P, ...) in the members' order; a figure one
    recipe lacks is NaN for its members. The inverse order is found once, for the step's merges."""
    if indices[0] is None:
        return lambda parts: parts[0]
    back = torch.argsort(torch.cat(indices))  # member p's place among the parts' members
    nan = lambda at: torch.full((len(at),), float("nan"), device=at.device)

    def merge(parts: list):
        if isinstance(parts[0], dict):
            names = dict.fromkeys(k for part in parts for k in part)
            each = lambda k: [part[k] if k in part else nan(at) for part, at in zip(parts, indices)]
            return {k: merge(each(k)) for k in names}
        return torch.cat(parts)[back]

    return merge
