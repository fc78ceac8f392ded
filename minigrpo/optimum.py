"""The exact KL-regularised optimum and reward–KL frontier of one food-world prompt, or of every RL
prompt of another task (arithmetic, sums) at one β.

    python -m minigrpo.optimum --reward pizza                  # the frontier table ->
                                                               # runs/optimum-pizza/frontier.png
    python -m minigrpo.optimum --reward pizza --beta 0.1       # π_ref and π*_β outcome by outcome,
                                                               # E*[r], KL*, log Z
    python -m minigrpo.optimum --reward graded --beta 0.1 --json   # one JSON object on stdout

The outcome space of "<person> likes " is the 12 foods plus ONE malformed bucket "<malformed>":
π_ref is the checkpoint's exact teacher-forced probability of each food + end token, and the bucket
holds the rest, 1 − Σ foods. The foods' rewards come from the reward itself (`reward_table`), the
bucket's from calling it on malformed completions ("" and "pizzza"): every food reward is constant
there (0 for pizza and food:<food>, −1 for graded), and then every figure is exact. A reward that
differs on the two probes is not constant off the support: the bucket takes the lower value and the
output says the malformed figures are then a bound (a lower bound on the frontier, if no malformed
completion pays less). The math is minigrpo/exact/frontier.py (π*_β ∝ π_ref·e^{r/β}; Rafailov et al.
2305.18290 eq. 4).

    python -m minigrpo.optimum --task sums --reward correct      # every RL prompt's optimum at
                                                                 # one β: the mean frontier
    python -m minigrpo.optimum --task sums --beta 0.1 --prompt 3+4+2=

A task of many prompts (arithmetic, sums) solves each RL prompt over its declared support plus one
malformed bucket, at one β for all (the maximiser of the mean objective), and tabulates the means
over the prompts, with the task's own figures of π*_β where it measures them (sums: accuracy, think
rate, lengths, pass@k, entropy, malformed): minigrpo/tools/task_optimum.py, exact/many_prompts.py.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minigrpo.exact import frontier as F
from minigrpo.lm.checkpoint import CheckpointError, load_checkpoint
from minigrpo.tools import task_optimum as T
from minigrpo.tools.frontier_figure import draw_frontier, number, spread_marks
from minigrpo.util.cli import UsageError, main_guard, meta, parse_config, require
from minigrpo.util.runtime import setup_runtime
from toy_tasks import default_pretrain_dir, food, get_task
from toy_tasks.rewards import RewardError, make_reward, score
from toy_tasks.support import reward_table

MALFORMED = "<malformed>"
OUTCOMES = [*food.FOODS, MALFORMED]
# an empty line and a misspelling: both outside the 12 foods
MALFORMED_PROBES = food.OFF_SUPPORT_PROBES
TABLE_BETAS = [math.inf, 10, 3, 1, 0.5, 0.3, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03, 0.01, 1e-3, 0.0]


@dataclass
class OptimumConfig:
    reward: str | None = field(
        default=None,
        metadata=meta(
            "reward spec, as in grpo (food: pizza, food:<food>, graded, ...; default: the task's, "
            "food pizza, sums correct)"
        ),
    )
    person: str = field(
        default="ravin", metadata=meta("food: whose prompt '<person> likes ' to solve")
    )
    prompt: str | None = field(
        default=None,
        metadata=meta(
            "another task, with --beta: the RL prompt to show outcome by outcome (default: the "
            "first)"
        ),
    )
    init: str | None = field(
        default=None,
        metadata=meta(
            "the reference policy π_ref, a checkpoint (default: runs/pretrain/model.pt, "
            "runs/pretrain-<task>/model.pt for another task)"
        ),
    )
    beta: float | None = field(
        default=None,
        metadata=meta(
            "show π*_β at this β > 0 (default: the whole frontier, as a table and frontier.png)"
        ),
    )
    task: str = field(
        default="food",
        metadata=meta("toy task: food (one prompt), or one of many prompts (arithmetic, sums)"),
    )
    json: bool = field(default=False, metadata=meta("print one JSON object instead of text"))
    out: str | None = field(
        default=None,
        metadata=meta(
            "folder for frontier.png (default: runs/optimum-<reward>, plus -<person> for another "
            "person; runs/optimum-<task>-<reward> for another task)"
        ),
    )


def check_config(cfg: OptimumConfig) -> None:
    """One-line UsageErrors for what needs no model to be judged; fills in the task's reward and
    --init where not given."""
    try:
        task = get_task(cfg.task)
    except ValueError as e:
        raise UsageError(str(e)) from None
    cfg.reward = cfg.reward or task.RL_DEFAULTS.get("reward", "pizza")
    cfg.init = cfg.init or f"{default_pretrain_dir(cfg.task)}/model.pt"
    if cfg.task != "food" and cfg.prompt is not None and cfg.prompt not in task.rl_prompts(cfg):
        raise UsageError(
            f"--prompt {cfg.prompt!r} is not an RL prompt of task {cfg.task} (e.g. "
            f"{', '.join(task.rl_prompts(cfg)[:3])})"
        )
    if cfg.task == "food" and cfg.prompt is not None:
        raise UsageError("--prompt is for a task of many prompts; food's prompt is --person's")
    if cfg.person not in food.PEOPLE:
        raise UsageError(f"unknown --person {cfg.person!r} (available: {', '.join(food.PEOPLE)})")
    require(
        cfg,
        "beta",
        cfg.beta is None or (math.isfinite(cfg.beta) and cfg.beta > 0),
        "a finite number > 0",
    )


def outcome_space(model, tokenizer, reward, person: str) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """π_ref (13,) and r (13,) float64 over OUTCOMES for "<person> likes ", and {probe: reward} of
    the malformed probes (the bucket's reward is their minimum). RewardError if the reward fails."""
    text = food.prompt(person)
    p_ref = food.outcomes(food.exact_distribution(model, tokenizer, person))
    n = len(MALFORMED_PROBES)
    probes = dict(
        zip(MALFORMED_PROBES, score(reward, [text] * n, list(MALFORMED_PROBES), [True] * n))
    )
    table = reward_table(reward, [text], food.support, MALFORMED_PROBES)
    r = torch.cat([table.support[0], table.off_support])
    return p_ref / p_ref.sum(), r, probes


def load_model(cfg: OptimumConfig):
    """-> (task, reward, model, tokenizer): the checks, the reward, the checkpoint (of cfg.task), as
    one-line UsageErrors."""
    check_config(cfg)
    setup_runtime(1, "cpu")
    task = get_task(cfg.task)
    try:
        reward = make_reward(cfg.reward, task.REWARDS, task.REWARD_HELP)
    except RewardError as e:
        raise UsageError(str(e)) from None
    try:
        model, tok, info = load_checkpoint(cfg.init, "cpu")
    except CheckpointError as e:
        how = "" if cfg.task == "food" else f" --task {cfg.task}"
        raise UsageError(
            f"{e} (make one with: python -m minigrpo.pretrain{how}, or pass --init)"
        ) from None
    if info.get("task", "food") != cfg.task:
        raise UsageError(
            f"--init {cfg.init} is a {info.get('task', 'food')} model; the optimum of task "
            f"{cfg.task} needs a {cfg.task} model"
        )
    return task, reward, model, tok


def finite_span(cfg: OptimumConfig, r: torch.Tensor) -> None:
    if not math.isfinite(r.max().item() - r.min().item()):
        raise UsageError(
            f"reward {cfg.reward!r} spans {r.min().item():g} to {r.max().item():g} over the "
            "outcomes: more than a float holds; rescale it (the optimum depends on r/β only)"
        )


def load_problem(cfg: OptimumConfig):
    """The food task's -> (p_ref, r, probes), every mistake a one-line UsageError."""
    if cfg.task != "food":
        raise UsageError(f"--task {cfg.task} has many prompts: load_task_problem solves it")
    _, reward, model, tok = load_model(cfg)
    try:
        p_ref, r, probes = outcome_space(model, tok, reward, cfg.person)
    except RewardError as e:
        raise UsageError(str(e)) from None
    finite_span(cfg, r)
    return p_ref, r, probes


def load_task_problem(cfg: OptimumConfig):
    """A task of many prompts' -> (task, tools/task_optimum.TaskProblem), mistakes one line."""
    task, reward, model, tok = load_model(cfg)
    try:
        prob = T.task_problem(task, model, tok, reward)
    except RewardError as e:
        raise UsageError(str(e)) from None
    finite_span(cfg, prob.r)
    return task, prob


def malformed_note(probes: dict) -> str:
    shown = ", ".join(f"r({k!r}) = {v:g}" for k, v in probes.items())
    if len(set(probes.values())) == 1:
        return (
            f"malformed bucket: reward {min(probes.values()):g} ({shown}: constant off the "
            "support; exact)"
        )
    return (
        f"malformed bucket: reward {min(probes.values()):g}, the lower of {shown}: the reward is "
        "NOT constant off the support, so the malformed figures are a bound (a lower bound on the "
        "frontier if no malformed completion pays less)"
    )


def target_of(p_ref: torch.Tensor, r: torch.Tensor) -> str | None:
    """The outcome of highest reward (on π_ref's support) when it is unique, else None."""
    best = [
        o
        for o, p, v in zip(OUTCOMES, p_ref.tolist(), r.tolist())
        if p > 0 and v == r[p_ref > 0].max()
    ]
    return best[0] if len(best) == 1 else None


def frontier_points(p_ref, r, betas=None) -> list[dict]:
    """The frontier's points: beta (None for ∞), kl, expected_reward, and p_target when the best is
    unique."""
    f = F.frontier(p_ref, r, betas)
    target = target_of(p_ref, r)
    rows = []
    for b, k, e in zip(f["beta"].tolist(), f["kl"].tolist(), f["expected_reward"].tolist()):
        row = {"beta": None if b == math.inf else b, "kl": k, "expected_reward": e}
        if target is not None:
            row["p_target"] = F.optimum(p_ref, r, b)[OUTCOMES.index(target)].item()
        rows.append(row)
    return rows


def out_dir(cfg: OptimumConfig) -> Path:
    slug = "".join(c if c.isalnum() else "-" for c in cfg.reward.split("/")[-1]).strip("-")[:40]
    whose = f"-{cfg.person}" if cfg.person != "ravin" else ""
    task = "" if cfg.task == "food" else f"{cfg.task}-"
    path = Path(cfg.out or f"runs/optimum-{task}{slug}" + (whose if not task else ""))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            f"--out {str(path)!r} cannot be created: {e.strerror or e}; give a writable folder"
        ) from None
    return path


