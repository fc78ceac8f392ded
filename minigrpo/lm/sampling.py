"""Batched sampling with a KV cache, for one model or P models at once, and the slow full-recompute
path kept as its test oracle.

    out = generate(model, prompt_ids, prompt_mask, max_new_tokens=16, generator=g)
    outs = generate_all(weights, requests)   # weights stacked (P, ...) (model.Weights), requests[p]
                                             # member p's generate() arguments -> its Generation
    texts, finished = read_completions(tok, outs)[p]

One loop (`_sample`) over P members' rows (P, B, ...); generate() is it with P = 1. Prompts are
LEFT-PADDED (`logprobs.pad_left`; a member's to the widest member's, a member of fewer rows gets
padding rows) with a key mask, and position ids count real tokens only, so a padded row samples what
it would alone. The prompts are run once (`prefill`; neighbouring rows holding one prompt, a GRPO
group, once), then one token per step for every row, both through decode.Decoder's KV cache. A row
stops at its first EOS (then PAD, masked); a member stops once all its rows have or at its n_max.

Randomness is an argument: each member draws from its own generator exactly as often as its own
generate() call, so member p's Generation is generate(model_p, *requests[p])'s: the same tokens,
log-probs to float rounding (tests/test_population.py). A refused request (temperature, room in the
block) or non-finite probabilities give that member its ValueError; the others are untouched.

Each token is drawn by an exponential race (`exponential_race`: torch.multinomial's own draws). On a
GPU (NOISE_AHEAD) a member draws all its noise, (n_max, B, V), at its first token (one kernel a
call, not one a token) and the loop reads whether every row has ended one token late (LateRead),
running a step past the end (masked, cut off): the same seed draws other samples than on a CPU.

Log-probs are those of the SAMPLING distribution (after temperature, top-k and top-p): at
temperature 1 without filtering, the model's own. `use_cache=False` recomputes the whole sequence
at every step: the slow, obviously-correct path that tests and `bench` compare the cache against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from minigrpo.lm.decode import Decoder
from minigrpo.lm.draws import Draws, Generation
from minigrpo.lm.logprobs import pad_left
from minigrpo.lm.model import GPT, KVCache, Weights, causal_mask, positions
from minigrpo.lm.tokenizer import PAD_ID, CharTokenizer

# the devices where a member draws its call's noise at its first token (module docstring)
NOISE_AHEAD = ("cuda",)


@dataclass
class Request:
    """One generate() call's arguments (a member's, in generate_all)."""

    prompt_ids: torch.Tensor  # (B, L) left-padded
    prompt_mask: torch.Tensor | None = None  # (B, L) bool, None = all real
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    generator: torch.Generator | None = None
    # the longest row's real prompt tokens, where the caller knows it (rollout.collect_all: the
    # encoded width); else read from prompt_mask (on a GPU, a wait for the device)
    prompt_len: int | None = None

    def new_tokens(self, block_size: int) -> int:
        """The most tokens the call draws, n_max; ValueError where it may draw none."""
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        L, mask, longest = self.prompt_ids.size(1), self.prompt_mask, self.prompt_len
        if longest is None:
            longest = L if mask is None else int(mask.sum(1).max())
        n_max = min(self.max_new_tokens, block_size - longest)
        if n_max < 1:
            raise ValueError(f"prompt of {L} tokens leaves no room in block_size {block_size}")
        return n_max


def lay_out(requests: list[Request], n_max: list[int], device) -> tuple:
    """The members' prompts in one batch: ids, prompt_mask (P, B, W), each member's right-aligned
    in its first rows (a refused one's: none); key_mask (P*B, W+N) over them and the N new tokens;
    real (P, B) bool: the members' own rows."""
    live, P, N = [p for p, n in enumerate(n_max) if n], len(requests), max(n_max)
    ids = [requests[p].prompt_ids for p in live]
    masks = [requests[p].prompt_mask for p in live]
    masks = [torch.ones_like(x, dtype=torch.bool) if m is None else m for x, m in zip(ids, masks)]
    B, W = max(x.size(0) for x in ids), max(x.size(1) for x in ids)
    if len(live) == P and all(x.shape == (B, W) for x in ids):  # they fill the batch (one run's)
        ids, prompt_mask = (xs[0][None] if P == 1 else torch.stack(xs) for xs in (ids, masks))
        real = torch.ones((P, B), dtype=torch.bool, device=device)
    else:  # a member's prompts padded further on the left, its rows by padding rows
        ids, prompt_mask = pad_members(ids, masks, live, P, B, W)
        rows = [requests[p].prompt_ids.size(0) if n else 0 for p, n in enumerate(n_max)]
        real = torch.arange(B, device=device) < torch.tensor(rows, device=device)[:, None]
    key_mask = torch.cat([prompt_mask, real[..., None].expand(P, B, N)], -1).view(P * B, W + N)
    return ids, prompt_mask, key_mask, real


def pad_members(ids: list, masks: list, live: list[int], P: int, B: int, W: int) -> tuple:
    """Members live[i]'s prompts ids[i], masks[i] (b, w) right-aligned in the first b rows of a
    batch (P, B, W) of padding: -> ids, prompt_mask (P, B, W)."""
    out = torch.full((P, B, W), PAD_ID, dtype=torch.long, device=ids[0].device)
    prompt_mask = torch.zeros((P, B, W), dtype=torch.bool, device=ids[0].device)
    shapes: dict[tuple, list[int]] = {}  # members of one prompt shape are copied in as one
    for i, x in enumerate(ids):
        shapes.setdefault(tuple(x.shape), []).append(i)
    for (b, w), js in shapes.items():
        at = torch.tensor([live[j] for j in js], device=out.device)
        out[at, :b, W - w :] = torch.stack([ids[j] for j in js])
        prompt_mask[at, :b, W - w :] = torch.stack([masks[j] for j in js])
    return out, prompt_mask


def prefill(
    decode: Decoder,
    prompt_ids: torch.Tensor,
    pos: torch.Tensor,
    key_mask: torch.Tensor | None,
    t_max: int,
) -> tuple[torch.Tensor, KVCache]:
    """Run the (left-padded) prompts (P, B, L) of decode's weights' P members (P = 1 over one
    model's) into a new KV cache of t_max slots: -> the logits (P, B, V) of each row's first
    completion token, and the cache of P*B rows. key_mask None or (P*B, L). A run of a member's
    neighbouring rows holding the same prompt (a GRPO group: G copies of one, side by side) is
    computed once and its keys and values copied: unlike a decoding step, a prefill is arithmetic
    and grows with the rows. Only neighbours are compared (torch.unique(dim=0) would cost about a
    decoding step)."""
    (P, B, L), device = prompt_ids.shape, prompt_ids.device
    # padding compares equal
    key = prompt_ids if key_mask is None else prompt_ids.masked_fill(~key_mask.view(P, B, L), -1)
    new_run = torch.ones((P, B), dtype=torch.bool, device=device)
    # (P, B) True where a row differs from the one before it
    new_run[:, 1:] = (key[:, 1:] != key[:, :-1]).any(-1)
    U = int(new_run.sum(1).max())
    if U == B:  # no two neighbours alike: nothing to share
        cache = decode.weights.new_cache(P * B, t_max)
        return decode(prompt_ids, pos, cache, key_mask), cache
    # (P*U,) each run's first row among the P*B (a member of fewer runs computes some rows twice)
    offset = torch.arange(P, device=device)[:, None]
    first = (torch.sort(~new_run, dim=1, stable=True).indices[:, :U] + offset * B).flatten()
    run = (new_run.cumsum(1) - 1 + offset * U).flatten()  # (P*B,) each row's run among the P*U
    at = lambda x: x.flatten(0, 1)[first]  # (P*U, ...)
    cache = decode.weights.new_cache(P * U, t_max)
    logits = decode(
        at(prompt_ids).view(P, U, L),
        at(pos).view(P, U, L),
        cache,
        None if key_mask is None else key_mask[first],
    )
    # (n_layer, P*B, H, t_max, D): row i is its prompt's
    cache.k, cache.v = cache.k[:, run], cache.v[:, run]
    return logits.flatten(0, 1)[run].view(P, B, -1), cache


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
    """Sample up to `max_new_tokens` tokens after each (left-padded) prompt row: generate_all of one
    request over the model's weights; its ValueError raised. See module docstring."""
    asked = Request(prompt_ids, prompt_mask, max_new_tokens, temperature, top_k, top_p, generator)
    (gen,) = generate_all(model.weights(), [asked], use_cache)
    if isinstance(gen, ValueError):
        raise gen
    return gen


def generate_all(
    weights: Weights, requests: list[Request], use_cache: bool = True
) -> list[Generation | ValueError]:
    """Each request's generate() in one batch, member p's through its weights (stacked (P, ...);
    one model's for a single request) -> its Generation, or the ValueError its own call raises."""
    n_max, refused = [], {}
    for p, r in enumerate(requests):
        try:
            n_max.append(r.new_tokens(weights.cfg.block_size))
        except ValueError as e:
            n_max.append(0)
            refused[p] = e
    if not any(n_max):
        return list(refused.values())
    draws, ids, prompt_mask = _sample(weights, requests, n_max, refused, use_cache)
    return draws.generations(ids, prompt_mask)


# inference_mode, not no_grad: no version counters or autograd dispatch (docs/performance.md, "The
# sampler's forward"); its tensors cannot be saved for backward later, so the results leave as
# ordinary copies (Draws.generations)
@torch.inference_mode()
def _sample(
    weights, requests, n_max, refused, use_cache
) -> tuple[Draws, torch.Tensor, torch.Tensor]:
    """The one sampling loop: -> the Draws and the prompts as laid out (P, B, W)."""
    ids, prompt_mask, key_mask, real = lay_out(requests, n_max, requests[0].prompt_ids.device)
    (P, B, W), N = ids.shape, max(n_max)
    d = Draws(requests, n_max, real, refused, ids.device.type in NOISE_AHEAD)
    # (P, B, W+N) position ids of every slot; a member that stops early stays within the block
    pos = positions(key_mask).view(P, B, W + N).clamp(max=weights.cfg.block_size - 1)
    # without padding, plain causal attention needs no mask
    km = key_mask if not bool(key_mask.all()) else None
    cut = lambda t: None if km is None else km[:, :t]
    if use_cache:  # the fast forward through the KV cache (decode.py)
        decode = Decoder(weights)
        logits, cache = prefill(decode, ids, pos[..., :W], cut(W), W + N)
    else:  # slow path: recompute everything at every step
        full = lambda x, t: weights.head(
            weights.hidden(x, pos[..., :t], causal_mask(0, t, cut(t), x.device))
        )[..., -1, :]
        logits = full(ids, W)
    while d.take(logits):
        n = d.steps
        t = W + n  # the slot after the token just drawn
        if use_cache:
            logits = decode(d.tokens[n - 1].view(P, B, 1), pos[..., t - 1 : t], cache, cut(t))
        else:
            logits = full(torch.cat([ids, d.tokens[:n].permute(1, 2, 0)], -1), t)
    return d, ids, prompt_mask


def encode_prompts(tok: CharTokenizer, prompts: list[str], device=None):
    """BOS + prompt for each prompt, left-padded: -> ids (B, P), key_mask (B, P)."""
    return pad_left([tok.encode(p, bos=True) for p in prompts], tok.pad_id, device)


def read_completions(tok: CharTokenizer, gens: list) -> list:
    """Each Generation's completion texts (up to, not including, the first EOS) and finished flags,
    None in an error's place: all rows read back at once, each distinct row decoded once (rows
    repeat: a group's samples, a settled policy)."""
    ok = [g for g in gens if isinstance(g, Generation)]
    if not ok:
        return [None] * len(gens)
    T = max(g.completion_ids.size(1) for g in ok)
    # (R, T + 1): each row's ids padded on the right (decode drops PAD), then its finished flag
    pad = lambda g: F.pad(g.completion_ids, (0, T - g.completion_ids.size(1)), value=PAD_ID)
    rows = torch.cat([torch.cat([pad(g), g.finished[:, None].long()], 1) for g in ok])
    distinct, inverse = np.unique(rows.cpu().numpy(), axis=0, return_inverse=True)
    read = [(tok.decode(row[:-1]), bool(row[-1])) for row in distinct.tolist()]
    each_row, out = iter([read[i] for i in inverse.ravel()]), []
    for g in gens:
        if not isinstance(g, Generation):
            out.append(None)
            continue
        mine = [next(each_row) for _ in range(g.ids.size(0))]
        out.append(([text for text, _ in mine], [finished for _, finished in mine]))
    return out
