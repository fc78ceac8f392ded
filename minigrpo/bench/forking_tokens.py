"""The forking tokens (Wang et al. 2506.01939, "the 80/20 rule"), measured exactly: the first
measurement of the bench's `entropy` section (entropy.py).

For each person's prompt, every completion with π ≥ 1e-4 (preserve.build_anchor_tree), each weighted
by its probability; at every state s the tree visits (a prompt and a completion prefix), the exact
entropy H(π(·|s)) over the full vocabulary and the visit weight w_s = P(the prefix)/prompts. A state
is visited w_s times per completion on average, so the visit-weighted states ARE the token
distribution of sampled completions: its top ρ = 20 % by entropy are the forking tokens, and their
share of Σ_s w_s·H_s is the share of all the entropy they carry.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minigrpo.bench.common import table
from minigrpo.lm.tokenizer import EOS_ID
from minigrpo.objectives.losses import entropy
from minigrpo.rl.preserve import build_anchor_tree

RHO = 0.2  # the forking share of 2506.01939
FORK = 0.1  # nats: a state with a real choice (the second most likely next character has >= ~2 %)


@dataclass
class State:
    prompt: int  # index of the prompt
    prefix: tuple  # completion ids so far
    weight: float  # visit weight: Σ of the tree weights of the rows through this state
    entropy: float  # exact H(π(·|state)), nats
    probs: torch.Tensor  # (V,) π(·|state)


@torch.no_grad()
def visited_states(tree) -> list[State]:
    """Every state a tree's rows pass through (an Anchor: gen, ref_logits, weights, group), with its
    visit weight and the exact entropy and next-token distribution of the logits stored there; in
    first-visit order."""
    logits = tree.ref_logits.double()
    ent, probs = entropy(logits), logits.softmax(-1)  # (M, T), (M, T, V)
    comp, mask, P = tree.gen.ids, tree.gen.completion_mask, tree.gen.prompt_len
    states: dict[tuple, State] = {}
    for r in range(comp.size(0)):
        ids, g, w = comp[r, P:].tolist(), int(tree.group[r]), float(tree.weights[r])
        for t in range(int(mask[r].sum())):
            key = (g, tuple(ids[:t]))
            if key not in states:
                states[key] = State(g, key[1], 0.0, float(ent[r, t]), probs[r, t])
            states[key].weight += w
    return list(states.values())


def top_share(
    states: list[State], rho: float = RHO
) -> tuple[list[tuple[State, float]], float, float]:
    """The top ρ share of the visit-weighted tokens by entropy -> ([(state, fraction of its visits
    in the share)], entropy threshold, the share of Σ w·H they carry). The state at the boundary is
    split (an exact quantile of the token distribution); the most entropic first."""
    ranked = sorted(states, key=lambda s: -s.entropy)
    total, room, picked = sum(s.weight for s in states), rho * sum(s.weight for s in states), []
    for s in ranked:
        if room <= 1e-12 * total:
            break
        frac = min(1.0, room / s.weight) if s.weight > 0 else 1.0
        picked.append((s, frac))
        room -= frac * s.weight
    mass = sum(s.weight * s.entropy for s in states)
    carried = sum(f * s.weight * s.entropy for s, f in picked)
    return (
        picked,
        (picked[-1][0].entropy if picked else float("inf")),
        carried / mass if mass > 0 else 0.0,
    )


def forking(model, tok, people: list[str], max_new: int) -> tuple[list[State], list, float, float]:
    """The visited states of every person's prompt under `model` and their top-ρ forking set
    (top_share)."""
    states = visited_states(
        build_anchor_tree(model, tok, [f"{p} likes " for p in people], 64, max_new)
    )
    return (states, *top_share(states))


def state_name(s: State, people, tok) -> str:
    return f"{people[s.prompt]} likes {tok.decode(list(s.prefix))}|"


def _dist(s: State, tok, k: int = 3) -> str:
    p, ids = s.probs.topk(k)
    return " ".join(
        f"{'<end>' if i == EOS_ID else tok.decode([i])}:{v:.2f}"
        for v, i in zip(p.tolist(), ids.tolist())
        if v >= 0.01
    )


def by_position(states: list[State], picked) -> list[list]:
    """Per completion position (0: the food's first letter): its share of the tokens, of the top-ρ
    set, and of the entropy, and the share of its tokens at a real fork (H >= FORK nats)."""
    total, mass, chosen = (
        sum(s.weight for s in states),
        sum(s.weight * s.entropy for s in states),
        dict(),
    )
    for s, f in picked:
        chosen[id(s)] = f
    rows = []
    for lo, hi, label in (
        (0, 1, "1st letter"),
        (1, 2, "2nd"),
        (2, 3, "3rd"),
        (3, 99, "4th and later, <end>"),
    ):
        at = [s for s in states if lo <= len(s.prefix) < hi]
        w = sum(s.weight for s in at)
        in_top = sum(chosen.get(id(s), 0) * s.weight for s in at) / (RHO * total)
        rows.append(
            [
                label,
                f"{w / total:.1%}",
                f"{in_top:.1%}",
                f"{sum(s.weight * s.entropy for s in at) / mass:.1%}",
                f"{sum(s.weight for s in at if s.entropy >= FORK) / w:.1%}" if w else "-",
            ]
        )
    return rows


def forking_table(label, states, picked, threshold, share, people, tok, rows: int = 8) -> str:
    """Where the top-ρ forking set lies, by position over every person, and the target person's most
    entropic states (prompt 0) with their next-character distributions."""
    mine = sorted((s for s in states if s.prompt == 0), key=lambda s: -s.weight * s.entropy)[:rows]
    lines = [
        [
            state_name(s, people, tok),
            f"{s.entropy:.3f}",
            f"{len(people) * s.weight:.3f}",
            _dist(s, tok),
        ]
        for s in mine
    ]
    return table(
        f"forking tokens of {label}: the top {RHO:.0%} of visit-weighted tokens by exact entropy "
        f"are {len(picked)} states with H >= {threshold:.3f} nats, carrying {share:.1%} of all the "
        "entropy",
        [
            "position",
            "share of tokens",
            "share of the top 20 %",
            "share of entropy",
            f"its tokens at a fork (H >= {FORK})",
        ],
        by_position(states, picked),
    ) + table(
        f"{people[0]}'s states carrying the most entropy, {label}",
        ["state", "H (nats)", "P(visit)", "next character"],
        lines,
    )