def named(values) -> dict:
    return dict(zip(OUTCOMES, values.tolist()))


def show_optimum(cfg: OptimumConfig, p_ref, r, common: dict, head: str) -> None:
    """--beta B: each outcome under π_ref and π*_β, then E*[r], KL* and log Z_β."""
    pi, fig = F.optimum(p_ref, r, cfg.beta), F.optimum_figures(p_ref, r, cfg.beta)
    if not math.isfinite(fig["log_z"]):  # log Z_β = max r/β + ...: past float64's range
        top = float(r.abs().max())
        raise UsageError(
            f"--beta {cfg.beta!r} is too small for float64 with rewards up to {top:g}: log Z_β = "
            f"max r/β + log E_ref[exp((r − max r)/β)] overflows; allowed: β ≥ {top / 1e308:.3g}"
        )
    if cfg.json:
        print(
            json.dumps(
                {**common, "beta": cfg.beta, **fig, "distribution": named(pi)}, allow_nan=False
            )
        )
        return
    print(f"{head}\n\n{'outcome':<12} {'r':>7} {'π_ref':>9} {'π*_β':>9}")
    for o, v, a, b in zip(OUTCOMES, r.tolist(), p_ref.tolist(), pi.tolist()):
        print(f"{o:<12} {v:>7.3g} {a:>9.4g} {b:>9.4g}")
    print(
        f"\nβ {cfg.beta:g}: E*[r] {number(fig['expected_reward'])} | KL(π*_β‖π_ref) "
        f"{fig['kl']:.4f} | "
        f"log Z_β {number(fig['log_z'])} | J* = β·log Z_β {number(cfg.beta * fig['log_z'])}"
    )


