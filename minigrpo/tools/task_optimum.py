"""The exact optimum of a task of many prompts (arithmetic, sums): what `python -m minigrpo.optimum
--task <task>` computes, from the task's contract (toy_tasks/contract.py) alone.

Each RL prompt's outcome space is its declared support (`support(prompt)`) plus ONE malformed
bucket: π_ref is the checkpoint's exact teacher-forced probability of each completion + end token,
the bucket 1 − their sum; the support's rewards come from the reward itself (support.reward_table),
the bucket's from the task's OFF_SUPPORT_PROBES (their lowest value; exact where they agree and the
reward is constant off the support). The optimum and its frontier over the prompts are
exact/many_prompts.py's; a task that measures its own figures of a policy given over its supports
(`exact_figures_many(probs (M, P, K), prompts)`, sums: think rate, accuracy, lengths, pass@k) gets
them for π*_β too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from minigrpo.exact import many_prompts as M
from minigrpo.lm.logprobs import completion_logprobs
from toy_tasks.support import padded, reward_table


@dataclass
class TaskProblem:
    """The many-prompt problem: rows (P, K + 1), the last slot each prompt's malformed bucket."""

    prompts: list[str]
    outcomes: list[list[str]]  # each prompt's support, in order (the bucket not named)
    p_ref: torch.Tensor  # (P, K + 1) float64, each row sums to 1
    r: torch.Tensor  # (P, K + 1) float64
    probes: dict  # {probe: its lowest reward over the prompts}
    off_constant: bool  # the probes agreed on every prompt


@torch.no_grad()
def reference_rows(model, tok, prompts: list[str], support, chunk: int = 8192) -> torch.Tensor:
    """π_ref over each prompt's support (padded with 0 to the longest) and its malformed bucket ->
    (P, K + 1) float64, rows renormalised against float rounding (the bucket clamped at 0)."""
    rows = [support(p) for p in prompts]
    xs = [p for p, ys in zip(prompts, rows) for _ in ys]
    ys = [y for ys in rows for y in ys]
    logp = torch.cat(
        [
            completion_logprobs(model, tok, xs[i : i + chunk], ys[i : i + chunk])
            for i in range(0, len(xs), chunk)
        ]
    )
    on = padded(logp.double().exp().tolist(), list(map(len, rows)))
    # padded() fills a short row with its lowest value: those slots hold no completion
    real = torch.arange(on.size(1))[None] < torch.tensor(list(map(len, rows)))[:, None]
    on = torch.where(real, on, 0.0)
    p = torch.cat([on, (1 - on.sum(1, keepdim=True)).clamp(min=0)], 1)
    return p / p.sum(1, keepdim=True)


def task_problem(task, model, tok, reward) -> TaskProblem:
    """The problem of `task`'s RL prompts under `reward` (RewardError if it fails)."""
    prompts = list(task.rl_prompts(SimpleNamespace(person=None)))
    table = reward_table(reward, prompts, task.support, task.OFF_SUPPORT_PROBES)
    p_ref = reference_rows(model, tok, prompts, task.support)
    r = torch.cat([table.support, table.off_support[:, None]], 1)
    probes = {y: min(reward(p, y) for p in prompts) for y in task.OFF_SUPPORT_PROBES}
    return TaskProblem(
        prompts, [task.support(p) for p in prompts], p_ref, r, probes, table.off_constant
    )


def figures(task, prob: TaskProblem, betas: list[float]) -> list[dict]:
    """At each β: E*[r], KL*, P(a best outcome) (the mean over prompts) and, where the task measures
    them (exact_figures_many), its own figures of π*_β over the supports (the bucket: malformed)."""
    pis = torch.stack([M.optimum_rows(prob.p_ref, prob.r, b) for b in betas])  # (B, P, K + 1)
    line = M.frontier_rows(prob.p_ref, prob.r, betas)
    best = M.best_mass(pis, prob.p_ref, prob.r)
    own = getattr(task, "exact_figures_many", None)
    world = own(pis[..., :-1], prob.prompts) if own else [{} for _ in betas]
    return [
        {"beta": b, "kl": k, "expected_reward": e, "p_best": p, **w}
        for b, k, e, p, w in zip(
            line["beta"].tolist(),
            line["kl"].tolist(),
            line["expected_reward"].tolist(),
            best.tolist(),
            world,
        )
    ]


