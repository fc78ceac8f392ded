"""Batched sampling with a KV cache, and the slow full-recompute path kept as its test oracle.

    out = generate(model, prompt_ids, prompt_mask, max_new_tokens=16, generator=g)

Prompts of different lengths are LEFT-PADDED (see `logprobs.pad_left`) and carry a key mask; position
ids count real tokens only, so a padded row samples exactly what it would alone. The prompts are run once
(prefill; a run of neighbouring rows holding one prompt, a GRPO group, once, its keys and values copied to
them) and then one token per step for the whole batch, both through decode.Decoder (the model's fast KV-cache
forward). Each row stops at its first EOS (later slots hold PAD and are masked out); the loop stops as soon as
every row has stopped.

Log-probs are those of the SAMPLING distribution (after temperature, top-k and top-p), which at
temperature 1 without filtering are the model's own. `use_cache=False` recomputes the whole sequence
at every step: the slow, obviously-correct path that tests and `bench` compare the cache against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from minigrpo.lm.logprobs import pad_left
from minigrpo.lm.decode import Decoder
from minigrpo.lm.model import GPT, KVCache, positions
from minigrpo.lm.prefix_tree import PrefixTree, next_token_tree
from minigrpo.lm.tokenizer import EOS_ID, PAD_ID, CharTokenizer


GENERATION_FIELDS = ("ids", "key_mask", "prompt_len", "completion_mask", "logprobs", "finished")


@dataclass
class Generation:
    ids: torch.Tensor  # (B, P+N) left-padded prompt, then completion (PAD after the first EOS)
    key_mask: torch.Tensor  # (B, P+N) bool: real prompt tokens and completion tokens
    prompt_len: int  # P, the padded prompt width
    completion_mask: torch.Tensor  # (B, N) bool: completion tokens up to and including the first EOS
    logprobs: torch.Tensor  # (B, N) log-prob of each sampled token under the sampling distribution (0 where masked)
    finished: torch.Tensor  # (B,) bool: the row produced an EOS
    _tree: PrefixTree | None = field(default=None, init=False, repr=False, compare=False)

    def prefix_tree(self) -> PrefixTree:
        """The tree of the distinct prefixes the next-token forward needs (prefix_tree.py), built on first use and
        kept: every forward over these rows (π_ref, π_old, each update, the trust region) shares it. A Generation's
        tensors are never changed in place."""
        if self._tree is None:
            self._tree = next_token_tree(self.ids, self.key_mask)
        return self._tree

    @property
    def completion_ids(self) -> torch.Tensor:  # (B, N)
        return self.ids[:, self.prompt_len:]

    def to_dict(self) -> dict:
        """The fields by name (what checkpoints store: tensors and the prompt width)."""
        return {f: getattr(self, f) for f in GENERATION_FIELDS}

    @classmethod
    def from_dict(cls, d: dict) -> "Generation":
        return cls(*(d[f] for f in GENERATION_FIELDS))

    def clone(self) -> "Generation":
        """A copy of every tensor (made outside inference_mode: ordinary tensors that autograd may save)."""
        return Generation.from_dict({k: v.clone() if torch.is_tensor(v) else v for k, v in self.to_dict().items()})

    def select(self, rows: torch.Tensor) -> "Generation":
        """The rows `rows` (a 1-D index tensor) of every per-row tensor."""
        return Generation(self.ids[rows], self.key_mask[rows], self.prompt_len, self.completion_mask[rows],
                          self.logprobs[rows], self.finished[rows])


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> torch.Tensor:
    """(B, V) logits -> (B, V) logits of the sampling distribution (filtered entries are -inf)."""
    logits = logits.float() if temperature == 1.0 else logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1) k-th largest
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= top_p  # keep the smallest prefix reaching top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def exponential_race(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of (B, V) probabilities: argmax_i p_i / E_i with E_i ~ Exp(1) i.i.d. The race is exact:
    E_i / p_i ~ Exp(p_i), and the smallest of independent exponentials is i with probability p_i / Σ_j p_j. It is
    how torch.multinomial(probs, 1) draws one sample (same generator calls, same draws: tests/test_sampling.py),
    minus that function's input checks (two reductions and a sync: about half its time on a few rows; generate
    checks its log-probs once instead). -> (B,) long."""
    return (probs / torch.empty_like(probs).exponential_(generator=generator)).argmax(-1)


