"""The "ravin likes" world: lines "<person> likes <food>" drawn from a declared distribution.

Everything a run is judged by is known exactly:
  PREFERENCES[person][food]   each person's probability of each food (people are equally likely)
  make_corpus(n, seed)        a shuffled corpus whose counts match PREFERENCES (exactly when n is a
                              multiple of 100 * len(PEOPLE); otherwise by largest remainders)
  entropy_floor()             the corpus entropy in nats per predicted token: the best loss possible
  exact_distribution(...)     the model's exact probability of every food after "<person> likes "
                              (teacher-forced, one batched forward pass), so 1 - sum = malformed
                              mass
"""

from __future__ import annotations

import math
import random

import torch

from minigrpo.exact import frontier
from minigrpo.lm.logprobs import completion_logprobs
from toy_tasks import largest_remainder
from toy_tasks.support import peak_text, reward_figures_many

NAME = "food"
BLOCK_SIZE = 32  # BOS + longest line (23 characters) + EOS fits with room to spare
PRETRAIN_DEFAULTS: dict = {}  # the pretrain CLI's own defaults are tuned for this task
RL_DEFAULTS: dict = {}  # likewise grpo's and ppo's

PEOPLE = ["ravin", "alice", "bob", "chen", "dmitri", "emma", "farah", "jo"]
FOODS = [
    "pizza",
    "sushi",
    "ice cream",
    "tacos",
    "pasta",
    "salad",
    "curry",
    "ramen",
    "apple pie",
    "burgers",
    "dumplings",
    "fried rice",
]
_PERCENT = {  # per person, in the order of FOODS; each row sums to 100
    "ravin": [15, 10, 12, 8, 9, 3, 14, 6, 2, 7, 10, 4],
    "alice": [19, 5, 10, 6, 12, 15, 3, 4, 8, 7, 5, 6],
    "bob": [8, 4, 6, 20, 5, 2, 10, 7, 5, 22, 6, 5],
    "chen": [5, 18, 7, 4, 6, 8, 9, 16, 3, 4, 15, 5],
    "dmitri": [10, 6, 9, 5, 14, 7, 12, 5, 11, 9, 6, 6],
    "emma": [12, 9, 20, 6, 10, 11, 4, 3, 13, 5, 3, 4],
    "farah": [6, 7, 8, 9, 8, 10, 22, 6, 4, 5, 7, 8],
    "jo": [25, 3, 11, 14, 7, 2, 5, 4, 6, 16, 3, 4],
}
PREFERENCES: dict[str, dict[str, float]] = {
    person: {food: pct / 100 for food, pct in zip(FOODS, row)} for person, row in _PERCENT.items()
}
TARGET_PERSON = "ravin"
# malformed completions that value the malformed mass (toy_tasks/support.py)
OFF_SUPPORT_PROBES = ("", "pizzza")


def prompt(person: str) -> str:
    return f"{person} likes "


def line(person: str, food: str) -> str:
    return f"{prompt(person)}{food}"


ALPHABET = "".join(sorted(set("".join(line(p, f) for p in PEOPLE for f in FOODS))))


def make_corpus(n_lines: int, seed: int = 0) -> list[str]:
    """`n_lines` lines "<person> likes <food>" whose counts match PREFERENCES, shuffled by
    `seed`."""
    lines = []
    for person, n_person in zip(PEOPLE, largest_remainder(n_lines, [1.0] * len(PEOPLE))):
        probs = [PREFERENCES[person][f] for f in FOODS]
        for food, count in zip(FOODS, largest_remainder(n_person, probs)):
            lines += [line(person, food)] * count
    random.Random(seed).shuffle(lines)
    return lines


def entropy_floor() -> float:
    """Exact entropy of the corpus in nats per predicted token (every character after BOS, and EOS).

    A line is a (person, food) pair, so H(line) = H(person) + E[H(food | person)]; a token-averaged
    loss divides by the expected number of predicted tokens E[len(line) + 1].
    """
    p_person = 1 / len(PEOPLE)
    h = math.log(len(PEOPLE))
    expected_tokens = 0.0
    for person in PEOPLE:
        for food, p in PREFERENCES[person].items():
            if p > 0:
                h -= p_person * p * math.log(p)
            expected_tokens += p_person * p * (len(line(person, food)) + 1)
    return h / expected_tokens


