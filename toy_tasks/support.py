"""Exact expected reward of ANY reward spec over a task's enumerable support.

A task that can list the completions it declares for a prompt (`support(prompt)`: food, the 12
foods; arithmetic, the 12 declared answers v-1, v, v+1 in four writings) knows, by teacher forcing,
the exact probability π(y | x) of each of them. For any reward r(x, y), custom `file.py:function`
included:

    exact_reward  = mean_x Σ_{y ∈ S(x)} π(y|x) · r(x, y)        the expected reward ON the support,
                  exact
    off_support   = mean_x (1 − Σ_{y ∈ S(x)} π(y|x))            the mass outside it (food: malformed
                  lines)
    best_reward   = mean_x max_{y ∈ S(x)} r(x, y)               the best reward reachable on the
                  support
    target_rate   = mean_x Σ_{y ∈ S(x): r(x,y) = best(x)} π(y|x)  the exact probability of a best
                  completion

    pass_at_8     = mean_x 1 − (1 − P(a best completion | x))^8   exact pass@8 (Chen et al.
                  2107.03374)

E[r] over all completions is exact_reward + off_support · r̄_off, where r̄_off is the reward
averaged over the off-support completions (π-weighted): known only where the reward is constant off
the support (every food reward: 0 for pizza and food:<food>, −1 for graded). `reward_table` probes
it on the task's OFF_SUPPORT_PROBES (e.g. an empty line and a misspelling) and keeps the lowest
value, with a flag saying whether the probes agreed (where they do not, every figure that uses it is
a bound). The reward is assumed deterministic: it is called once per (prompt, completion) pair when
the run starts.

target_rate is what a run steers towards without being told what the reward wants: for `food:<f>`
(or a custom reward that pays 1 for one food) it is exactly P(f); for arithmetic's correct+format it
is P(the right, well-formed answer). Ties count together (a reward constant on the support makes
every well-formed completion a best one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minigrpo.exact.frontier import pass_at_k
from toy_tasks.rewards import score


@dataclass
class RewardTable:
    """A reward evaluated once on everything exact evaluation needs."""

    support: torch.Tensor  # (P, K) float64: r(x, y) for each prompt's K support completions
    off_support: torch.Tensor  # (P,) float64: the lowest reward of the off-support probes
    # the probes agreed on every prompt (the off-support value is then exact for food rewards)
    off_constant: bool


def reward_table(
    reward, prompts: list[str], support, probes: tuple[str, ...] = ("",), progress=None
) -> RewardTable:
    """The reward on each prompt's support completions (`support(prompt)` lists them) and on the
    off-support `probes`. A reward that raises or returns a non-finite value raises RewardError
    naming the pair. A slow reward calls `progress(done, total)` as rewards.score does, over the
    support and the probes together."""
    rows = [support(p) for p in prompts]
    n_support, n = sum(map(len, rows)), sum(map(len, rows)) + len(prompts) * len(probes)
    flat = score(
        reward,
        [p for p, ys in zip(prompts, rows) for _ in ys],
        [y for ys in rows for y in ys],
        [True] * n_support,
        progress=progress and (lambda k, _: progress(k, n)),
    )
    off = torch.tensor(
        score(
            reward,
            [p for p in prompts for _ in probes],
            [y for _ in prompts for y in probes],
            [True] * len(prompts) * len(probes),
            progress=progress and (lambda k, _: progress(n_support + k, n)),
        ),
        dtype=torch.float64,
    ).view(len(prompts), -1)
    return RewardTable(
        padded(flat, list(map(len, rows))), off.min(dim=1).values, bool((off == off[:, :1]).all())
    )


def padded(flat: list[float], sizes: list[int]) -> torch.Tensor:
    """Rows of `sizes` values taken in turn from `flat` -> (len(sizes), max(sizes)) float64, a
    shorter row padded with its own lowest value (a task whose supports differ in size gives those
    slots probability 0, so they change no figure; every row full: the plain reshape)."""
    out = torch.zeros(len(sizes), max(sizes, default=0), dtype=torch.float64)
    start = 0
    for i, k in enumerate(sizes):
        row = torch.tensor(flat[start : start + k], dtype=torch.float64)
        out[i, :k], out[i, k:], start = row, row.min() if k else 0.0, start + k
    return out


def reward_figures(
    probs: torch.Tensor, rewards: torch.Tensor, atol: float = 1e-9
) -> dict[str, float]:
    """probs (P, K) exact π(y|x) over each prompt's support, rewards (P, K) -> the module's figures
    (means over the P prompts)."""
    return reward_figures_many(probs[None], rewards, atol)[0]


def reward_figures_many(
    probs: torch.Tensor, rewards: torch.Tensor, atol: float = 1e-9
) -> list[dict[str, float]]:
    """reward_figures of each of M policies, probs (M, P, K), in one computation and one read."""
    probs = probs.to(torch.float64)
    best = rewards.max(dim=1, keepdim=True).values  # (P, 1)
    p_best = (probs * (rewards >= best - atol)).sum(-1)  # (M, P) P(a best completion | x)
    names = ("exact_reward", "off_support", "best_reward", "target_rate", "pass_at_8")
    figures = torch.stack(
        [
            (probs * rewards).sum(-1).mean(-1),
            (1 - probs.sum(-1)).clamp(min=0).mean(-1),
            best.mean().to(probs).expand(probs.size(0)),
            p_best.mean(-1),
            pass_at_k(p_best.clamp(max=1), 8).mean(-1),
        ],
        1,
    )  # (M, 5)
    return [dict(zip(names, row)) for row in figures.tolist()]


def peak_text(ev: dict, name: str, digits: int) -> str:
    """' (peak x)': a run's highest value so far of an evaluation's figure (rl/stopping.Peaks logs
    it as peak_<name>), for a task's closing line; '' where it is not known."""
    peak = ev.get(f"peak_{name}")
    return "" if peak is None else f" (peak {peak:.{digits}f})"