def draw_next(logits: torch.Tensor, done: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
              generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One sampling step: logits (B, V) of each row's next token, done (B,) bool rows already ended -> the drawn
    token (B,) (PAD where done) and its log-prob under the sampling distribution (B,) (0 where done). Every row
    draws, done or not, so a generator's stream depends only on the rows and the steps taken."""
    logp_all = F.log_softmax(process_logits(logits, temperature, top_k, top_p), -1)  # (B, V)
    nxt = exponential_race(logp_all.exp(), generator)  # (B,)
    lp = logp_all.gather(1, nxt[:, None]).squeeze(1)
    return nxt.masked_fill(done, PAD_ID), lp.masked_fill(done, 0.0)


def prefill(model: GPT, decode: Decoder, prompt_ids: torch.Tensor, pos: torch.Tensor, key_mask: torch.Tensor | None,
            t_max: int) -> tuple[torch.Tensor, KVCache]:
    """Run the (left-padded) prompts (B, P) through the model into a new KV cache of t_max slots: -> the logits
    (B, V) of each row's first completion token, and the cache of B rows. A run of rows holding the same prompt (a
    GRPO group: G copies of one, side by side) is computed once and its keys and values copied: unlike a decoding
    step, a prefill is arithmetic and grows with the rows. Only neighbours are compared (torch.unique(dim=0) would
    cost about a decoding step)."""
    key = prompt_ids if key_mask is None else prompt_ids.masked_fill(~key_mask, -1)  # padding compares equal
    new_run = torch.ones(key.size(0), dtype=torch.bool, device=key.device)
    new_run[1:] = (key[1:] != key[:-1]).any(1)  # (B,) True where a row differs from the one before it
    B, U = key.size(0), int(new_run.sum())
    if U == B:  # no two neighbours alike: nothing to share
        cache = model.new_cache(B, t_max)
        return decode(prompt_ids, pos, cache, key_mask), cache
    first, inverse = new_run.nonzero().squeeze(1), new_run.cumsum(0) - 1  # (U,) each run's first row; (B,) its run
    cache = model.new_cache(U, t_max)
    logits = decode(prompt_ids[first], pos[first], cache, None if key_mask is None else key_mask[first])
    cache.k, cache.v = cache.k[:, inverse], cache.v[:, inverse]  # (n_layer, B, H, t_max, D): row i is its prompt's
    return logits[inverse], cache


def generate(model: GPT, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None,
             max_new_tokens: int = 16, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None,
             use_cache: bool = True) -> Generation:
    """Sample up to `max_new_tokens` tokens after each (left-padded) prompt row. See module docstring."""
    batched = getattr(model, "batched_generate", None)  # a population's member: its draw joins one batch
    if batched is not None:  # (minigrpo/population/member.py)
        return batched(prompt_ids, prompt_mask, max_new_tokens, temperature, top_k, top_p, generator)
    # inference_mode, not no_grad: no version counters or autograd dispatch, 8-9 % faster sampling (one thread,
    # batch 8 and 64); its tensors cannot be saved for backward later, so the results leave as ordinary copies
    with torch.inference_mode():
        gen = _generate(model, prompt_ids, prompt_mask, max_new_tokens, temperature, top_k, top_p, generator,
                        use_cache)
    return gen.clone()


def _generate(model, prompt_ids, prompt_mask, max_new_tokens, temperature, top_k, top_p, generator,
              use_cache) -> Generation:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B, P = prompt_ids.shape
    device = prompt_ids.device
    if prompt_mask is None:
        prompt_mask = torch.ones_like(prompt_ids, dtype=torch.bool)
    max_new_tokens = min(max_new_tokens, model.cfg.block_size - int(prompt_mask.sum(1).max()))
    if max_new_tokens < 1:
        raise ValueError(f"prompt of {P} tokens leaves no room in block_size {model.cfg.block_size}")

    ids = torch.full((B, P + max_new_tokens), PAD_ID, dtype=torch.long, device=device)
    ids[:, :P] = prompt_ids
    key_mask = torch.ones_like(ids, dtype=torch.bool)  # generated slots are real keys for their row
    key_mask[:, :P] = prompt_mask
    logprobs = torch.zeros((B, max_new_tokens), device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    completion_mask = torch.zeros((B, max_new_tokens), dtype=torch.bool, device=device)

    pos_all = positions(key_mask)  # (B, P+N) position ids of every slot
    padded = not bool(prompt_mask.all())  # without padding, plain causal attention needs no mask
    km = key_mask if padded else None
    if use_cache:
        decode = Decoder(model)  # the fast forward through the KV cache (decode.py); GPT.forward is its oracle
        logits, cache = prefill(model, decode, prompt_ids, pos_all[:, :P], km[:, :P] if padded else None,
                                P + max_new_tokens)
    n = 0
    for n in range(max_new_tokens):
        t = P + n  # the slot being filled
        if not use_cache:  # slow path: recompute everything
            logits = model(ids[:, :t], pos=pos_all[:, :t], key_mask=km[:, :t] if padded else None)[:, -1]
        nxt, logprobs[:, n] = draw_next(logits, done, temperature, top_k, top_p, generator)
        completion_mask[:, n] = ~done
        ids[:, t] = nxt
        done = done | (nxt == EOS_ID)
        if bool(done.all()) or n + 1 == max_new_tokens:
            break
        if use_cache:
            logits = decode(nxt[:, None], pos_all[:, t:t + 1], cache, km[:, :t + 1] if padded else None)
    N = n + 1
    if not bool(torch.isfinite(logprobs[:, :N]).all()):  # torch.multinomial's input check, once per call
        raise ValueError("sampling met non-finite probabilities: the model's weights hold NaN or inf")
    return Generation(ids=ids[:, :P + N], key_mask=torch.cat([prompt_mask, completion_mask[:, :N]], 1),
                      prompt_len=P, completion_mask=completion_mask[:, :N], logprobs=logprobs[:, :N],
                      finished=done)


def encode_prompts(tok: CharTokenizer, prompts: list[str], device=None):
    """BOS + prompt for each prompt, left-padded: -> ids (B, P), key_mask (B, P)."""
    return pad_left([tok.encode(p, bos=True) for p in prompts], tok.pad_id, device)


def decode_completions(tok: CharTokenizer, gen: Generation) -> list[str]:
    """Completion text of each row: after the prompt, up to (not including) the first EOS."""
    return [tok.decode(row.tolist()) for row in gen.completion_ids]
