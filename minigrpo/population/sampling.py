"""Sampling for many members at once: one prefill and one decoding step per token for every member's
rows, through one KV cache (stacked.Stack), each member drawing from its own generator.

    gens = generate_all(models, requests)      # requests[p]: what models[p]'s own generate() call
                                               # was given
    gens = generate_all(None, requests, stack)  # the members' weights already stacked
                                                # (population/lockstep.py)

A member's Generation is the one `lm.sampling.generate(models[p], *requests[p])` returns
(tests/test_population.py): its prompts keep their own left padding (the batch pads them further on
the left, which position ids ignore), and its draws are lm/sampling.Draws, the single sampler's own
bookkeeping: from its own generator, exactly as often as alone (a member whose rows have all ended
draws no more), stopping where it would alone. A member whose probabilities are not finite gets its
ValueError; the others are untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from minigrpo.lm.model import causal_mask, positions
from minigrpo.lm.sampling import (
    NON_FINITE,
    Draws,
    Generation,
    encode_prompts,
    noise_ahead,
    process_logits,
)
from minigrpo.lm.tokenizer import PAD_ID
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
    # the longest row's real prompt tokens, if known (lm/sampling.Draws)
    prompt_len: int | None = None


class PromptTable:
    """Every member's step prompts encoded at once from the run's prompts encoded once: member p's
    (ids, key_mask) are lm/sampling.encode_prompts(tok, rows_p) (its rows left-padded to its own
    widest), views of one gather.

        table = PromptTable(tok, run.prompts, device)
        encoded = table.encode([rows_0, rows_1, ...])   # each member's rows (prompts of the table)
                                                        # -> [(ids, mask)]

    A member's ids are as wide as its longest prompt: its Request's prompt_len is ids.size(1).
    """

    def __init__(self, tok, prompts: list[str], device):
        self.ids, self.key_mask = encode_prompts(tok, prompts, device)  # (K, W)
        self.index = {x: i for i, x in enumerate(prompts)}
        # each prompt's real tokens, BOS included
        self.width = dict(zip(prompts, self.key_mask.sum(1).tolist()))

    def encode(self, rows: list[list[str]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # (P, N)
        pick = torch.tensor([[self.index[x] for x in r] for r in rows]).to(self.ids.device)
        ids, key_mask, W = self.ids[pick], self.key_mask[pick], self.ids.size(1)
        cut = [W - max(self.width[x] for x in r) for r in rows]
        return [(ids[p, :, c:], key_mask[p, :, c:]) for p, c in enumerate(cut)]


def generate_all(
    models: list | None, requests: list[Request], stack: Stack | None = None
) -> list[Generation | Exception]:
    """Every member's generate() in one batch -> its Generation, or the exception its own call would
    raise. `stack`: the members' weights (then `models` is not used)."""
    # as lm/sampling.generate: sampled in inference mode, returned as ordinary copies
    with torch.inference_mode():
        out = _generate_all(models, requests, stack)
    # copied once for all members, each member's Generation views of the copy
    if isinstance(out, StackedDraws):
        return out.generations()
    return [g.clone() if isinstance(g, Generation) else g for g in out]