@torch.no_grad()
def exact_distribution(model, tokenizer, person: str) -> dict[str, float]:
    """{food: exact probability that sampling after "<person> likes " gives exactly food + EOS}."""
    logp = completion_logprobs(model, tokenizer, [prompt(person)] * len(FOODS), FOODS)
    return dict(zip(FOODS, logp.exp().tolist()))


@torch.no_grad()
def exact_distributions(model, tokenizer, people=PEOPLE) -> dict[str, dict[str, float]]:
    """exact_distribution for several people in ONE forward pass: {person: {food: probability}}."""
    return exact_distributions_many([model], tokenizer, people)[0]


@torch.no_grad()
def exact_distributions_many(models, tokenizer, people=PEOPLE) -> list[dict[str, dict[str, float]]]:
    """exact_distributions of each model (GPTs, or their weights stacked: completion_logprobs),
    read back once."""
    people = list(people)
    prompts = [prompt(p) for p in people for _ in FOODS]
    logps = completion_logprobs(models, tokenizer, prompts, FOODS * len(people))  # (M, N)
    n = len(FOODS)
    return [
        {p: dict(zip(FOODS, probs[i * n : (i + 1) * n])) for i, p in enumerate(people)}
        for probs in logps.exp().tolist()
    ]


def total_variation(p: dict[str, float], q: dict[str, float]) -> float:
    """TV between two food distributions, the malformed mass (1 - sum) counted as one more
    outcome."""
    tv = sum(abs(p.get(f, 0.0) - q.get(f, 0.0)) for f in set(p) | set(q))
    tv += abs((1 - sum(p.values())) - (1 - sum(q.values())))
    return 0.5 * tv


def pretrain_report(model, tokenizer) -> dict:
    """Per person: malformed mass and exact TV to PREFERENCES; `ok` = the quality bar is met."""
    dists = exact_distributions(model, tokenizer)
    rows = {
        p: {"malformed": max(0.0, 1 - sum(d.values())), "tv": total_variation(d, PREFERENCES[p])}
        for p, d in dists.items()
    }
    worst_tv = max(r["tv"] for r in rows.values())
    worst_malformed = max(r["malformed"] for r in rows.values())
    return {
        "people": rows,
        "worst_tv": worst_tv,
        "worst_malformed": worst_malformed,
        "ok": worst_tv <= 0.05 and worst_malformed <= 0.01,
    }


def format_report(report: dict) -> str:
    lines = [f"{'person':<8} {'malformed':>9} {'TV to truth':>11}"]
    for p, r in report["people"].items():
        lines.append(f"{p:<8} {r['malformed']:>9.4f} {r['tv']:>11.4f}")
    lines.append(
        f"worst TV {report['worst_tv']:.4f} (bar 0.05), worst malformed "
        f"{report['worst_malformed']:.4f} (bar 0.01): {'PASS' if report['ok'] else 'FAIL'}"
    )
    return "\n".join(lines)


# ---- RL interface: prompts, rewards and exact evaluation for minigrpo.grpo / minigrpo.ppo --------


def _check_person(person: str) -> None:
    if person not in PEOPLE:
        raise ValueError(f"unknown --person {person!r} (available: {', '.join(PEOPLE)})")


def _food_named(name: str, prefix: str) -> str | None:
    food = name[len(prefix) :]
    if food not in FOODS:
        raise ValueError(
            f"unknown food {food!r} in reward {name!r} (available: {', '.join(FOODS)})"
        )
    return food


def _graded(target: str):
    def reward(prompt: str, completion: str) -> float:
        return 1.0 if completion == target else (0.0 if completion in FOODS else -1.0)

    return reward


def _reward_factory(name: str):
    """Food rewards by name: 'pizza', 'food:<food>', 'graded' or 'graded:<food>'; None if not
    ours."""
    if name == "pizza":
        return lambda prompt, completion: float(completion == "pizza")
    if name.startswith("food:"):
        food = _food_named(name, "food:")
        return lambda prompt, completion: float(completion == food)
    if name == "graded" or name.startswith("graded:"):
        return _graded(_food_named(name, "graded:") if ":" in name else "pizza")
    return None


REWARDS = {"food": _reward_factory}
REWARD_HELP = {
    "pizza": "1 iff the completion is exactly 'pizza'",
    "food:<food>": "1 iff the completion is exactly <food> (any of FOODS)",
    "graded[:<food>]": "1 for the target food (default pizza), 0 for another food, -1 for a "
    "malformed line",
}


