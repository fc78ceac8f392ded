"""The exact KL-regularised optimum and reward–KL frontier of one food-world prompt.

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
"""

from __future__ import annotations

import io
import json
import math
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minigrpo.exact import frontier as F
from minigrpo.lm.checkpoint import CheckpointError, load_checkpoint
from minigrpo.util.cli import UsageError, main_guard, meta, parse_config, require
from minigrpo.util.outputs import write_atomic
from minigrpo.util.runtime import setup_runtime
from toy_tasks import food
from toy_tasks.rewards import RewardError, make_reward, score
from toy_tasks.support import reward_table

MALFORMED = "<malformed>"
OUTCOMES = [*food.FOODS, MALFORMED]
# an empty line and a misspelling: both outside the 12 foods
MALFORMED_PROBES = food.OFF_SUPPORT_PROBES
TABLE_BETAS = [math.inf, 10, 3, 1, 0.5, 0.3, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03, 0.01, 1e-3, 0.0]
# frontier.png marks a β of TABLE_BETAS only this far (× the β → 0 KL) from the others
MARK_SPACING = 0.08


@dataclass
class OptimumConfig:
    reward: str = field(
        default="pizza", metadata=meta("reward spec, as in grpo (pizza, food:<food>, graded, ...)")
    )
    person: str = field(default="ravin", metadata=meta("whose prompt '<person> likes ' to solve"))
    init: str = field(
        default="runs/pretrain/model.pt", metadata=meta("the reference policy π_ref (a checkpoint)")
    )
    beta: float | None = field(
        default=None,
        metadata=meta(
            "show π*_β at this β > 0 (default: the whole frontier, as a table and frontier.png)"
        ),
    )
    task: str = field(default="food", metadata=meta("toy task (food only for now)"))
    json: bool = field(default=False, metadata=meta("print one JSON object instead of text"))
    out: str | None = field(
        default=None,
        metadata=meta(
            "folder for frontier.png (default: runs/optimum-<reward>, plus -<person> for another "
            "person)"
        ),
    )


def check_config(cfg: OptimumConfig) -> None:
    """One-line UsageErrors for what needs no model to be judged."""
    if cfg.task != "food":
        raise UsageError(
            f"--task {cfg.task}: the exact optimum is implemented for the food task only for now"
        )
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


def load_problem(cfg: OptimumConfig):
    """-> (p_ref, r, probes): the checks, the reward, the checkpoint, as one-line UsageErrors."""
    check_config(cfg)
    setup_runtime(1, "cpu")
    try:
        reward = make_reward(cfg.reward, food.REWARDS, food.REWARD_HELP)
    except RewardError as e:
        raise UsageError(str(e)) from None
    try:
        model, tok, info = load_checkpoint(cfg.init, "cpu")
    except CheckpointError as e:
        raise UsageError(
            f"{e} (make one with: python -m minigrpo.pretrain, or pass --init)"
        ) from None
    if info.get("task", "food") != "food":
        raise UsageError(
            f"--init {cfg.init} is a {info.get('task')} model; the optimum needs a food model"
        )
    try:
        p_ref, r, probes = outcome_space(model, tok, reward, cfg.person)
    except RewardError as e:
        raise UsageError(str(e)) from None
    if not math.isfinite(r.max().item() - r.min().item()):
        raise UsageError(
            f"reward {cfg.reward!r} spans {r.min().item():g} to {r.max().item():g} over the "
            "outcomes: more than a float holds; rescale it (the optimum depends on r/β only)"
        )
    return p_ref, r, probes


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


def spread_marks(points: list[dict]) -> list[dict]:
    """The finite, non-zero β points at least MARK_SPACING·(the β → 0 KL) apart in KL, and from both
    ends."""
    room = MARK_SPACING * points[-1]["kl"]
    kept = [points[0], points[-1]]
    for p in points[1:-1]:
        if all(abs(p["kl"] - k["kl"]) >= room for k in kept):
            kept.append(p)
    return kept[2:]


def draw_frontier(points: list[dict], marks: list[dict], path: Path, title: str) -> None:
    """frontier.png: E[r] against KL(π‖π_ref), π_ref and the β → 0 limit marked, and a few β along
    the way."""
    # a reward near a float's limit overflows the tick arithmetic: nothing to say
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(
            [p["kl"] for p in points],
            [p["expected_reward"] for p in points],
            lw=1.5,
            label="exact frontier",
        )
        ax.plot(points[0]["kl"], points[0]["expected_reward"], "ko", label="π_ref (β = ∞)")
        ax.plot(points[-1]["kl"], points[-1]["expected_reward"], "k*", ms=10, label="β → 0")
        for m in marks:
            ax.plot(m["kl"], m["expected_reward"], "o", color="tab:orange", ms=4)
            ax.annotate(
                f"β={m['beta']:g}",
                (m["kl"], m["expected_reward"]),
                textcoords="offset points",
                xytext=(6, -10),
                fontsize=8,
            )
        ax.set(xlabel="KL(π ‖ π_ref), nats", ylabel="E_π[r]", title=title)
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
        plt.close(fig)
        write_atomic(path, buf.getvalue(), what="figure")


def out_dir(cfg: OptimumConfig) -> Path:
    slug = "".join(c if c.isalnum() else "-" for c in cfg.reward.split("/")[-1]).strip("-")[:40]
    path = Path(
        cfg.out or f"runs/optimum-{slug}" + (f"-{cfg.person}" if cfg.person != "ravin" else "")
    )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            f"--out {str(path)!r} cannot be created: {e.strerror or e}; give a writable folder"
        ) from None
    return path


def number(x: float) -> str:
    """Four decimals, or four significant digits where that would print dozens of digits (a reward
    of 1e308)."""
    return f"{x:.4f}" if abs(x) < 1e6 else f"{x:.4g}"


def named(values) -> dict:
    return dict(zip(OUTCOMES, values.tolist()))


def show_optimum(cfg: OptimumConfig, p_ref, r, common: dict, head: str) -> None:
    """--beta B: each outcome under π_ref and π*_β, then E*[r], KL* and log Z_β."""
    pi, fig = F.optimum(p_ref, r, cfg.beta), F.optimum_figures(p_ref, r, cfg.beta)
    if not math.isfinite(fig["log_z"]):  # log Z_β = max r/β + ...: past float64's range
        top = float(r.abs().max())
        raise UsageError(
            f"--beta {cfg.beta:g} is too small for float64 with rewards up to {top:g}: log Z_β = "
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


@main_guard
def main(argv=None):
    cfg, _ = parse_config(OptimumConfig, argv, description=__doc__.split("\n\n")[0])
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