def _generate_all(models: list | None, requests: list[Request], stack: Stack | None):
    """-> each member's Generation or exception, or the StackedDraws of members alike (its
    `generations()`)."""
    members: list[Draws | Exception] = []
    block_size = (stack or models[0]).cfg.block_size
    for r in requests:
        try:
            members.append(
                Draws(
                    r.prompt_ids,
                    r.prompt_mask,
                    r.max_new_tokens,
                    r.temperature,
                    r.top_k,
                    r.top_p,
                    r.generator,
                    block_size,
                    r.prompt_len,
                    allocate=False,
                )
            )
        except ValueError as e:
            members.append(e)
    live = [i for i, m in enumerate(members) if isinstance(m, Draws)]
    if not live:
        return members
    if stack is None:
        stack = Stack([models[i] for i in live])
    elif len(live) < len(members):
        stack = stack.rows(live)
    P, B = len(live), max(members[i].prompt_ids.size(0) for i in live)
    width, n_max = (
        max(members[i].prompt_ids.size(1) for i in live),
        max(members[i].n_max for i in live),
    )
    device = requests[live[0]].prompt_ids.device
    ids = torch.full((P, B, width), PAD_ID, dtype=torch.long, device=device)
    # padding rows: no real key
    key_mask = torch.zeros((P, B, width + n_max), dtype=torch.bool, device=device)
    shapes: dict[tuple, list[int]] = {}  # members of one prompt shape are copied in as one
    for j, i in enumerate(live):
        shapes.setdefault(tuple(members[i].prompt_ids.shape), []).append(j)
    # each member's prompts, right-aligned: the batch pads them further on the left
    for (b, w), js in shapes.items():
        at = torch.tensor(js, device=device)
        ids[at, :b, width - w :] = torch.stack([members[live[j]].prompt_ids for j in js])
        key_mask[at, :b, width - w : width] = torch.stack(
            [members[live[j]].prompt_mask for j in js]
        )
        key_mask[at, :b, width:] = True
    key_mask = key_mask.view(P * B, -1)
    # a member whose prompt leaves it fewer new tokens than the others has stopped before its
    # positions pass the block
    pos = positions(key_mask).view(P, B, -1).clamp(max=block_size - 1)
    cache = stack.new_cache(P * B, width + n_max)
    h = stack.hidden(ids, pos[:, :, :width], causal_mask(0, width, key_mask, device), cache)
    logits = stack.head(h[:, :, -1:])[:, :, 0]  # (P, B, V)
    draws = [members[i] for i in live]
    # one draw for all, else each its own
    alike = StackedDraws(members) if StackedDraws.fits(members) else None
    if alike is None:
        for d in draws:
            d.allocate()
    going = set(range(P))
    for n in range(n_max):
        if alike is not None:
            going, nxt = alike.take(logits, going), alike.tokens[:, :, n]
        else:
            nxt = torch.full((P, B), PAD_ID, dtype=torch.long, device=device)
            for j in sorted(going):
                m = draws[j]
                if not m.take(logits[j, : m.tokens.size(0)]):
                    going.discard(j)
                nxt[j, : m.tokens.size(0)] = m.tokens[:, n]
        if not going:
            break
        t = width + n  # the slot the new tokens fill
        h = stack.hidden(
            nxt[:, :, None],
            pos[:, :, t : t + 1],
            causal_mask(t, 1, key_mask[:, : t + 1], device),
            cache,
        )
        logits = stack.head(h)[:, :, 0]
    if alike is not None:
        return alike
    out: list[Generation | Exception] = []
    for m in members:
        try:
            out.append(m if isinstance(m, Exception) else m.generation())
        except ValueError as e:
            out.append(e)
    return out


def read_completions(tok, gens: list) -> list:
    """Each member's completion texts and finished flags (lm/sampling.decode_completions',
    gen.finished's), every member's read back in one go, and each distinct row decoded once: rows
    repeat (a group's samples, a policy that has settled), and a row's Python decode costs more than
    its bytes' lookup; None for a member whose sampling failed."""
    ok = [g for g in gens if isinstance(g, Generation)]
    if not ok:
        return [None] * len(gens)
    # a member's rows padded on the right: decode drops PAD
    T = max(g.completion_ids.size(1) for g in ok)
    ids = torch.cat(
        [
            g.completion_ids
            if g.completion_ids.size(1) == T
            else F.pad(g.completion_ids, (0, T - g.completion_ids.size(1)), value=PAD_ID)
            for g in ok
        ]
    )
    # (R, T + 1)
    rows = torch.cat([ids, torch.cat([g.finished for g in ok])[:, None].long()], 1).cpu().numpy()
    flat, width = rows.tobytes(), rows.itemsize * rows.shape[1]
    keys = [flat[i : i + width] for i in range(0, len(flat), width)]  # each row's bytes
    read = {}
    for k in set(keys):
        *row, finished = np.frombuffer(k, rows.dtype).tolist()
        read[k] = (tok.decode(row), bool(finished))
    out, start = [], 0
    for g in gens:
        if not isinstance(g, Generation):
            out.append(None)
            continue
        mine, start = [read[k] for k in keys[start : start + g.ids.size(0)]], start + g.ids.size(0)
        out.append(([text for text, _ in mine], [finished for _, finished in mine]))
    return out


class LateRead:
    """A flag on the device read one call late: each call starts copying its flag to the host and
    returns the one before it (False at first). On a GPU the host then never waits for the kernels
    it has just queued, and those keep the device busy while it waits for the flag before; the price
    is one call more than needed."""

    def __init__(self):
        # the last flag's host copy and, on a GPU, the event of its arrival
        self.pending: tuple | None = None

    def read(self, flag: torch.Tensor) -> bool:
        host, event = (
            flag.to("cpu", non_blocking=True),
            torch.cuda.Event() if flag.is_cuda else None,
        )
        if event is not None:
            event.record()
        before, self.pending = self.pending, (host, event)
        if before is not None and before[1] is not None:
            before[1].synchronize()
        return before is not None and bool(before[0])