def show_frontier(cfg: OptimumConfig, p_ref, r, common: dict, head: str) -> None:
    """No --beta: the frontier as a table over TABLE_BETAS, and frontier.png (or its points as
    JSON)."""
    points, table, target = (
        frontier_points(p_ref, r),
        frontier_points(p_ref, r, TABLE_BETAS),
        target_of(p_ref, r),
    )
    path = out_dir(cfg) / "frontier.png"
    draw_frontier(
        points,
        spread_marks(table),
        path,
        f"{food.prompt(cfg.person)!r}, reward {cfg.reward!r}: the exact reward–KL frontier",
    )
    if cfg.json:
        print(
            json.dumps(
                {**common, "target": target, "points": points, "figure": str(path)}, allow_nan=False
            )
        )
        return
    print(
        f"{head}\n\n{'β':>7} {'KL':>8} {'E[r]':>8}"
        + (f" {'P(' + target + ')':>11}" if target else "")
    )
    for p in table:
        beta = "∞" if p["beta"] is None else ("→ 0" if p["beta"] == 0 else f"{p['beta']:g}")
        tail = f" {p['p_target']:>11.4f}" if target else ""
        print(f"{beta:>7} {p['kl']:>8.4f} {number(p['expected_reward']):>8}{tail}")
    print(f"wrote {path} (β = ∞ is π_ref; KL beyond the β → 0 row buys no more reward)")


