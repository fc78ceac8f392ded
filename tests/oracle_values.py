"""The slow oracle of the exact prefix values (toy_tasks/value_tree.py, whose docstring states the
recursion and its source): the same backward recursion written plainly, one model at a time, in
Python over each prompt's support completions, prefixes as strings. Only the tests use it
(test_value_tree.py holds the tree to it, to rounding; test_critics.py and test_ppo.py check the
oracle critic's values and advantages with it); runs use the tree.

    values_at(model, tok, [(x, s), ...], prompts, support, table[, temperature, ref, beta])
        -> (M,) float64
    prefix_values(model, tok, rows, completion_ids, mask, prompts, support, table[, …]) -> (N, T)
"""

from __future__ import annotations

import math

import torch

from minigrpo.lm.logprobs import pad_left, sequence_logprobs
from minigrpo.lm.tokenizer import CharTokenizer
from toy_tasks.support import RewardTable


@torch.no_grad()
def value_tables(
    model,
    tok: CharTokenizer,
    needed: list[str],
    prompts: list[str],
    support,
    table: RewardTable,
    temperature: float = 1.0,
    ref=None,
    beta: float = 0.0,
) -> dict[str, tuple[dict[str, float], float]]:
    """For each prompt in `needed` (each one of `prompts`, the rows of `table`): ({prefix:
    V(prefix)} for every prefix of every support completion, the empty one and the whole completion
    included; r_off), from ONE forward over all their support completions. A prefix missing from the
    dict is worth r_off.

    The dicts are plain Python: at most 12 support completions × their ≤ 24 characters per prompt, a
    few hundred entries per prompt, and a rollout looks up N·T ≤ ~1000 prefixes per step: not a hot
    path."""
    device = model.wte.weight.device
    needed = list(dict.fromkeys(needed))  # distinct, in order
    pairs = [(x, y, prompts.index(x), k) for x in needed for k, y in enumerate(support(x))]
    ids, key_mask = pad_left(
        [tok.encode(x, bos=True) + tok.encode(y, eos=True) for x, y, *_ in pairs],
        tok.pad_id,
        device,
    )
    # (M, W-1): target j is token j+1
    logp = sequence_logprobs(model, ids, key_mask, temperature).double().cpu()
    ref_logp = (
        sequence_logprobs(ref, ids, key_mask, temperature).double().cpu()
        if ref is not None and beta
        else logp
    )
    # (read once: the loops below read each entry as a Python float, which on a GPU would be one
    # wait per entry)
    out = {}
    for x in needed:
        r_off = table.off_support[prompts.index(x)].item()
        # prefix -> {child: (π(c | x + s), β·k1(c))}
        edges: dict[str, dict[str, tuple[float, float]]] = {}
        for n, (x_n, y, i, k) in enumerate(pairs):
            if x_n != x:
                continue
            # the completion and its EOS are the last L + 1 targets, right-aligned
            W = logp.size(1) - (len(y) + 1)
            # from the state y[:t] to y[:t+1], or to the end (EOS) at t = L
            for t in range(len(y) + 1):
                lp, lr = logp[n, W + t].item(), ref_logp[n, W + t].item()
                child = y[: t + 1] if t < len(y) else y + "\0"  # "\0": the line ended here
                edges.setdefault(y[:t], {}).setdefault(child, (math.exp(lp), beta * (lp - lr)))
            edges[y + "\0"] = table.support[i, k].item()  # a leaf: the reward
        values: dict[str, float] = {}
        for s in sorted(edges, key=len, reverse=True):  # children before parents
            kids = edges[s]
            if not isinstance(kids, dict):
                values[s] = kids
                continue
            mass = sum(p for p, _ in kids.values())
            values[s] = (
                sum(p * (values[c] - kl) for c, (p, kl) in kids.items()) + (1 - mass) * r_off
            )
        out[x] = ({s: v for s, v in values.items() if not s.endswith("\0")}, r_off)
    return out


def values_at(
    model,
    tok: CharTokenizer,
    pairs: list[tuple[str, str]],
    prompts: list[str],
    support,
    table: RewardTable,
    temperature: float = 1.0,
    ref=None,
    beta: float = 0.0,
) -> torch.Tensor:
    """V(prefix) under `model` for each (prompt, prefix) pair (prompts among `prompts`) -> (M,)
    float64."""
    tables = value_tables(
        model, tok, [x for x, _ in pairs], prompts, support, table, temperature, ref, beta
    )
    return torch.tensor([tables[x][0].get(s, tables[x][1]) for x, s in pairs], dtype=torch.float64)


def prefix_values(
    model,
    tok: CharTokenizer,
    rows: list[str],
    completion_ids: torch.Tensor,
    mask: torch.Tensor,
    prompts: list[str],
    support,
    table: RewardTable,
    temperature: float = 1.0,
    ref=None,
    beta: float = 0.0,
) -> torch.Tensor:
    """The oracle critic on a rollout: rows (N,) each row's prompt (RolloutBatch.prompts),
    completion_ids (N, T), mask (N, T) bool (valid up to and including EOS) -> (N, T) float32 on
    mask's device, entry t = V(the state before completion token t) = V(prefix of the row's first t
    tokens); 0 where masked (the layout of PPO's learned critics)."""
    tables = value_tables(model, tok, rows, prompts, support, table, temperature, ref, beta)
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for n, (x, ids, valid) in enumerate(zip(rows, completion_ids.tolist(), mask.tolist())):
        values, r_off = tables[x]
        prefix = ""
        for t in range(sum(valid)):  # valid tokens come first; EOS, if any, is the last of them
            out[n, t] = values.get(prefix, r_off)
            prefix += tok.itos.get(ids[t], "\0")  # a special id never extends a support completion
    return out.to(device=mask.device, dtype=torch.float32)
