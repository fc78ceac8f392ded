"""What a sampler draws and keeps (lm/sampling.py runs the loop): the sampling distribution
(`process_logits`), one draw (`exponential_race`), the bookkeeping of P members' draws, each from
its own generator (`Draws`), and what a call returns (`Generation`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from minigrpo.lm.prefix_tree import PrefixTree, next_token_tree
from minigrpo.lm.tokenizer import EOS_ID, PAD_ID

NON_FINITE = "sampling met non-finite probabilities: the model's weights hold NaN or inf"

GENERATION_FIELDS = ("ids", "key_mask", "prompt_len", "completion_mask", "logprobs", "finished")


@dataclass
class Generation:
    """Sampled rows; every tensor may lead with more dims (..., B, ...): P members' rows, each
    member's own (their logprobs and finished then None: its own Generation's)."""

    ids: torch.Tensor  # (B, P+N) left-padded prompt, then completion (PAD after the first EOS)
    key_mask: torch.Tensor  # (B, P+N) bool: real prompt tokens and completion tokens
    prompt_len: int  # P, the padded prompt width
    # (B, N) bool: completion tokens up to and including the first EOS
    completion_mask: torch.Tensor
    # (B, N) log-prob of each sampled token under the sampling distribution (0 where masked)
    logprobs: torch.Tensor | None
    finished: torch.Tensor | None  # (B,) bool: the row produced an EOS
    _tree: PrefixTree | None = field(default=None, init=False, repr=False, compare=False)

    def prefix_tree(self) -> PrefixTree:
        """The tree of the distinct prefixes the next-token forward needs (prefix_tree.py), built on
        first use and kept: every forward over these rows (π_ref, π_old, each update, the trust
        region) shares it. A Generation's tensors are never changed in place."""
        if self._tree is None:
            self._tree = next_token_tree(self.ids, self.key_mask)
        return self._tree

    @property
    def completion_ids(self) -> torch.Tensor:  # (B, N)
        return self.ids[..., self.prompt_len :]

    def to_dict(self) -> dict:
        """The fields by name (what checkpoints store: tensors and the prompt width)."""
        return {f: getattr(self, f) for f in GENERATION_FIELDS}

    @classmethod
    def from_dict(cls, d: dict) -> "Generation":
        return cls(*(d[f] for f in GENERATION_FIELDS))

    def select(self, rows: torch.Tensor) -> "Generation":
        """The rows `rows` (..., n) of each leading slice of every per-row tensor (`take`)."""
        return self.map(lambda x: take(x, rows))

    def map(self, fn) -> "Generation":
        """fn(tensor) of every per-row tensor (None stays None), the prompt width kept."""
        f = lambda k, v: v if v is None or k == "prompt_len" else fn(v)
        return Generation.from_dict({k: f(k, v) for k, v in self.to_dict().items()})


def take(x: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    """x (..., N, ...) -> (..., n, ...): the rows `rows` (..., n) of each leading slice, in order
    (x[rows] with no leading dims; with them, each leading slice its own rows). None -> None."""
    if x is None:
        return None
    at = rows.dim() - 1
    index = rows.view(*rows.shape, *[1] * (x.dim() - rows.dim()))
    return x.gather(at, index.expand(*rows.shape, *x.shape[at + 1 :]))


def process_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """(..., V) logits -> (..., V) logits of the sampling distribution (filtered entries -inf)."""
    logits = logits.float() if temperature == 1.0 else logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (..., 1) k-th largest
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # keep the smallest prefix reaching top_p
        drop_sorted = cum - sorted_logits.softmax(-1) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def exponential_race(
    probs: torch.Tensor, generator: torch.Generator | None = None, noise: torch.Tensor | None = None
) -> torch.Tensor:
    """One draw per row of (..., V) probabilities: argmax_i p_i / E_i with E_i ~ Exp(1) i.i.d. The
    race is exact: E_i / p_i ~ Exp(p_i), and the smallest of independent exponentials is i with
    probability p_i / Σ_j p_j. It is how torch.multinomial(probs, 1) draws one sample (same
    generator calls, same draws: tests/test_sampling.py), minus that function's input checks (two
    reductions and a sync: about half its time on a few rows; generate checks its log-probs once
    instead). `noise`: the E already drawn (Draws.noise). -> (...) long."""
    if noise is None:
        noise = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / noise).argmax(-1)