def rl_prompts(cfg) -> list[str]:
    """RL trains on the target person's prompt only."""
    _check_person(cfg.person)
    return [prompt(cfg.person)]


def anchor_prompts(cfg) -> list[str]:
    """Off-target prompts whose behaviour preservation keeps: everybody else's."""
    return [prompt(p) for p in PEOPLE if p != cfg.person]


def rl_baseline(model, tokenizer, cfg) -> dict:
    """Measured once before RL: every person's exact food distribution under the initial model."""
    return exact_distributions(model, tokenizer)


def support(prompt_text: str) -> list[str]:
    """Every well-formed completion of a prompt: the 12 foods (anything else is malformed)."""
    return list(FOODS)


def outcomes(dist: dict[str, float]) -> torch.Tensor:
    """A food distribution as (13,) float64 over the 12 FOODS and the malformed bucket (the rest of
    the mass)."""
    p = torch.tensor([dist[f] for f in FOODS], dtype=torch.float64)
    return torch.cat([p, (1 - p.sum()).clamp(min=0)[None]])


def rl_evaluate(model, tokenizer, baseline: dict, cfg, rewards) -> dict:
    """Exact metrics in one batched forward pass for all people: on the target person's prompt the
    exact expected reward, the best reward and P(a best food) (`target_rate`, toy_tasks/support.py)
    under `rewards.support` (1, 12), the reward of each food; the run scored against the exact
    KL-regularised optimum over the 13 outcomes (minigrpo/exact/frontier.py: `kl_ref` =
    KL(π_θ‖π_ref) there, `regret`, `implied_beta`, `kl_to_implied_optimum`, and `kl_to_optimum` at
    the run's --beta read as a sequence-level β); each other person's drift (TV to the pretrained
    distribution), the worst drift, and the largest malformed mass over all people."""
    return rl_evaluate_many([model], tokenizer, baseline, cfg, rewards)[0]


def rl_evaluate_many(models, tokenizer, baseline: dict, cfg, rewards) -> list[dict]:
    """rl_evaluate of each model (GPTs, or their weights stacked: contract.py), the frontier's root
    findings of all as one (frontier.score_many)."""
    every = exact_distributions_many(models, tokenizer)
    r = torch.cat([rewards.support[0], rewards.off_support[:1]])
    beta = getattr(cfg, "beta", 0.0) or None  # β = 0 has no optimum to be near
    # (M, 12)
    probs = torch.tensor(
        [[dists[cfg.person][f] for f in FOODS] for dists in every], dtype=torch.float64
    )
    scores = frontier.score_many(
        torch.cat([probs, (1 - probs.sum(1, keepdim=True)).clamp(min=0)], 1),
        outcomes(baseline[cfg.person]),
        r,
        beta,
    )
    figures = reward_figures_many(probs[:, None], rewards.support)
    best = [
        f
        for f, r in zip(FOODS, rewards.support[0].tolist())
        if r >= figures[0]["best_reward"] - 1e-9
    ]
    return [
        _figures(dists, baseline, cfg, {**f, "best_completions": list(best), **score})
        for dists, f, score in zip(every, figures, scores)
    ]


def _figures(dists: dict, baseline: dict, cfg, out: dict) -> dict:
    """The rest of one model's evaluation, beside its `out`: every other person's drift, the
    malformed mass."""
    for p in PEOPLE:
        if p != cfg.person:
            out[f"drift_{p}"] = total_variation(dists[p], baseline[p])
    out["worst_drift"] = max(v for k, v in out.items() if k.startswith("drift_"))
    out["malformed"] = max(0.0, max(1 - sum(d.values()) for d in dists.values()))
    # every person's exact food distribution (summary.json; bench's spill-over figure)
    out["shares"] = dists
    return out


def format_rl_eval(ev: dict, cfg) -> str:
    best = ev.get("best_completions") or []
    target = best[0] if len(best) == 1 else f"one of {len(best)} best foods"
    return (
        f"{cfg.person}'s exact P({target}) {ev['target_rate']:.3f} | exact E[r] "
        f"{ev['exact_reward']:.3f} (best {ev['best_reward']:.3g}) | worst other-person drift (TV) "
        f"{ev['worst_drift']:.3f}{peak_text(ev, 'worst_drift', 3)} | malformed (the worst "
        f"person's) {ev['malformed']:.4f}{peak_text(ev, 'malformed', 4)}"
    )
