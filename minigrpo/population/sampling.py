"""Sampling for many members at once: one prefill and one decoding step per token for every member's rows,
through one KV cache (stacked.Stack), each member drawing from its own generator.

    gens = generate_all(models, requests)      # requests[p]: what models[p]'s own generate() call was given

A member's Generation is the one `lm.sampling.generate(models[p], *requests[p])` returns (tests/test_population.py):
its prompts keep their own left padding (the batch pads them further on the left, which position ids ignore), it
draws with `draw_next` from its own generator exactly as often as alone (a member whose rows have all ended draws
no more), and it stops where it would alone. A member whose probabilities are not finite gets its ValueError;
the others are untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minigrpo.lm.model import causal_mask, positions
from minigrpo.lm.sampling import Generation, draw_next
from minigrpo.lm.tokenizer import EOS_ID, PAD_ID
from minigrpo.population.stacked import Stack


@dataclass
class Request:
    """One member's generate() arguments (lm/sampling.generate)."""
    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor | None  # (B, P) bool, None = all real
    max_new_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    generator: torch.Generator | None


class _Member:
    """One member's draws so far: its tokens, log-probs and masks, as lm/sampling._generate keeps them."""

    def __init__(self, req: Request, block_size: int):
        if req.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {req.temperature}")
        self.req, (B, P) = req, req.prompt_ids.shape
        self.mask = torch.ones_like(req.prompt_ids, dtype=torch.bool) if req.prompt_mask is None else req.prompt_mask
        self.n_max = min(req.max_new_tokens, block_size - int(self.mask.sum(1).max()))
        if self.n_max < 1:
            raise ValueError(f"prompt of {P} tokens leaves no room in block_size {block_size}")
        device = req.prompt_ids.device
        self.tokens = torch.full((B, self.n_max), PAD_ID, dtype=torch.long, device=device)
        self.logprobs = torch.zeros((B, self.n_max), device=device)
        self.completion_mask = torch.zeros((B, self.n_max), dtype=torch.bool, device=device)
        self.done = torch.zeros(B, dtype=torch.bool, device=device)
        self.steps = 0  # tokens drawn per row; the member ends at n_max or when every row has ended

    def take(self, logits: torch.Tensor) -> bool:
        """Draw token `steps` of every row from logits (B, V); -> whether the member goes on."""
        r, n = self.req, self.steps
        self.tokens[:, n], self.logprobs[:, n] = draw_next(logits, self.done, r.temperature, r.top_k, r.top_p,
                                                           r.generator)
        self.completion_mask[:, n] = ~self.done
        self.done = self.done | (self.tokens[:, n] == EOS_ID)
        self.steps = n + 1
        return not (bool(self.done.all()) or self.steps == self.n_max)

    def generation(self) -> Generation:
        N = self.steps
        if not bool(torch.isfinite(self.logprobs[:, :N]).all()):
            raise ValueError("sampling met non-finite probabilities: the model's weights hold NaN or inf")
        r = self.req
        return Generation(ids=torch.cat([r.prompt_ids, self.tokens[:, :N]], 1),
                          key_mask=torch.cat([self.mask, self.completion_mask[:, :N]], 1),
                          prompt_len=r.prompt_ids.size(1), completion_mask=self.completion_mask[:, :N],
                          logprobs=self.logprobs[:, :N], finished=self.done)


def generate_all(models: list, requests: list[Request]) -> list[Generation | Exception]:
    """Every member's generate() in one batch -> its Generation, or the exception its own call would raise."""
    with torch.inference_mode():  # as lm/sampling.generate: sampled in inference mode, returned as ordinary copies
        out = _generate_all(models, requests)
    return [g.clone() if isinstance(g, Generation) else g for g in out]


def _generate_all(models: list, requests: list[Request]) -> list[Generation | Exception]:
    members: list[_Member | Exception] = []
    for req in requests:
        try:
            members.append(_Member(req, models[0].cfg.block_size))
        except ValueError as e:
            members.append(e)
    live = [i for i, m in enumerate(members) if isinstance(m, _Member)]
    if not live:
        return members
    stack = Stack([models[i] for i in live])
    P, B = len(live), max(members[i].req.prompt_ids.size(0) for i in live)
    width, n_max = max(members[i].req.prompt_ids.size(1) for i in live), max(members[i].n_max for i in live)
    device = requests[live[0]].prompt_ids.device
    ids = torch.full((P, B, width), PAD_ID, dtype=torch.long, device=device)
    key_mask = torch.zeros((P, B, width + n_max), dtype=torch.bool, device=device)  # padding rows: no real key
    for j, i in enumerate(live):  # each member's prompts, right-aligned: the batch pads them further on the left
        m = members[i]
        b, w = m.req.prompt_ids.shape
        ids[j, :b, width - w:], key_mask[j, :b, width - w:width], key_mask[j, :b, width:] = m.req.prompt_ids, m.mask, 1
    key_mask = key_mask.view(P * B, -1)
    pos = positions(key_mask).view(P, B, -1)
    cache = stack.new_cache(P * B, width + n_max)
    h = stack.hidden(ids, pos[:, :, :width], causal_mask(0, width, key_mask, device), cache)
    logits = stack.head(h[:, :, -1:])[:, :, 0]  # (P, B, V)
    going = set(range(P))
    for n in range(n_max):
        nxt = torch.full((P, B), PAD_ID, dtype=torch.long, device=device)
        for j in sorted(going):
            m = members[live[j]]
            if not m.take(logits[j, : m.tokens.size(0)]):
                going.discard(j)
            nxt[j, : m.tokens.size(0)] = m.tokens[:, n]
        if not going:
            break
        t = width + n  # the slot the new tokens fill
        h = stack.hidden(nxt[:, :, None], pos[:, :, t:t + 1], causal_mask(t, 1, key_mask[:, :t + 1], device), cache)
        logits = stack.head(h)[:, :, 0]
    out: list[Generation | Exception] = []
    for m in members:
        try:
            out.append(m if isinstance(m, Exception) else m.generation())
        except ValueError as e:
            out.append(e)
    return out