class LateRead:
    """A flag on the device read one call late: each call starts copying its flag to the host and
    returns the one before it (False at first). On a GPU the host then never waits for the kernels
    it has just queued; the price is one call more than needed."""

    def __init__(self):
        self.pending: tuple | None = None  # the last flag's host copy and, on a GPU, its event

    def read(self, flag: torch.Tensor) -> bool:
        host, event = flag.to("cpu", non_blocking=True), None
        if flag.is_cuda:
            event = torch.cuda.Event()
            event.record()
        before, self.pending = self.pending, (host, event)
        if before is not None and before[1] is not None:
            before[1].synchronize()
        return before is not None and bool(before[0])


class Draws:
    """P members' draws so far over rows (P, B): each row's new tokens, their log-probs under its
    member's sampling distribution, which are real (up to and including the row's first EOS), all
    (n_max, P, B) (token n: [n]), which rows have ended (P, B) (padding rows from the start), and
    the members still going.

        d = Draws(requests, n_max, real, refused, ahead)
        while d.take(logits):   # logits (P, B, V) of each row's next token -> draw it; False
            ...                 # once every member stopped; next: after d.tokens[d.steps - 1]
        gens = d.generations(prompt_ids, prompt_mask)

    Every row of a going member draws at every step, ended or not, so a generator's stream depends
    only on the member's rows and steps."""

    def __init__(self, requests: list, n_max: list[int], real: torch.Tensor, refused, ahead: bool):
        """requests: each member's lm/sampling.Request; n_max: its most new tokens (0: refused, its
        ValueError in `refused`); real (P, B) bool: the members' own rows (the others pad the
        batch); ahead: each member draws its call's noise at its first token (NOISE_AHEAD)."""
        (P, B), N, device = real.shape, max(n_max), real.device
        self.requests, self.n_max, self.refused, self.steps = requests, n_max, refused, 0
        self.tokens = torch.full((N, P, B), PAD_ID, dtype=torch.long, device=device)
        self.logprobs = torch.zeros((N, P, B), device=device)
        self.completion_mask = torch.zeros((N, P, B), dtype=torch.bool, device=device)
        self.done, self.halted = ~real, None  # halted (P, 1): stopped at n_max while others go on
        self.going = [p for p, n in enumerate(n_max) if n]
        # every member's noise fills its slot of the batch (else 1 where none is drawn)
        self.rows = [r.prompt_ids.size(0) for r in requests]
        self.whole = not refused and min(self.rows) == B
        self.ahead, self.late = ahead, LateRead()
        settings = {(r.temperature, r.top_k, r.top_p) for r, n in zip(requests, n_max) if n}
        self.alike = settings.pop() if len(settings) == 1 else None

    def take(self, logits: torch.Tensor) -> bool:
        """Draw token `steps` of every row from logits (P, B, V) (PAD, log-prob 0 where the row has
        ended or its member stopped); -> whether another step follows."""
        if self.alike is not None:
            logits = process_logits(logits, *self.alike)
        else:  # each member its own sampling (a refused one: none)
            logits = torch.stack(
                [
                    process_logits(x, *((r.temperature, r.top_k, r.top_p) if n else ()))
                    for x, r, n in zip(logits, self.requests, self.n_max)
                ]
            )
        logp_all = F.log_softmax(logits, -1)  # (P, B, V)
        probs = logp_all.exp()
        nxt = exponential_race(probs, noise=self.noise(probs))  # (P, B)
        self.record(nxt, logp_all.gather(-1, nxt.unsqueeze(-1)).squeeze(-1))
        return self.go_on()

    def noise(self, probs: torch.Tensor) -> torch.Tensor:
        """Exp(1) noise (P, B, V) of token `steps`: drawn now, or (ahead) at the first token for the
        whole call, (P, n_max, B, V); 1 where no member draws."""
        every = self.whole and len(self.going) == len(self.n_max)  # no slot left undrawn
        if not self.ahead:
            return self.exponential(torch.empty_like(probs) if every else torch.ones_like(probs))
        if self.steps == 0:
            N = max(self.n_max)
            shape, every = (len(self.n_max), N, *probs.shape[1:]), every and min(self.n_max) == N
            self.ahead_noise = self.exponential(
                probs.new_empty(shape) if every else probs.new_ones(shape), ahead=True
            )
        return self.ahead_noise[:, self.steps]

    def exponential(self, out: torch.Tensor, ahead: bool = False) -> torch.Tensor:
        """Fill out (P, B, V), ahead (P, n_max, B, V), with each going member's Exp(1) from its own
        generator, as its own call draws them: its rows (ahead: and its n_max)."""
        for p in self.going:
            part = (out[p, : self.n_max[p]] if ahead else out[p])[..., : self.rows[p], :]
            generator = self.requests[p].generator
            if part.is_contiguous():
                part.exponential_(generator=generator)
            else:
                part.copy_(out.new_empty(part.shape).exponential_(generator=generator))
        return out

    def record(self, nxt: torch.Tensor, lp: torch.Tensor) -> None:
        """Token `steps` of every row: nxt and its log-prob lp (P, B), PAD and 0 where the row has
        ended or its member stopped; a row that drew EOS has ended."""
        n, ended = self.steps, self.done if self.halted is None else self.done | self.halted
        self.tokens[n], self.logprobs[n] = nxt.masked_fill(ended, PAD_ID), lp.masked_fill(ended, 0)
        self.completion_mask[n] = ~ended
        self.done = self.done | (self.tokens[n] == EOS_ID)
        self.steps = n + 1

    def go_on(self) -> bool:
        """Drop the members that stopped: their n_max drawn, or every row ended (with the noise
        ahead: every member's, read a token late, LateRead) -> whether any goes on."""
        n, going, P = self.steps, self.going, len(self.n_max)
        if self.ahead:
            ended = [self.late.read(self.done.all())] * P
        else:
            ended = self.done.all(-1).tolist()
        self.going = [p for p in going if not ended[p] and n < self.n_max[p]]
        if self.going and len(self.going) < len(going):
            if self.halted is None:
                self.halted = torch.zeros((P, 1), dtype=torch.bool, device=self.done.device)
            self.halted[[p for p in going if p not in self.going]] = True
        return bool(self.going)

    def generations(self, prompt_ids, prompt_mask) -> list[Generation | ValueError]:
        """Each member's Generation (its own generate()'s: its rows, its prompt, its steps up to the
        longest row's EOS, or n_max where a row did not end), or its ValueError. prompt_ids,
        prompt_mask (P, B, W): the members' prompts as laid out. Called outside inference mode: the
        tensors are copied once, each member's Generation views of the copy."""
        # one read: whether each member's log-probs are finite (torch.multinomial's input check)
        finite, steps = torch.stack(
            [
                torch.isfinite(self.logprobs).all(0).all(-1).long(),
                self.completion_mask.sum(0).amax(-1),
            ]
        ).tolist()
        N, W = max(steps), prompt_ids.size(-1)
        tokens, logprobs, completion_mask = (  # (P, B, N)
            x[:N].permute(1, 2, 0).contiguous()
            for x in (self.tokens, self.logprobs, self.completion_mask)
        )
        ids = torch.cat([prompt_ids, tokens], -1)
        key_mask, done = torch.cat([prompt_mask, completion_mask], -1), self.done.clone()
        out: list[Generation | ValueError] = []
        for p, (r, n) in enumerate(zip(self.requests, steps)):
            if p in self.refused or not finite[p]:
                out.append(self.refused.get(p) or ValueError(NON_FINITE))
                continue
            (b, w), span = r.prompt_ids.shape, slice(W - r.prompt_ids.size(1), W + n)
            out.append(
                Generation(
                    ids[p, :b, span],
                    key_mask[p, :b, span],
                    w,
                    completion_mask[p, :b, :n],
                    logprobs[p, :b, :n],
                    done[p, :b],
                )
            )
        return out
