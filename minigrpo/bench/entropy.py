"""The `entropy` section of `python -m minigrpo.bench`: two exact entropy measurements (issue 15).

    python -m minigrpo.bench --only entropy        # about 3 minutes on one thread (20 runs)

1. The forking tokens (Wang et al. 2506.01939, "the 80/20 rule"; forking_tokens.py): the top ρ =
   20 % of the visit-weighted tokens by exact entropy, and their share of all the entropy. For
   π_ref, then for the policy after a default GRPO pizza run (seed 0).
2. Does the entropy change track the covariance? (Cui et al. 2505.22617: ΔH ≈ −η·Cov;
   entropy_covariance.py) Real GRPO runs (pizza: the default recipe, --preset dapo, --preset cispo;
   apple pie, p = 0.02, the default recipe: its rewarded tokens are unlikely, so Cov < 0 at first;
   seeds 0..n−1, each to its own stop rule): at every step, the exact entropy change against the
   batch and within-state covariances of log π_old and Â; per run, the fit of one on the other.
"""

from __future__ import annotations

from pathlib import Path

from minigrpo.bench.common import table
from minigrpo.bench.entropy_covariance import (
    covariance_split,
    fit,
    grpo_run,
    scatter,
    state_keys,
)
from minigrpo.bench.forking_tokens import (
    FORK,
    State,
    forking,
    forking_table,
    state_name,
    top_share,
    visited_states,
)
from minigrpo.tools.bars import med

# the measurements' pieces the tests read from here (tests/test_bench_entropy.py)
__all__ = [
    "State",
    "bench_entropy",
    "covariance_split",
    "fit",
    "grpo_run",
    "state_keys",
    "top_share",
    "visited_states",
]

RECIPES = {
    "pizza, default": ["--reward", "pizza"],
    "pizza, --preset dapo": ["--reward", "pizza", "--preset", "dapo"],
    "pizza, --preset cispo": ["--reward", "pizza", "--preset", "cispo"],
    "apple pie, default": ["--reward", "food:apple pie"],
}  # a rare target: Cov < 0 at first


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
        # f == f drops NaN: a degenerate run
        pick = lambda k, m: [f[k][m] for f in fits if f[k][m] == f[k][m]]  # noqa: E731
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
            state_name(s, PEOPLE, tok)
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