class StackedDraws:
    """The lm/sampling.Draws of P members with the same number of rows, prompt width and plain
    sampling (temperature only), drawn as one: the sampling distribution, the race and the
    bookkeeping over (P, B, V) at once, and each member's exponential noise from its own generator,
    exactly as often as its own Draws draws it (a member whose rows have all ended, or that reached
    its n_max, draws no more; on a GPU all of it at the first token). `generations()`: each member's
    Generation, the one its own Draws would give."""

    record = Draws.record  # a single run's bookkeeping of a draw, over (P, B) rows

    def __init__(self, draws: list[Draws]):
        self.draws = draws
        first = draws[0].prompt_ids
        self.tokens, self.logprobs, self.completion_mask, self.done = Draws.fresh(
            (len(draws), first.size(0)), draws[0].n_max, first.device
        )  # (P, B, n_max); done (P, B)
        self.n, self.ahead, self.late = 0, draws[0].ahead, LateRead()  # n: the tokens drawn so far

    @staticmethod
    def fits(members: list) -> bool:
        """Every member a Draws (none refused at the start), of one shape and one plain sampling."""
        if not all(isinstance(d, Draws) for d in members):
            return False
        settings = {(d.n_max, d.prompt_ids.shape, d.settings[:3]) for d in members}
        return len(settings) == 1 and next(iter(settings))[2][1:] == (None, None)

    def take(self, logits: torch.Tensor, going: set[int]) -> set[int]:
        """Draws.take for the members in `going` from logits (P, B, V) -> the members that go on."""
        n, temperature = self.n, self.draws[0].settings[0]
        logp_all = F.log_softmax(process_logits(logits, temperature), -1)  # (P, B, V)
        probs = logp_all.exp()
        # on a GPU each member's noise of the call, drawn at its first token
        # (lm/sampling.NOISE_AHEAD)
        if self.ahead:
            if n == 0:
                # (P, n_max, B, V)
                self.noise = torch.stack([noise_ahead(d, probs.shape[1:]) for d in self.draws])
            noise = self.noise[:, n]
        else:
            noise = torch.ones_like(probs)  # a member that has ended draws nothing
            rows = noise.unbind(0)
            # each member's (B, V) from its own generator, as its own Draws draws them
            for p in going:
                rows[p].exponential_(generator=self.draws[p].settings[3])
        nxt = (probs / noise).argmax(-1)  # (P, B): lm/sampling.exponential_race of each member
        self.record(n, nxt, logp_all.gather(-1, nxt[..., None])[..., 0])
        self.n = n + 1
        if self.n == self.draws[0].n_max:  # one n_max for all (`fits`)
            return set()
        # no noise to spare as rows end: every member goes on until all have ended, read a token
        # late
        if self.ahead:
            return set() if self.late.read(self.done.all()) else going
        ended = self.done.all(-1).tolist()
        return {p for p in going if not ended[p]}

    def generations(self) -> list[Generation | ValueError]:
        """Each member's Draws.generation(): its prompt, its first `steps` draws, or its ValueError
        where its log-probs are not finite. Called outside inference mode: the stacked tensors are
        copied once, and each member's Generation holds views of the copy (what lm/sampling.generate
        returns: ordinary tensors)."""
        N = self.n
        cut = lambda x: x[:, :, :N].clone()
        tokens, logprobs, completion_mask, done = (
            cut(self.tokens),
            cut(self.logprobs),
            cut(self.completion_mask),
            self.done.clone(),
        )
        # one read: whether each member's log-probs are finite (past its steps: zeros), and its
        # steps, where its own
        # Draws stops: its longest row's tokens, up to and including the EOS (n_max where a row did
        # not end)
        finite, steps = torch.stack(
            [torch.isfinite(logprobs).flatten(1).all(1).long(), completion_mask.sum(-1).amax(-1)]
        ).tolist()
        prompt_ids = torch.stack([d.prompt_ids for d in self.draws])
        prompt_mask = torch.stack([d.prompt_mask for d in self.draws])
        W = prompt_ids.size(-1)
        ids, key_mask = (
            torch.cat([prompt_ids, tokens], -1).unbind(0),
            torch.cat([prompt_mask, completion_mask], -1).unbind(0),
        )
        out = []
        for p, (n, ok) in enumerate(zip(steps, finite)):
            out.append(
                Generation(
                    ids[p][:, : W + n],
                    key_mask[p][:, : W + n],
                    W,
                    completion_mask[p][:, :n],
                    logprobs[p][:, :n],
                    done[p],
                )
                if ok
                else ValueError(NON_FINITE)
            )
        return out
