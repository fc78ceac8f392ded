"""Batched sampling with a KV cache, and the slow full-recompute path kept as its test oracle.

    out = generate(model, prompt_ids, prompt_mask, max_new_tokens=16, generator=g)

Prompts of different lengths are LEFT-PADDED (see `logprobs.pad_left`) and carry a key mask;
position ids count real tokens only, so a padded row samples exactly what it would alone. The
prompts are run once (prefill; a run of neighbouring rows holding one prompt, a GRPO group, once,
its keys and values copied to them) and then one token per step for the whole batch, both through
decode.Decoder (the model's fast KV-cache forward). Each row stops at its first EOS (later slots
hold PAD and are masked out); the loop stops as soon as every row has stopped.

Each token is drawn by an exponential race (`exponential_race`: torch.multinomial's own draws). On a
GPU (NOISE_AHEAD) a call draws all its noise, (n_max, B, V), at its first token: one kernel a call,
not one a token, where a decoding step is launch-bound and a population's members each draw their
own (population/sampling.py). The same seed then draws other samples there than on a CPU: a run on a
GPU is another experiment anyway.

Log-probs are those of the SAMPLING distribution (after temperature, top-k and top-p), which at
temperature 1 without filtering are the model's own. `use_cache=False` recomputes the whole sequence
at every step: the slow, obviously-correct path that tests and `bench` compare the cache against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from minigrpo.lm.decode import Decoder
from minigrpo.lm.logprobs import pad_left
from minigrpo.lm.model import GPT, KVCache, positions
from minigrpo.lm.prefix_tree import PrefixTree, next_token_tree
from minigrpo.lm.tokenizer import EOS_ID, PAD_ID, CharTokenizer

GENERATION_FIELDS = ("ids", "key_mask", "prompt_len", "completion_mask", "logprobs", "finished")


@dataclass
class Generation:
    ids: torch.Tensor  # (B, P+N) left-padded prompt, then completion (PAD after the first EOS)
    key_mask: torch.Tensor  # (B, P+N) bool: real prompt tokens and completion tokens
    prompt_len: int  # P, the padded prompt width
    # (B, N) bool: completion tokens up to and including the first EOS
    completion_mask: torch.Tensor
    # (B, N) log-prob of each sampled token under the sampling distribution (0 where masked)
    logprobs: torch.Tensor
    finished: torch.Tensor  # (B,) bool: the row produced an EOS
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
        return self.ids[:, self.prompt_len :]

    def to_dict(self) -> dict:
        """The fields by name (what checkpoints store: tensors and the prompt width)."""
        return {f: getattr(self, f) for f in GENERATION_FIELDS}

    @classmethod
    def from_dict(cls, d: dict) -> "Generation":
        return cls(*(d[f] for f in GENERATION_FIELDS))

    def clone(self) -> "Generation":
        """A copy of every tensor (made outside inference_mode: ordinary tensors that autograd may
        save)."""
        return Generation.from_dict(
            {k: v.clone() if torch.is_tensor(v) else v for k, v in self.to_dict().items()}
        )

    def select(self, rows: torch.Tensor) -> "Generation":
        """The rows `rows` (a 1-D index tensor) of every per-row tensor."""
        return Generation(
            self.ids[rows],
            self.key_mask[rows],
            self.prompt_len,
            self.completion_mask[rows],
            self.logprobs[rows],
            self.finished[rows],
        )


def process_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """(B, V) logits -> (B, V) logits of the sampling distribution (filtered entries are -inf)."""
    logits = logits.float() if temperature == 1.0 else logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1) k-th largest
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
    """One draw per row of (B, V) probabilities: argmax_i p_i / E_i with E_i ~ Exp(1) i.i.d. The
    race is exact: E_i / p_i ~ Exp(p_i), and the smallest of independent exponentials is i with
    probability p_i / Σ_j p_j. It is how torch.multinomial(probs, 1) draws one sample (same
    generator calls, same draws: tests/test_sampling.py), minus that function's input checks (two
    reductions and a sync: about half its time on a few rows; generate checks its log-probs once
    instead). `noise`: the E (B, V) already drawn (NOISE_AHEAD). -> (B,) long."""
    return (
        probs
        / (torch.empty_like(probs).exponential_(generator=generator) if noise is None else noise)
    ).argmax(-1)


# the devices where a generate() call draws its noise at its first token (module docstring)
NOISE_AHEAD = ("cuda",)


def noise_ahead(draws: "Draws", shape: tuple) -> torch.Tensor:
    """A call's noise drawn at once from its generator: Exp(1) of (n_max, *shape), token n's the [n]
    slice."""
    device = draws.prompt_ids.device
    return torch.empty((draws.n_max, *shape), device=device).exponential_(
        generator=draws.settings[3]
    )


NON_FINITE = "sampling met non-finite probabilities: the model's weights hold NaN or inf"


class Draws:
    """One generate() call's draws so far: the new tokens of each row, their log-probs under the
    sampling distribution, which are real (up to and including the row's first EOS), and the rows
    that have ended. The one bookkeeping of sampling, for one model (`_generate`) and for a
    population's members (population/sampling.py).

        d = Draws(prompt_ids, prompt_mask, max_new_tokens, temperature, top_k, top_p, generator,
                  block_size)
        while d.take(logits):   # logits (B, V) of each row's next token -> draw it; False once
                                # every row ended
            ...                 # the next logits, after d.tokens[:, d.steps - 1]
        gen = d.generation()

    Every row draws at every step, ended or not, so a generator's stream depends only on the rows
    and the steps."""

    def __init__(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor | None,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        generator: torch.Generator | None,
        block_size: int,
        prompt_len: int | None = None,
        allocate: bool = True,
    ):
        """prompt_len: the longest row's real prompt tokens, where the caller knows it (a
        population's prompt table); else read from prompt_mask (on a GPU, a wait for the device).
        allocate=False: no bookkeeping tensors yet (a population's members alike keep theirs
        stacked: population/sampling.StackedDraws; else `allocate()` before the first draw)."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        P = prompt_ids.size(1)
        self.prompt_ids, self.settings = prompt_ids, (temperature, top_k, top_p, generator)
        self.prompt_mask = (
            torch.ones_like(prompt_ids, dtype=torch.bool) if prompt_mask is None else prompt_mask
        )
        longest = int(self.prompt_mask.sum(1).max()) if prompt_len is None else prompt_len
        self.n_max = min(max_new_tokens, block_size - longest)
        if self.n_max < 1:
            raise ValueError(f"prompt of {P} tokens leaves no room in block_size {block_size}")
        self.steps, self.ahead, self.noise = 0, prompt_ids.device.type in NOISE_AHEAD, None
        if allocate:
            self.allocate()

    def allocate(self) -> None:
        self.tokens, self.logprobs, self.completion_mask, self.done = Draws.fresh(
            (self.prompt_ids.size(0),), self.n_max, self.prompt_ids.device
        )

    @staticmethod
    def fresh(rows: tuple, n_max: int, device) -> tuple:
        """The bookkeeping before any draw, for rows of shape `rows` ((B,), or a population's (P,
        B)): tokens (PAD), their log-probs, the completion mask (rows, n_max), and which rows have
        ended (rows)."""
        return (
            torch.full((*rows, n_max), PAD_ID, dtype=torch.long, device=device),
            torch.zeros((*rows, n_max), device=device),
            torch.zeros((*rows, n_max), dtype=torch.bool, device=device),
            torch.zeros(rows, dtype=torch.bool, device=device),
        )

    def take(self, logits: torch.Tensor) -> bool:
        """Draw token `steps` of every row from logits (B, V) (PAD, log-prob 0 where the row has
        ended); -> whether another step follows (False once every row has ended or n_max tokens are
        drawn)."""
        n, (temperature, top_k, top_p, generator) = self.steps, self.settings
        logp_all = F.log_softmax(process_logits(logits, temperature, top_k, top_p), -1)  # (B, V)
        if self.ahead and n == 0:
            self.noise = noise_ahead(self, logp_all.shape)
        # (B,)
        nxt = exponential_race(logp_all.exp(), generator, self.noise[n] if self.ahead else None)
        self.record(n, nxt, logp_all.gather(1, nxt[:, None]).squeeze(1))
        self.steps = n + 1
        return not (bool(self.done.all()) or self.steps == self.n_max)

    def record(self, n: int, nxt: torch.Tensor, lp: torch.Tensor) -> None:
        """Token n of every row: nxt and its log-prob lp (rows (B,), or any leading dims: a
        population's stacked draws), PAD and 0 where the row has ended; a row that drew EOS has
        ended."""
        self.tokens[..., n], self.logprobs[..., n] = (
            nxt.masked_fill(self.done, PAD_ID),
            lp.masked_fill(self.done, 0.0),
        )
        self.completion_mask[..., n] = ~self.done
        self.done = self.done | (self.tokens[..., n] == EOS_ID)

    def generation(self) -> Generation:
        N = self.steps
        # torch.multinomial's input check, once per call
        if not bool(torch.isfinite(self.logprobs[:, :N]).all()):
            raise ValueError(NON_FINITE)
        return Generation(
            ids=torch.cat([self.prompt_ids, self.tokens[:, :N]], 1),
            key_mask=torch.cat([self.prompt_mask, self.completion_mask[:, :N]], 1),
            prompt_len=self.prompt_ids.size(1),
            completion_mask=self.completion_mask[:, :N],
            logprobs=self.logprobs[:, :N],
            finished=self.done,
        )


def prefill(
    model: GPT,
    decode: Decoder,
    prompt_ids: torch.Tensor,
    pos: torch.Tensor,
    key_mask: torch.Tensor | None,
    t_max: int,
) -> tuple[torch.Tensor, KVCache]:
    """Run the (left-padded) prompts (B, P) through the model into a new KV cache of t_max slots: ->
    the logits (B, V) of each row's first completion token, and the cache of B rows. A run of rows
    holding the same prompt (a GRPO group: G copies of one, side by side) is computed once and its
    keys and values copied: unlike a decoding step, a prefill is arithmetic and grows with the rows.
    Only neighbours are compared (torch.unique(dim=0) would cost about a decoding step)."""
    # padding compares equal
    key = prompt_ids if key_mask is None else prompt_ids.masked_fill(~key_mask, -1)
    new_run = torch.ones(key.size(0), dtype=torch.bool, device=key.device)
    # (B,) True where a row differs from the one before it
    new_run[1:] = (key[1:] != key[:-1]).any(1)
    B, U = key.size(0), int(new_run.sum())
    if U == B:  # no two neighbours alike: nothing to share
        cache = model.new_cache(B, t_max)
        return decode(prompt_ids, pos, cache, key_mask), cache
    # (U,) each run's first row; (B,) its run
    first, inverse = new_run.nonzero().squeeze(1), new_run.cumsum(0) - 1
    cache = model.new_cache(U, t_max)
    logits = decode(
        prompt_ids[first], pos[first], cache, None if key_mask is None else key_mask[first]
    )
    # (n_layer, B, H, t_max, D): row i is its prompt's
    cache.k, cache.v = cache.k[:, inverse], cache.v[:, inverse]
    return logits[inverse], cache


def generate(
    model: GPT,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor | None = None,
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> Generation:
    """Sample up to `max_new_tokens` tokens after each (left-padded) prompt row. See module
    docstring."""
    # inference_mode, not no_grad: no version counters or autograd dispatch (docs/performance.md,
    # "The sampler's
    # forward"); its tensors cannot be saved for backward later, so the results leave as ordinary
    # copies
    with torch.inference_mode():
        gen = _generate(
            model,
            prompt_ids,
            prompt_mask,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            generator,
            use_cache,
        )
    return gen.clone()


def _generate(
    model, prompt_ids, prompt_mask, max_new_tokens, temperature, top_k, top_p, generator, use_cache
) -> Generation:
    d = Draws(
        prompt_ids,
        prompt_mask,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        generator,
        model.cfg.block_size,
    )
    (B, P), N = prompt_ids.shape, d.n_max
    key_mask = torch.cat(
        [d.prompt_mask, torch.ones((B, N), dtype=torch.bool, device=prompt_ids.device)], 1
    )
    # (B, P+N) position ids of every slot; generated slots are real keys
    pos_all = positions(key_mask)
    padded = not bool(d.prompt_mask.all())  # without padding, plain causal attention needs no mask
    km = key_mask if padded else None
    if use_cache:
        # the fast forward through the KV cache (decode.py); GPT.forward is its oracle
        decode = Decoder(model)
        logits, cache = prefill(
            model, decode, prompt_ids, pos_all[:, :P], km[:, :P] if padded else None, P + N
        )
    else:  # slow path: recompute everything at every step
        logits = model(prompt_ids, pos=pos_all[:, :P], key_mask=km[:, :P] if padded else None)[
            :, -1
        ]
    while d.take(logits):
        t = P + d.steps  # the slot after the token just drawn
        if use_cache:
            logits = decode(
                d.tokens[:, d.steps - 1 : d.steps],
                pos_all[:, t - 1 : t],
                cache,
                km[:, :t] if padded else None,
            )
        else:
            ids = torch.cat([prompt_ids, d.tokens[:, : d.steps]], 1)
            logits = model(ids, pos=pos_all[:, :t], key_mask=km[:, :t] if padded else None)[:, -1]
    return d.generation()


def encode_prompts(tok: CharTokenizer, prompts: list[str], device=None):
    """BOS + prompt for each prompt, left-padded: -> ids (B, P), key_mask (B, P)."""
    return pad_left([tok.encode(p, bos=True) for p in prompts], tok.pad_id, device)


def decode_completions(tok: CharTokenizer, gen: Generation) -> list[str]:
    """Completion text of each row: after the prompt, up to (not including) the first EOS."""
    # one read of the tensor, not one per row
    return [tok.decode(row) for row in gen.completion_ids.tolist()]
