"""Does the entropy change track the covariance? The second measurement of the bench's `entropy`
section (entropy.py).

Cui et al. 2505.22617 (for softmax policies under natural policy gradient, step η): H(π_{k+1}) −
H(π_k) ≈ −η·Cov_{a~π}(log π(a|s), A(s, a)). On real GRPO runs (the CLI's runs, in process), at every
step, on the step's own rollout: the token-mean exact entropy under π before the step and after it
(after the trust region too: what the step really did), and two covariances with the step's group
advantages: the batch one, mean_t (A_t − Ā)(log π_old(o_t) − mean log π_old) (entropy_control's
token_covariance, verl's), and the within-state one, centred inside each state (the claim's
per-state Cov, estimated from the states the group visits more than once; covariance_split). Per
run: Pearson r and the least-squares slope of ΔH on Cov across steps, and the share of steps where
sign(ΔH) = −sign(Cov) (fit). rl.py and grpo.py are untouched: EntropyProbe wraps the algorithm and
adds two no-grad forwards per step, which change no random stream.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from minigrpo.grpo import GRPO, PANELS, PRESETS, GRPOConfig, advantages, check_config
from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.objectives.entropy_control import token_covariance
from minigrpo.objectives.losses import entropy
from minigrpo.rl.config import parse_rl_config
from minigrpo.rl.loop import run


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