def prompt_rows(prob: TaskProblem, prompt: str, beta: float, floor: float = 1e-3) -> list[tuple]:
    """One prompt's outcomes (the bucket as '<malformed>') as (outcome, r, π_ref, π*_β), those with
    π_ref or π*_β ≥ floor, most likely under π*_β first; ValueError for a prompt not among them."""
    i = prob.prompts.index(prompt)
    pi = M.optimum_rows(prob.p_ref[i : i + 1], prob.r[i : i + 1], beta)[0]
    names = [*prob.outcomes[i], "<malformed>"]
    slots = [*range(len(prob.outcomes[i])), prob.p_ref.size(1) - 1]
    rows = [
        (names[j], prob.r[i, s].item(), prob.p_ref[i, s].item(), pi[s].item())
        for j, s in enumerate(slots)
    ]
    return sorted((x for x in rows if max(x[2], x[3]) >= floor), key=lambda x: -x[3])


def mean_log_z(prob: TaskProblem, beta: float) -> float:
    """mean_x log Z_β(x): β times it is the optimal mean objective J_β(π*_β)."""
    return sum(M.F.optimum_figures(p, v, beta)["log_z"] for p, v in zip(prob.p_ref, prob.r)) / len(
        prob.prompts
    )


def _short(name: str) -> str:
    return name.removeprefix("exact_")


def figures_table(rows: list[dict]) -> list[str]:
    """The lines of a table of `figures` rows: β, the means KL*, E*[r], P(best), then the task's own
    figures of π*_β, a column each."""
    own = [k for k in rows[0] if k not in ("beta", "kl", "expected_reward", "p_best")]
    widths = [max(len(_short(k)), 6) for k in own]
    lines = [
        f"{'β':>7} {'KL':>8} {'E[r]':>8} {'P(best)':>8} "
        + " ".join(f"{_short(k):>{w}}" for k, w in zip(own, widths))
    ]
    for row in rows:
        b = row["beta"]
        beta = "∞" if b == M.F.INF else "→ 0" if b == 0 else f"{b:g}"
        lines.append(
            f"{beta:>7} {row['kl']:>8.4f} {row['expected_reward']:>8.4f} {row['p_best']:>8.4f} "
            + " ".join(f"{row[k]:>{w}.4f}" for k, w in zip(own, widths))
        )
    return [line.rstrip() for line in lines]


def head(task, prob: TaskProblem, reward: str, init: str) -> str:
    """The first lines: what is solved, on which prompts, and the malformed bucket's reward."""
    sizes = sorted(map(len, prob.outcomes))
    size = f"{sizes[0]}" + ("" if sizes[0] == sizes[-1] else f" to {sizes[-1]}")
    shown = ", ".join(f"r({k!r}) = {v:g}" for k, v in prob.probes.items())
    exact = "constant off the support; exact" if prob.off_constant else "NOT constant: a bound"
    return (
        f"exact optimum of J_β = mean_x (E[r] − β·KL(π(·|x)‖π_ref(·|x))) over the "
        f"{len(prob.prompts)} RL prompts of task {task.NAME}, each over its declared support "
        f"({size} completions) and one malformed bucket ({shown}: {exact}); "
        f"reward {reward!r}, π_ref {init}; figures are means over the prompts"
    )


def jsonable(row: dict) -> dict:
    """`row` with every non-finite number None (strict JSON): a conditional length of no mass is
    NaN, β = ∞ is π_ref."""
    finite = lambda v: not isinstance(v, float) or math.isfinite(v)
    return {k: v if finite(v) else None for k, v in row.items()}
