"""Log-probabilities of given tokens: one module, one forward, so no caller can disagree about masks
or positions.

    shifted_forward            the one forward over ids[:, :-1], once per distinct prefix
    completion_token_logprobs  the shift by one: a completion's token log-probs from the logits
    generation_logprobs        a Generation's completion tokens (N, T): GRPO, PPO, DPO, the anchor
    sequence_logprobs          every next token of whole sequences (B, T-1): the exact oracle's
    sequence_logp              per-token log-probs summed over a mask: log π(y) of each completion
    completion_logprobs        (prompt, completion) text pairs -> summed log-probs: exact evaluation

Stacked weights. `model` is a GPT or its lm/model.Weights; every function also takes M models'
weights stacked (Weights of (M, ...) tensors) with rows (M, B, ...) and a batch of M prefix trees
(prefix_tree.py), one for each model's rows: each model computes its own rows, in one forward, as
it would alone (to float rounding).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from minigrpo.lm.model import GPT, Weights, causal_mask, positions
from minigrpo.lm.prefix_tree import PrefixTree, next_token_tree
from minigrpo.lm.tokenizer import CharTokenizer


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target]: logits (..., T, V), targets (..., T) -> (..., T)."""
    return F.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def completion_token_logprobs(
    logits: torch.Tensor, ids: torch.Tensor, prompt_len: int, completion_mask: torch.Tensor
) -> torch.Tensor:
    """log π(o_j | prompt, o_<j) of each completion token, 0 where the completion has ended.

    ids (B, P+N): the left-padded prompt in slots [0, P) (P = prompt_len), then N completion slots.
    logits (B, P+N−1, V): the model's output over ids[:, :-1], so logits[:, t] predicts ids[:, t+1]:
    completion token j (slot P+j) is predicted by logits[:, P−1+j].
    completion_mask (B, N) bool: tokens up to and including the first EOS; after it, PAD fills the
    row. -> (B, N) log-softmax of the logits gathered at each completion token; masked slots exactly
    0.
    """
    logp = gather_logprobs(logits[:, prompt_len - 1 :], ids[:, prompt_len:])  # (B, N)
    return torch.where(completion_mask, logp, 0.0)


def shifted_forward(
    model: GPT | Weights,
    ids: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    tree: PrefixTree | None = None,
    shared_prefixes: bool = True,
):
    """The one forward pass over ids[:, :-1] (left-padded; key_mask (B, T) bool or None = all real):
    -> (logits (B, T-1, V) at the given temperature, final hidden states (B, T-1, C)); logits[:, t]
    predicts ids[:, t+1]; entries whose target is padding are meaningless (callers mask them). It
    runs once per distinct prefix (prefix_tree.py; `tree`: next_token_tree(ids, key_mask) if the
    caller keeps one); shared_prefixes=False runs every slot of every row: the plain forward, kept
    as the tests' oracle (the two agree to float rounding, about 1e-6 on the logits, wherever the
    target is real). Stacked weights: ids, key_mask (M, B, T), tree a batch of M trees."""
    km = key_mask[..., :-1] if key_mask is not None else None
    if not shared_prefixes or ids.size(-1) < 2:
        hidden = plain_hidden(model, ids[..., :-1], km)
        return model.head(hidden) / temperature, hidden
    tree = tree if tree is not None else next_token_tree(ids, key_mask)
    # (G, N, C): each node once; stacked weights on the CPU: each model's attention over its own
    # tree's width (model.own_lengths: as it computes alone, to the bit)
    widths = None if tree.tokens.is_cuda else tree.widths()
    own = {} if widths is None else {"lengths": widths}
    hidden = model.hidden(tree.tokens, pos=tree.pos, attn_mask=tree.mask, **own)
    logits = model.head(hidden)
    # x / 1 is x
    return tree.gather(logits if temperature == 1.0 else logits / temperature), tree.gather(hidden)


def plain_hidden(
    model: GPT | Weights, ids: torch.Tensor, key_mask: torch.Tensor | None
) -> torch.Tensor:
    """The plain forward's final hidden states at every slot of left-padded rows ids (..., B, T)
    (key_mask alike, or None = all real): GPT.hidden with a key mask, of each model's rows."""
    w, T = model.weights() if isinstance(model, GPT) else model, ids.size(-1)
    w.cfg.check_length(T)
    if key_mask is None:
        return w.hidden(ids, torch.arange(T, device=ids.device).expand(ids.shape))
    rows = key_mask.flatten(0, -2)  # (R, T): each model's rows in turn
    return w.hidden(ids, positions(rows).view(ids.shape), causal_mask(0, T, rows, ids.device))


