"""The members' exact evaluations as one forward: every member scores the same (prompt, completion)
pairs, so the first member's forward computes every member's, and the others read theirs.

    shared = SharedForward()
    shared.adopt(model, p)      # member p's GPT computes through the population's stacked weights
    shared.fresh(stack)         # after each update: the weights to compute with; what was computed
                                # is forgotten
    run.evaluate()              # unchanged: the task's rl_evaluate calls model.hidden and
                                # model.head as ever
    evaluate_members(members)   # lockstep's members' evaluations: one rl_evaluate_many for each
                                # reward (and β)
    completion_logprobs_many(models, ...)   # lm/logprobs: every member's scores from the stacked
                                            # logits at once

A call is recognised by its input tensors themselves (the exact evaluation's rows are built once and
kept: lm/logprobs.scoring_batch), held while remembered so that no other tensor can take their place
(a cache-less forward of other inputs is computed for every member alike). A cache's forward, or one
with gradients, is the member's own GPT's, which first takes its weights from the stack (once after
each update: a member's GPT is not kept current otherwise, its checkpoint being made from the
stacks). The figures are the single run's to float rounding.
"""

from __future__ import annotations

import torch

from minigrpo.lm.model import GPT, causal_mask
from minigrpo.population.stacked import Stack


class SharedForward:
    def __init__(self):
        self.stack, self.hidden, self.heads, self.current = None, [], {}, set()

    def adopt(self, model: GPT, p: int) -> None:
        model.__class__, model.shared, model.member = EvalGPT, self, p

    def fresh(self, stack: Stack) -> None:
        self.stack, self.hidden, self.heads, self.current = stack, [], {}, set()

    def own(self, model: "EvalGPT") -> None:
        """Member `model.member`'s weights from the stack into its own GPT, before its own forward
        (once a step)."""
        if self.stack is not None and model.member not in self.current:
            self.stack.copy_to([model], [model.member])
            self.current.add(model.member)

    def hidden_of(self, model: "EvalGPT", inputs: tuple) -> torch.Tensor | None:
        """Member `model.member`'s hidden states for GPT.hidden's (idx, pos, key_mask, attn_mask),
        computed for every member on their first request; None: not for sharing (a cache, no
        stack)."""
        if self.stack is None:
            return None
        for held, views in self.hidden:
            if all(a is b for a, b in zip(held, inputs)):
                return views[model.member]
        idx, pos, key_mask, attn_mask = inputs
        pos, attn_mask = model.inputs(idx, pos, key_mask, None, attn_mask)
        (B, T), P = idx.shape, self.stack.w["wte.weight"].size(0)
        if attn_mask is None:  # plain causal attention
            attn_mask = causal_mask(0, T, torch.ones(B, T, dtype=torch.bool, device=idx.device))
        grow = lambda x: x[None].expand(P, *x.shape)
        with torch.no_grad():
            h = self.stack.hidden(
                grow(idx), grow(pos), grow(attn_mask).reshape(P * B, *attn_mask.shape[1:])
            )
        # the logits: on the first request
        views, forward = list(h.unbind(0)), {"hidden": h, "logits": None}
        self.hidden.append((inputs, views))
        for view in views:
            self.heads[id(view)] = (view, forward)
        return views[model.member]

    def head_of(self, model: "EvalGPT", h: torch.Tensor) -> torch.Tensor | None:
        """Member `model.member`'s logits of hidden states this forward handed out (every member's
        at once)."""
        view, forward = self.heads.get(id(h), (None, None))
        if view is not h:
            return None
        return self._logits(forward)[model.member]

    def logits_of(self, model: "EvalGPT", inputs: tuple) -> torch.Tensor | None:
        """Every member's logits (P, ...) for GPT.hidden's inputs, as hidden_of computes them; None:
        not shared."""
        h = self.hidden_of(model, inputs)
        return None if h is None else self._logits(self.heads[id(h)][1])

    def _logits(self, forward: dict) -> torch.Tensor:
        if forward["logits"] is None:  # on the first request
            with torch.no_grad():
                forward["logits"] = self.stack.head(forward["hidden"])
        return forward["logits"]


class EvalGPT(GPT):
    """A member's GPT whose cache-less forwards go through its population's SharedForward."""

    def hidden(self, idx, pos=None, key_mask=None, cache=None, attn_mask=None):
        h = (
            None
            if cache is not None or torch.is_grad_enabled()
            else self.shared.hidden_of(self, (idx, pos, key_mask, attn_mask))
        )
        if h is None:
            self.shared.own(self)
            return super().hidden(idx, pos, key_mask, cache, attn_mask)
        return h

    def head(self, h):
        logits = self.shared.head_of(self, h)
        if logits is None:
            self.shared.own(self)
            return super().head(h)
        return logits

    def logits_of_all(self, models: list, tree) -> torch.Tensor | None:
        """The logits (M, G, n, V) over a prefix tree's nodes of `models` if they are all this
        population's members (lm/logprobs.completion_logprobs_many), else None."""
        if torch.is_grad_enabled() or any(
            getattr(m, "shared", None) is not self.shared for m in models
        ):
            return None
        # (P, G, n, V)
        logits = self.shared.logits_of(self, (tree.tokens, tree.pos, None, tree.mask))
        if logits is None:
            return None
        members = [m.member for m in models]
        return logits if members == list(range(len(logits))) else logits[members]


def alike(cfg) -> tuple:
    """What of a member's own settings its exact evaluation reads: its reward, β (the frontier's
    figures) and person (whose target and whose drift)."""
    return cfg.reward, getattr(cfg, "beta", None), cfg.person


def evaluate_members(members: list) -> dict:
    """The exact evaluations of lockstep's members (each with its .run), as one for each reward (and
    β, person: alike) where the task can (its rl_evaluate_many, whose forward is SharedForward's) ->
    {id(member): its evaluation}."""
    groups: dict[tuple, list] = {}
    for m in members:
        groups.setdefault(alike(m.run.cfg), []).append(m)
    out = {}
    for group in groups.values():
        r, models = group[0].run, [m.run.policy for m in group]
        # optional (toy_tasks/contract.py): else each model's own
        many = getattr(r.task, "rl_evaluate_many", None)
        try:
            evs = (
                many(models, r.tok, r.baseline, r.cfg, r.rewards)
                if many
                else [m.run.exact_evaluation() for m in group]
            )
        # one member's figures cannot be made: each member evaluates itself (and it fails alone)
        except ValueError:
            continue
        out.update((id(m), ev) for m, ev in zip(group, evs))
    return out
