"""The `entropy` section of `python -m minigrpo.bench`: two exact entropy measurements (issue 15).

    python -m minigrpo.bench --only entropy        # about 3 minutes on one thread (20 runs)

1. The forking tokens (Wang et al. 2506.01939, "the 80/20 rule"). For each person's prompt, every
   completion with π ≥ 1e-4 (preserve.build_anchor_tree), each weighted by its probability; at every
       state s the tree
   visits (a prompt and a completion prefix), the exact entropy H(π(·|s)) over the full vocabulary
       and the
   visit weight w_s = P(the prefix)/prompts. A state is visited w_s times per completion on average,
       so
   the visit-weighted states ARE the token distribution of sampled completions: its top ρ = 20 % by
   entropy are the forking tokens, and their share of Σ_s w_s·H_s is the share of all the entropy
       they
   carry. For π_ref, then for the policy after a default GRPO pizza run (seed 0).
2. Does the entropy change track the covariance? Cui et al. 2505.22617 (for softmax policies under
   natural policy gradient, step η): H(π_{k+1}) − H(π_k) ≈ −η·Cov_{a~π}(log π(a|s), A(s, a)). Real
       GRPO runs
   (pizza: the default recipe, --preset dapo, --preset cispo; apple pie, p = 0.02, the default
       recipe: its
   rewarded tokens are unlikely, so Cov < 0 at first; seeds 0..n−1, each to its own stop rule): at
       every
   step, on the step's own rollout, the token-mean exact entropy under π before the step and after
       it
   (after the trust region too: what the step really did), and two covariances with the step's group
   advantages: the batch one, mean_t (A_t − Ā)(log π_old(o_t) − mean log π_old) (entropy_control's
   token_covariance, verl's), and the within-state one, centred inside each state (the claim's
       per-state
   Cov, estimated from the states the group visits more than once; covariance_split). Per run:
       Pearson r
   and the least-squares slope of ΔH on Cov across steps, and the share of steps where sign(ΔH) =
       −sign(Cov).
   rl.py and grpo.py are untouched: EntropyProbe wraps the algorithm and adds two no-grad forwards
       per step,
   which change no random stream (the runs are the CLI's runs).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from minigrpo.bench.common import table
from minigrpo.grpo import GRPO, PANELS, PRESETS, GRPOConfig, advantages, check_config
from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.lm.tokenizer import EOS_ID
from minigrpo.objectives.entropy_control import token_covariance
from minigrpo.objectives.losses import entropy
from minigrpo.rl.config import parse_rl_config
from minigrpo.rl.loop import run
from minigrpo.rl.preserve import build_anchor_tree
from minigrpo.tools.bars import med

RECIPES = {
    "pizza, default": ["--reward", "pizza"],
    "pizza, --preset dapo": ["--reward", "pizza", "--preset", "dapo"],
    "pizza, --preset cispo": ["--reward", "pizza", "--preset", "cispo"],
    "apple pie, default": ["--reward", "food:apple pie"],
}  # a rare target: Cov < 0 at first
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


def fit(x: list[float], y: list[float]) -> dict:
    """Pearson r and the least-squares slope of y on x, and the share of points with sign(y) =
    −sign(x) among those where both are nonzero (the claimed relation is y ≈ −η·x)."""
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    signed = [(a, b) for a, b in zip(x, y) if a != 0 and b != 0]
    return {
        "r": sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else float("nan"),
        "slope": sxy / sxx if sxx > 0 else float("nan"),
        "sign": sum((a > 0) != (b > 0) for a, b in signed) / len(signed)
        if signed
        else float("nan"),
    }


def state_keys(gen) -> list[list[tuple]]:
    """(N, T) the state before each completion token: the row's prompt and completion ids up to
    it."""
    ids = gen.ids.tolist()
    return [
        [tuple(row[: gen.prompt_len + t]) for t in range(gen.completion_mask.size(1))]
        for row in ids
    ]


def covariance_split(
    keys, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> tuple[float, float]:
    """(batch, within-state) covariance of log π and Â over the valid tokens, keys (N, T) state ids.

    batch = mean_t (Â_t − Ā)(log π_t − mean log π) (= token_covariance's mean);
    within = mean_t (Â_t − Ā_s)(log π_t − mean_s log π), centred inside each state s: the sampled
    E_s[Cov_{a~π(·|s)}(log π(a|s), A)] of the claim, where batch − within is the between-state part
    (the law of total covariance; a state sampled once adds 0)."""
    groups: dict = {}
    for i, t in mask.nonzero().tolist():
        groups.setdefault(keys[i][t], []).append((float(adv[i]), float(logp[i, t])))
    n, within = int(mask.sum()), 0.0
    for pairs in groups.values():
        ma, ml = sum(a for a, _ in pairs) / len(pairs), sum(lp for _, lp in pairs) / len(pairs)
        within += sum((a - ma) * (lp - ml) for a, lp in pairs)
    return token_covariance(logp, adv, mask)[mask].double().mean().item(), within / n


@torch.no_grad()
def token_mean_entropy(policy, batch) -> tuple[float, torch.Tensor]:
    """(the exact token-mean entropy of `policy` over the batch's completion states, its (N, T)
    token log-probs)."""
    was = policy.training
    policy.eval()
    logp, logits = generation_logprobs(policy, batch.gen, return_logits=True)
    policy.train(was)
    mask = batch.mask
    return (entropy(logits.double())[mask].mean().item(), logp)


class EntropyProbe:
    """A GRPO algorithm that logs, per step, the exact entropy before and after the step on the
    step's own rollout and the batch covariance Cov(log π_old, Â). "After" is measured when the next
    step begins (or by finish()), so it includes rl.run's trust region, applied after update()."""

    def __init__(self, run_):
        self.inner, self.run = GRPO(run_), run_
        cfg = run_.cfg
        if cfg.baseline == "remax" or cfg.random_reward or (cfg.beta > 0 and cfg.kl_in == "reward"):
            raise ValueError(
                "EntropyProbe recomputes the advantages from the batch rewards: not for this config"
            )
        self.steps, self.pending = [], None

    # everything else (parameters, state_dict, needs_*, sampler, ...) is GRPO's
    def __getattr__(self, name):
        return getattr(self.inner, name)

    def update(self, batch, opt) -> dict:
        self.finish()
        h0, logp = token_mean_entropy(self.run.policy, batch)
        adv = advantages(batch.rewards, self.run.cfg)
        cov = covariance_split(state_keys(batch.gen), logp, adv, batch.mask)
        stats = self.inner.update(batch, opt)
        self.pending = (batch, h0, cov)
        return stats

    def finish(self) -> None:
        if self.pending is not None:
            batch, h0, cov = self.pending
            h1, _ = token_mean_entropy(self.run.policy, batch)
            self.steps.append({"h0": h0, "dh": h1 - h0, "cov": cov[0], "cov_within": cov[1]})
            self.pending = None


def grpo_run(init: Path, out: Path, seed: int, args: list[str]) -> tuple[EntropyProbe, object]:
    """One run of `python -m minigrpo.grpo` (quiet, no plot) in process, probed -> (probe, its
    Run)."""
    argv = [
        "--init",
        str(init),
        "--seed",
        str(seed),
        "--out",
        str(out),
        "--overwrite",
        "--quiet",
        "--no-plot",
        *args,
    ]
    cfg = parse_rl_config(GRPOConfig, argv, "", "grpo", PRESETS)
    check_config(cfg)
    held = {}
    run(cfg, lambda r: held.setdefault("probe", EntropyProbe(r)), "grpo", PANELS)
    held["probe"].finish()
    return held["probe"], held["probe"].run


def forking(model, tok, people: list[str], max_new: int) -> tuple[list[State], list, float, float]:
    """The visited states of every person's prompt under `model` and their top-ρ forking set
    (top_share)."""
    states = visited_states(
        build_anchor_tree(model, tok, [f"{p} likes " for p in people], 64, max_new)
    )
    return (states, *top_share(states))


def _name(s: State, people, tok) -> str:
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
        [_name(s, people, tok), f"{s.entropy:.3f}", f"{len(people) * s.weight:.3f}", _dist(s, tok)]
        for s in mine
    ]
    return table(
        f"forking tokens of {label}: the top {RHO:.0%} of visit-weighted tokens by exact entropy "
        "are "
        f"{len(picked)} states with H >= {threshold:.3f} nats, carrying {share:.1%} of all the "
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


def scatter(points: dict[str, list[dict]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, key, what in zip(axes, ("cov", "cov_within"), ("batch", "within-state")):
        for name, steps in points.items():
            ax.scatter(
                [s[key] for s in steps], [s["dh"] for s in steps], s=8, alpha=0.6, label=name
            )
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_xlabel(f"{what} Cov(log π_old, Â) of the step's rollout")
    axes[0].set_ylabel("ΔH: token-mean entropy after − before the step")
    axes[0].legend(fontsize=8)
    fig.suptitle(
        "every GRPO step, seeds 0-4: the claim ΔH ≈ −η·Cov (Cui et al. 2505.22617)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def _rises(steps: list[dict], key: str) -> str:
    """'k/n': of the n steps (all seeds) with a negative covariance, k raised the entropy (the
    claim's sign)."""
    neg = [s for s in steps if s[key] < 0]
    return f"{sum(s['dh'] > 0 for s in neg)}/{len(neg)}"


def bench_entropy(out: Path, init: Path, seeds: int) -> str:
    """The section: the forking tables (π_ref, then after a default pizza run) and the ΔH-vs-Cov
    table."""
    from minigrpo.lm.checkpoint import load_checkpoint
    from toy_tasks.food import PEOPLE

    folder = out / "entropy"
    folder.mkdir(parents=True, exist_ok=True)
    points, rows, trained = {}, [], None
    for name, args in RECIPES.items():
        fits, points[name] = [], []
        for seed in range(seeds):
            probe, r = grpo_run(
                init,
                folder / f"{name.split(',')[0].replace(' ', '-')}-{args[-1]}-s{seed}",
                seed,
                args,
            )
            points[name] += probe.steps
            fits.append(
                {
                    k: fit([s[k] for s in probe.steps], [s["dh"] for s in probe.steps])
                    for k in ("cov", "cov_within")
                }
            )
            trained = r if (name, seed) == ("pizza, default", 0) else trained
        pick = lambda k, m: [f[k][m] for f in fits if f[k][m] == f[k][m]]  # noqa: E731 (NaN: a degenerate run)
        rows.append(
            [
                name,
                med([len(points[name]) / seeds], "{:.0f}"),
                med(pick("cov", "r"), "{:+.2f}"),
                med(pick("cov", "slope"), "{:+.3f}"),
                med(pick("cov", "sign"), "{:.2f}"),
                med(pick("cov_within", "r"), "{:+.2f}"),
                med(pick("cov_within", "slope"), "{:+.3f}"),
                med(pick("cov_within", "sign"), "{:.2f}"),
                _rises(points[name], "cov"),
                _rises(points[name], "cov_within"),
            ]
        )
    png = folder / "entropy_vs_cov.png"
    scatter(points, png)
    ref, tok, _ = load_checkpoint(init)
    before = forking(ref, tok, PEOPLE, trained.cfg.max_new_tokens)
    after = forking(trained.policy.eval(), tok, PEOPLE, trained.cfg.max_new_tokens)
    text = forking_table("π_ref (every person's prompt)", *before, PEOPLE, tok)
    text += forking_table("the policy after `grpo --reward pizza` (seed 0)", *after, PEOPLE, tok)
    forks = [
        {
            _name(s, PEOPLE, tok)
            for s in res[0]
            if s.entropy >= FORK and len(PEOPLE) * s.weight >= 0.01
        }
        for res in (before, after)
    ]
    root = [
        next(s.entropy for s in res[0] if s.prompt == 0 and not s.prefix) for res in (before, after)
    ]
    text += (
        f"\nafter GRPO on pizza: H({PEOPLE[0]} likes |) {root[0]:.3f} -> {root[1]:.3f} nats; "
        f"forks (H >= {FORK}, "
        f"visited >= 1 %) {len(forks[0])} -> {len(forks[1])}; gone: "
        f"{', '.join(sorted(forks[0] - forks[1])) or 'none'}; new: "
        f"{', '.join(sorted(forks[1] - forks[0])) or 'none'}"
    )
    return text + table(
        f"ΔH vs Cov(log π_old, Â) per step (Cui et al. 2505.22617: ΔH ≈ −η·Cov): per run "
        f"over its steps, medians (min–max) over seeds 0-{seeds - 1}; scatter: {png}",
        [
            "run",
            "steps",
            "r(ΔH, Cov)",
            "slope",
            "sign(ΔH) = −sign(Cov)",
            "r(ΔH, Cov within)",
            "slope within",
            "sign within",
            "Cov < 0: ΔH > 0",
            "within < 0: ΔH > 0",
        ],
        rows,
    )
