"""The oracle critic: the exact value of every completion prefix under the current policy.

In a world whose completions are enumerable (food: the 12 foods; arithmetic: the 12 declared answers of
each prompt, `support(prompt)`), the value of the state "prompt x, then the prefix s" under π is

    V(s) = Σ_{y ∈ S(x), y extends s} π(y + EOS | x + s)·r(x, y)
           + (1 − Σ_{y ∈ S(x), y extends s} π(y + EOS | x + s))·r_off(x)

and a prefix that no support completion extends is worth r_off(x). One teacher-forced forward over
(x + y + EOS) for every support completion y gives every π(y + EOS | x + s) at once: with ℓ_j the
log-prob of y's j-th token (EOS last), π(y + EOS | x + y[:t]) = exp(Σ_{j ≥ t} ℓ_j), the sum of the
suffix from t (the support completions sharing the prefix s share its first t characters). V satisfies
the one-step consistency V(s) = Σ_c π(c | x + s)·V(s + c) with V(s + EOS) = r(x, s) on the support and
r_off(x) off it (tests/test_oracle.py checks it on a real model).

Exact where the reward is constant off the support (every food reward: 0 for pizza and food:<food>,
−1 for graded; the run's `RewardTable.off_constant` says whether its probes agreed). Elsewhere r_off is
the lowest probed off-support reward and V is a lower bound. V values the task reward only: PPO's
per-token KL penalty −β·(log π_old − log π_ref) is not in it (its expected remainder would need the
off-support continuations); at β = 0 V is the exact value of PPO's return.

Source: the exact value of a prefix is what VinePPO (Kazemnejad et al. 2410.01679) estimates by Monte
Carlo rollouts from each intermediate state; here enumeration makes it exact.

    values_at(model, tok, [(x, s), ...], prompts, support, table)                       -> (M,) float64
    prefix_values(model, tok, rows, completion_ids, mask, prompts, support, table)      -> (N, T)
"""

from __future__ import annotations

import math

import torch

from minigrpo.lm.logprobs import pad_left, sequence_logprobs
from minigrpo.lm.tokenizer import CharTokenizer
from toy_tasks.support import RewardTable


@torch.no_grad()
def value_tables(model, tok: CharTokenizer, needed: list[str], prompts: list[str], support,
                 table: RewardTable, temperature: float = 1.0) -> dict[str, tuple[dict[str, float], float]]:
    """For each prompt in `needed` (each one of `prompts`, the rows of `table`): ({prefix: V(prefix)} for
    every prefix of every support completion, the empty one and the whole completion included; r_off),
    from ONE forward over all their support completions. A prefix missing from the dict is worth r_off.

    The dicts are plain Python: at most 12 support completions × their ≤ 24 characters per prompt, a few
    hundred entries per prompt, and a rollout looks up N·T ≤ ~1000 prefixes per step: not a hot path."""
    device = model.wte.weight.device
    needed = list(dict.fromkeys(needed))  # distinct, in order
    pairs = [(x, y, prompts.index(x), k) for x in needed for k, y in enumerate(support(x))]
    heads = [tok.encode(x, bos=True) for x, *_ in pairs]
    ids, key_mask = pad_left([h + tok.encode(y, eos=True) for h, (_, y, _, _) in zip(heads, pairs)], tok.pad_id, device)
    logp = sequence_logprobs(model, ids, key_mask, temperature).double()  # (M, W-1): target j is token j+1
    # the completion (and its EOS) is right-aligned: its L + 1 tokens are the last L + 1 targets
    from_here = logp.flip(1).cumsum(1).flip(1).tolist()  # (M, W-1): Σ of the targets from column j to the end
    W1 = logp.size(1)
    mass: dict[str, dict[str, list[float]]] = {x: {} for x in needed}  # prefix -> [Σ π·r, Σ π]
    for (x, y, i, k), row in zip(pairs, from_here):
        r = table.support[i, k].item()
        for t in range(len(y) + 1):  # the state after the prefix y[:t]: y's tokens t..L-1, then EOS
            p = math.exp(row[W1 - (len(y) + 1) + t])  # π(y[t:] + EOS | x + y[:t])
            acc = mass[x].setdefault(y[:t], [0.0, 0.0])
            acc[0] += p * r
            acc[1] += p
    out = {}
    for x in needed:
        r_off = table.off_support[prompts.index(x)].item()
        out[x] = ({s: pr + (1 - p) * r_off for s, (pr, p) in mass[x].items()}, r_off)
    return out


def values_at(model, tok: CharTokenizer, pairs: list[tuple[str, str]], prompts: list[str], support,
              table: RewardTable, temperature: float = 1.0) -> torch.Tensor:
    """V(prefix) under `model` for each (prompt, prefix) pair (prompts among `prompts`) -> (M,) float64."""
    tables = value_tables(model, tok, [x for x, _ in pairs], prompts, support, table, temperature)
    return torch.tensor([tables[x][0].get(s, tables[x][1]) for x, s in pairs], dtype=torch.float64)


def prefix_values(model, tok: CharTokenizer, rows: list[str], completion_ids: torch.Tensor, mask: torch.Tensor,
                  prompts: list[str], support, table: RewardTable, temperature: float = 1.0) -> torch.Tensor:
    """The oracle critic on a rollout: rows (N,) each row's prompt (RolloutBatch.prompts), completion_ids
    (N, T), mask (N, T) bool (valid up to and including EOS) -> (N, T) float32 on mask's device, entry t =
    V(the state before completion token t) = V(prefix of the row's first t tokens); 0 where masked
    (the layout of PPO's learned critics)."""
    tables = value_tables(model, tok, rows, prompts, support, table, temperature)
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for n, (x, ids, valid) in enumerate(zip(rows, completion_ids.tolist(), mask.tolist())):
        values, r_off = tables[x]
        prefix = ""
        for t in range(sum(valid)):  # valid tokens come first; EOS, if any, is the last of them
            out[n, t] = values.get(prefix, r_off)
            prefix += tok.itos.get(ids[t], "\0")  # a special id never extends a support completion
    return out.to(device=mask.device, dtype=torch.float32)