def generation_logprobs(
    model: GPT | Weights,
    gen,
    temperature: float = 1.0,
    return_logits: bool = False,
    return_hidden: bool = False,
):
    """Per-token log-probs (N, T) of the completion tokens of a Generation (lm/sampling.py) under
    `model` in one forward pass, and optionally the (N, T, V) logits that produced them and the (N,
    T, C) hidden states of the states before each completion token (for a value head).
    Differentiable: use no_grad for π_old/π_ref. `gen`: any rows with a Generation's ids,
    key_mask, prompt_len, completion_mask and prefix_tree(); stacked weights: (M, N, ...) rows, (M,
    N, T) log-probs."""
    P, mask = gen.prompt_len, gen.completion_mask
    # (N, P+T−1, ·)
    logits, hidden = shifted_forward(model, gen.ids, gen.key_mask, temperature, gen.prefix_tree())
    # (N, T); stacked weights' rows as (M·N) rows
    logp = completion_token_logprobs(
        logits.flatten(0, -3), gen.ids.flatten(0, -2), P, mask.flatten(0, -2)
    ).view(mask.shape)
    extra = ([logits[..., P - 1 :, :]] if return_logits else []) + (
        [hidden[..., P - 1 :, :]] if return_hidden else []
    )
    return (logp, *extra) if extra else logp


def sequence_logprobs(
    model: GPT | Weights,
    ids: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    tree: PrefixTree | None = None,
) -> torch.Tensor:
    """Next-token log-probs of a batch of (left-padded) sequences in one forward pass.

    ids (B, T), key_mask (B, T) bool (real tokens; None = all real)
    -> logp (B, T-1) with logp[:, t] = log π(ids[:, t+1] | ids[:, :t+1]) at the given temperature.
    Entries whose target is padding are meaningless; callers mask them. tree: shifted_forward's
    (stacked weights over one set of rows: that set's tree, expanded).
    """
    logits, _ = shifted_forward(model, ids, key_mask, temperature, tree)  # (B, T-1, V)
    return gather_logprobs(logits, ids[..., 1:])


def pad_left(rows: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to one tensor: -> ids (B, T) long, key_mask (B, T) bool."""
    width, shape = max(len(r) for r in rows), (len(rows), -1)  # -1: a width of 0 too
    ids = torch.tensor(
        [[pad_id] * (width - len(r)) + list(r) for r in rows], dtype=torch.long
    ).view(shape)
    mask = torch.tensor(
        [[False] * (width - len(r)) + [True] * len(r) for r in rows], dtype=torch.bool
    ).view(shape)
    return ids.to(device), mask.to(device)


def sequence_logp(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log π(y) = Σ_t log π(o_t | o_<t) over the valid tokens,  logp (..., B, T), mask (B, T) bool
    -> (..., B).

    Masked slots contribute nothing (torch.where, so NaN or ±1e4 there reach neither value nor
    gradient); an empty row gives 0 (log of the empty product).
    """
    return torch.where(mask, logp, 0.0).sum(dim=-1)


@torch.no_grad()
def completion_logprobs(
    model: GPT | Weights | list[GPT],
    tok: CharTokenizer,
    prompts: list[str],
    completions: list[str],
    end: bool = True,
) -> torch.Tensor:
    """log π(completion [+ EOS] | BOS + prompt) for each (prompt, completion) pair, one forward
    pass.

    Teacher-forced scoring: the exact probability that sampling (temperature 1) produces exactly
    this completion and then stops. -> (N,) float tensor of summed log-probs; M models' weights
    stacked: (M, N), each model over the one prefix tree; a list of M GPTs: (M, N), each alone.
    """
    if isinstance(model, list):
        return torch.stack([completion_logprobs(m, tok, prompts, completions, end) for m in model])
    wte = model.wte.weight if isinstance(model, GPT) else model.w["wte.weight"]
    lead = wte.shape[:-2]  # () for one model
    ids, mask, is_completion, tree = scoring_batch(
        tok, tuple(prompts), tuple(completions), end, wte.device
    )
    every = lambda x: x.expand(*lead, *x.shape)  # the same rows for each model
    logp = sequence_logprobs(model, every(ids), every(mask), tree=tree.expand(*lead))
    return sequence_logp(logp, is_completion)  # (N, width-1) summed per row


@functools.lru_cache(maxsize=16)
def scoring_batch(
    tok: CharTokenizer, prompts: tuple[str, ...], completions: tuple[str, ...], end: bool, device
):
    """completion_logprobs' rows, kept: an exact evaluation scores the same pairs at every step.
    -> ids, key_mask (N, width), is_completion (N, width-1) bool (the targets that are completion
    tokens), and the prefix tree of ids[:, :-1]."""
    rows, n_prompt = [], []
    for p, c in zip(prompts, completions):
        head = tok.encode(p, bos=True)
        rows.append(head + tok.encode(c, eos=end))
        n_prompt.append(len(head))
    width = max(len(r) for r in rows)
    ids, mask = pad_left(rows, tok.pad_id, device)
    # the completion of row i occupies its last (len(row) - n_prompt) targets
    n_comp = torch.tensor([len(r) - n for r, n in zip(rows, n_prompt)], device=device)
    col = torch.arange(width - 1, device=device)[None, :]
    is_completion = col >= (width - 1 - n_comp)[:, None]  # (N, width-1)
    return ids, mask, is_completion, next_token_tree(ids, mask)