def show_task(cfg: OptimumConfig) -> None:
    """A task of many prompts: without --beta the mean frontier over TABLE_BETAS and frontier.png;
    with --beta its figures and one prompt outcome by outcome (--json: one object)."""
    task, prob = load_task_problem(cfg)
    text = T.head(task, prob, cfg.reward, cfg.init)
    common = {
        "task": cfg.task,
        "reward": cfg.reward,
        "init": cfg.init,
        "prompts": len(prob.prompts),
    }
    common |= {"malformed_probes": prob.probes, "malformed_exact": prob.off_constant}
    if cfg.beta is None:
        rows = T.figures(task, prob, TABLE_BETAS)
        line = T.M.frontier_rows(prob.p_ref, prob.r)
        as_point = lambda b, k, e: {
            "beta": None if b == math.inf else b,
            "kl": k,
            "expected_reward": e,
        }
        points = [
            as_point(*x)
            for x in zip(*(line[n].tolist() for n in ("beta", "kl", "expected_reward")))
        ]
        marks = spread_marks([as_point(r["beta"], r["kl"], r["expected_reward"]) for r in rows])
        path = out_dir(cfg) / "frontier.png"
        title = f"task {cfg.task}, reward {cfg.reward!r}: the exact mean reward–KL frontier"
        draw_frontier(points, marks, path, title)
        if cfg.json:
            rows = [T.jsonable(r) for r in rows]
            print(json.dumps({**common, "table": rows, "figure": str(path)}, allow_nan=False))
            return
        print(f"{text}\n\n" + "\n".join(T.figures_table(rows)))
        print(f"wrote {path} (β = ∞ is π_ref; KL beyond the β → 0 row buys no more reward)")
        return
    log_z = T.mean_log_z(prob, cfg.beta)
    if not math.isfinite(log_z):
        raise UsageError(f"--beta {cfg.beta!r} is too small for float64: log Z_β overflows")
    row = T.figures(task, prob, [cfg.beta])[0]
    prompt = cfg.prompt or prob.prompts[0]
    outcomes = T.prompt_rows(prob, prompt, cfg.beta, 0.0 if cfg.json else 1e-3)
    if cfg.json:
        dist = {o: pi for o, _, _, pi in outcomes}
        row = T.jsonable({**row, "log_z": log_z})
        print(
            json.dumps({**common, **row, "prompt": prompt, "distribution": dist}, allow_nan=False)
        )
        return
    print(f"{text}\n\n" + "\n".join(T.figures_table([row])))
    print(f"mean log Z_β {number(log_z)} | J* = β·mean log Z_β {number(cfg.beta * log_z)}")
    print(
        f"\n{prompt!r}, outcomes of π_ref or π*_β ≥ 0.001:\n{'outcome':<20} {'r':>6} "
        f"{'π_ref':>9} {'π*_β':>9}"
    )
    for o, v, a, b in outcomes:
        print(f"{o:<20} {v:>6.3g} {a:>9.4g} {b:>9.4g}")


@main_guard
def main(argv=None):
    cfg, _ = parse_config(OptimumConfig, argv, description=__doc__.split("\n\n")[0])
    check_config(cfg)
    if cfg.task != "food":
        return show_task(cfg)
    p_ref, r, probes = load_problem(cfg)
    common = {
        "reward": cfg.reward,
        "person": cfg.person,
        "init": cfg.init,
        "reference": named(p_ref),
        "rewards": named(r),
        "malformed_probes": probes,
        "malformed_exact": len(set(probes.values())) == 1,
    }
    head = (
        f"exact optimum of J_β = E[r] − β·KL(π‖π_ref) on {food.prompt(cfg.person)!r}, "
        f"reward {cfg.reward!r}, π_ref {cfg.init}\n{malformed_note(probes)}"
    )
    (show_frontier if cfg.beta is None else show_optimum)(cfg, p_ref, r, common, head)


if __name__ == "__main__":
    main(sys.argv[1:])
