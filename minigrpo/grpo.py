"""GRPO (DeepSeekMath, arXiv 2402.03300) with its variants and a real run's machinery; the
default recipe alone, in one file to read first: minigrpo/grpo_one_file.py.

    python -m minigrpo.grpo --reward pizza
    python -m minigrpo.grpo --preset dapo --reward "food:apple pie"

Each step (the loop, shared with PPO: rl/loop.py): sample G completions for each of the step's
prompts from π_old and score them; one advantage per completion from its group's rewards; then μ =
--updates inner updates of

    L = agg( −min(ρ_t·Â, clip(ρ_t, 1−ε_low, 1+ε_high)·Â) ) + β·agg(KL_t) − c_H·agg(H_t) +
    preservation

ρ_t = π_θ/π_old per token; KL_t per token against the frozen π_ref; agg the mean over each
completion's tokens, then over completions (the paper's eq. 3). With μ = 1 the ratio is identically
1 at the only update and the clip never acts; μ = 2 makes the second update a real PPO-style step
against π_old.

Departures from the paper, each measured (docs/algorithms.md, docs/experiments.md):
  μ = 2        the paper's one update per batch leaves the ratio at 1 and the clip dead
  --kl exact   the full-vocabulary KL(π‖π_ref) per position instead of the sampled k3: free at the
               character level, and its gradient is the reverse KL's (k3's is the forward KL's:
               objectives/kl.py)
  β 0.3        (paper 0.04) with lr 6e-4 and G = 16 × 4 prompts: held every every-step bar on hard
               targets
The trust region (rl/trust_region.py) and the stop rule (rl/stopping.py) belong to the run, not the
loss. Variant families, each a table in its own module: variants/policy_losses.py (--policy-loss,
the clip), variants/kl.py (--kl, --kl-in), variants/advantages.py (--baseline, --adv-scale, group
filters), variants/entropy.py (token filters, entropy controls), variants/sampler.py (sampler ≠
trainer), and the named recipes in variants/presets.py (--preset).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace

import torch

from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.objectives.losses import AGG_MODES, aggregate, entropy, surrogate_stats
from minigrpo.rl.config import RLConfig, parse_rl_config
from minigrpo.rl.loop import run
from minigrpo.rl.report import COST_PANELS, OUTCOME_PANELS
from minigrpo.rl.rollout import RolloutBatch, greedy_rewards
from minigrpo.rl.run_state import purpose_seed
from minigrpo.util.cli import (
    UsageError,
    check_ranges,
    exit_now,
    finish_unread,
    flag,
    main_guard,
    require,
)
from minigrpo.variants import advantages as adv_family
from minigrpo.variants import entropy as entropy_family
from minigrpo.variants import kl as kl_family
from minigrpo.variants import policy_losses as loss_family
from minigrpo.variants import sampler as sampler_family
from minigrpo.variants.advantages import (
    BASELINES,
    AdvantageFlags,
    advantages,
    kept_rows,
    random_rewards,
    signal,
)
from minigrpo.variants.entropy import EntropyBonus, EntropyFlags, fork_mask
from minigrpo.variants.inner_updates import Alone, inner_updates, row
from minigrpo.variants.kl import KL_PANEL, KLFlags, kl_figures, kl_per_token
from minigrpo.variants.policy_losses import PolicyLossFlags, policy_loss_per_token, reduction
from minigrpo.variants.presets import PRESETS
from minigrpo.variants.sampler import SamplerFlags, is_weights, make_sampler

__all__ = [
    "GRPO",
    "GRPOConfig",
    "PRESETS",
    "advantages",
    "grpo_loss",
    "kl_per_token",
    "main",
    "train",
    "update_figures",
]


@dataclass
class GRPOConfig(RLConfig, PolicyLossFlags, KLFlags, AdvantageFlags, EntropyFlags, SamplerFlags):
    """GRPO"""

    preset: str | None = flag(
        None,
        "set several flags at once (explicit flags win; variants/presets.py)",
        choices=sorted(PRESETS),
    )
    updates: int = flag(
        2, "μ: inner updates per rollout (1 makes the ratio identically 1 and the clip dead)"
    )
    loss_agg: str = flag(
        "seq-mean-token-mean",
        "loss aggregation over tokens and sequences (gmpo's sequence loss keeps its own)",
        choices=list(AGG_MODES),
    )


def check_config(cfg: GRPOConfig) -> None:
    """Refuse values and combinations GRPO cannot run as asked, with one line each."""
    check_ranges(
        cfg,
        {
            "clip_low": (0, 1),
            "clip_high": (0, None),
            "beta": (0, None),
            "adv_eps": (0, None),
            "entropy_coef": (None, None),
            "fork_entropy": (0, None),
            "gmpo_eps": (0, None),
            "sapo_tau_pos": (1e-6, None),
            "sapo_tau_neg": (1e-6, None),
            "entropy_target": (0, None),
            "entropy_step": (0, None),
            "entropy_coef_max": (0, None),
            "top_entropy": (1e-6, 1),
            "cov_ratio": (0, 1),
            "clip_cov_low": (None, None),
            "clip_cov_high": (None, None),
            "kl_cov_coef": (0, None),
        },
    )
    require(cfg, "updates", cfg.updates >= 1, ">= 1")
    if not cfg.rollout_kl and (cfg.beta > 0 or cfg.fork_entropy > 0):
        fork = cfg.fork_entropy > 0
        raise UsageError(
            f"--no-rollout-kl skips π_ref's log-probs, which --beta {cfg.beta:g}"
            f"{' and --fork-entropy' if fork else ''} need: add --beta 0"
            f"{' and drop --fork-entropy' if fork else ''}, or keep the metrics"
        )
    for family in (loss_family, kl_family, adv_family, entropy_family, sampler_family):
        family.check(cfg)


def grpo_loss(
    logp,
    old_logp,
    ref_logp,
    logits,
    ref_logits,
    adv,
    mask,
    cfg: GRPOConfig,
    policy_mask=None,
    generator=None,
    is_weights=None,
):
    """The loss of one GRPO update (preservation, added by the run, aside) -> (loss, policy_loss,
    KL_t, H_t).

        loss = agg(w_t·L_t) + β·agg(KL_t) − c_H·agg(H_t)      (DeepSeekMath eq. 3 with an entropy
        bonus)

    logp (N, T): log π_θ of the sampled completion tokens (with gradient); old_logp, ref_logp (N,
    T): π_old's and π_ref's (no gradient); logits, ref_logits (N, T, V): π_θ's and π_ref's
    next-token logits; adv (N,): one advantage per completion; mask (N, T) bool: valid tokens;
    policy_mask (N, T): the tokens that carry L_t (default mask). L_t: --policy-loss (default PPO's
    clipped surrogate), its token filters and entropy controls (`generator` draws Clip-Cov's
    tokens); is_weights (N, T): the sampler correction's constants. agg: --loss-agg over mask with
    max_len --max-new-tokens. KL_t enters the loss only with β > 0 and --kl-in loss (None without
    π_ref's log-probs); H_t = the entropy of π_θ's next-token distribution.
    """
    agg = lambda x: aggregate(x, mask, cfg.loss_agg, cfg.max_new_tokens)  # one reduction for all
    ent = entropy(logits)
    per_token = policy_loss_per_token(
        logp, old_logp, adv, mask if policy_mask is None else policy_mask, ent, cfg, generator
    )
    if is_weights is not None:  # constants, no gradient
        per_token = per_token * is_weights
    policy_loss = aggregate(per_token, mask, reduction(cfg), cfg.max_new_tokens)
    kl_tok = (
        None
        if ref_logp is None
        else kl_per_token(logp, ref_logp, logits, ref_logits, cfg.kl, old_logp)
    )
    loss = policy_loss
    if cfg.beta > 0 and cfg.kl_in == "loss":
        loss = loss + cfg.beta * agg(kl_tok)
    if cfg.entropy_coef:
        loss = loss - cfg.entropy_coef * agg(ent)
    return loss, policy_loss, kl_tok, ent


class GRPO:
    """The algorithm the run (rl/loop.py) calls once per step with a fresh rollout
    (rl/algorithm.py)."""

    needs_ref_logits = True  # for the exact-KL metric (cheap: the vocabulary is ~30 characters)

    def __init__(self, run):
        self.run, self.cfg, self.policy = run, run.cfg, run.policy
        # π_old's log-probs are needed before the first update only to fold the KL into the reward;
        # otherwise the first update's own forward pass gives them (π_θ = π_old there): one forward
        # saved.
        self.needs_old_logp = self.cfg.beta > 0 and self.cfg.kl_in == "reward"
        self.needs_ref = self.cfg.rollout_kl or self.cfg.beta > 0 or self.cfg.fork_entropy > 0
        # the variants' random streams, never the run's
        device = next(self.policy.parameters()).device
        self.gens = {
            "random_reward": torch.Generator().manual_seed(
                purpose_seed(self.cfg.seed, "random_reward")
            ),
            "clip_cov": torch.Generator(device).manual_seed(
                purpose_seed(self.cfg.seed, "clip_cov")
            ),
        }
        self.entropy_bonus = EntropyBonus(self.cfg)
        # the entropy controls read a run's own (Clip-Cov's generator, a coefficient, filters that
        # rank by a count read from the data): a population takes that loss member by member
        off = ("none", 1, 0, None)
        c = self.cfg
        self.own_loss = (c.cov_control, c.top_entropy, c.fork_entropy, c.entropy_target) != off
        # rollouts from π_sampler ≠ π_old (rollout.Sampler), or None
        self.sampler = make_sampler(self.cfg)

    def parameters(self):
        return list(self.policy.parameters())

    def state_dict(self) -> dict:
        return {
            "gens": {k: g.get_state() for k, g in self.gens.items()},
            "entropy_coef": self.entropy_bonus.coef,
            **({"sampler": self.sampler.state_dict()} if self.sampler is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        # a checkpoint of an older minigrpo holds none
        for k, g_state in state.get("gens", {}).items():
            self.gens[k].set_state(g_state)
        self.entropy_bonus.coef = state.get("entropy_coef", self.entropy_bonus.coef)
        if self.sampler is not None:
            self.sampler.load_state_dict(state["sampler"])

    def update(self, batch: RolloutBatch, opt) -> dict:
        """One step: 1. rewards -> one advantage per completion (`signal`); 2. μ updates of the
        clipped surrogate against π_old with the KL to π_ref (`terms`), each with the preservation
        term beside it (inner_updates) -> the step's metrics row (`row`). A lockstep population
        calls the same three over its members (population/grpo_update.py); `m`, what they map over,
        is here this run alone."""
        cfg, m = self.cfg, Alone(self, batch)
        sig = self.signal(batch, m)
        per_update, ratios = inner_updates(
            cfg.updates,
            lambda: generation_logprobs(self.policy, m.batch.gen, cfg.temperature, True),
            None if sig.skipped else partial(self.terms, sig),
            self.run.anchor_term,
            lambda loss: self.run.clip_and_step(opt, loss, self.parameters()),
        )
        m.batch.old_logp = sig.old_logp  # π_old's log-probs: the first update's, where not given
        read = lambda d: {k: v.item() if torch.is_tensor(v) else v for k, v in d.items()}
        return row(
            read(sig.stats), sig.before, list(map(read, per_update)), list(map(read, ratios))
        )

    def signal(self, batch, m) -> SimpleNamespace:
        """Rewards -> one advantage per completion (variants/advantages.signal), from the sampled
        rewards or --random-reward's draws, with ReMax's greedy rewards; then DAPO's and
        REINFORCE-Rej's filter, only the groups whose rewards differ (`m.keep`; a step with none
        left is skipped: its updates carry the preservation term alone). batch: a RolloutBatch (or
        the members' rollouts, population/rows.Rollouts) -> what the updates read."""
        cfg = self.cfg
        drawn = m.each(lambda a, r: random_rewards(r, cfg, a.gens["random_reward"]), batch.rewards)
        greedy = m.each(lambda a, b: a.greedy_rewards(b), m.batch)
        args = (batch.rewards, drawn, greedy, batch.old_logp, batch.ref_logp, batch.mask)
        adv, equal, stats = m.map(lambda r, *x: signal(r, cfg, *x), *args)
        sig = SimpleNamespace(
            m=m, stats=stats, adv=adv, mask=batch.mask, old_logp=batch.old_logp, skipped=False,
            ref_logp=batch.ref_logp, ref_logits=batch.ref_logits, drop=None, loss_cfg=cfg,
        )  # fmt: skip
        keep = kept_rows(equal, cfg)  # (N,) bool, or None without the filter
        if keep is not None:
            stats["skipped"] = (~keep.any(-1)).float()
            m.keep(sig, keep)
        sig.before = list(stats)
        # --fork-entropy: π_ref's forking tokens
        sig.policy_mask = m.map(lambda r, mask: fork_mask(r, mask, cfg), sig.ref_logits, sig.mask)
        return sig

    def terms(self, sig, i: int, logp, logits) -> tuple:
        """Inner update i's loss (without the preservation term: inner_updates), its figures and
        its ratio's figures ({} at the first of μ > 1 updates). logp (N, T), logits (N, T, V): π_θ's
        (generation_logprobs)."""
        cfg, m = self.cfg, sig.m
        if sig.old_logp is None:  # first update: π_θ is π_old, so its log-probs are π_old's exactly
            sig.old_logp = logp.detach()
        # from π_old, once: the sampler correction's weights and this step's entropy bonus
        if i == 0:
            sig.is_w, figures = (None, {})
            if self.sampler is not None or cfg.is_correction != "none":
                sig.is_w, figures = m.each(is_weights, sig.old_logp, sig.mask, m.sampler_logp)
            bonus = lambda a, *x: a.entropy_bonus.for_step(*x)
            sig.loss_cfg, more = m.each(bonus, logits, sig.mask)
            sig.stats.update(figures, **more)
        args = (logp, sig.old_logp, sig.ref_logp, logits, sig.ref_logits, sig.adv, sig.mask)
        args = (*args, sig.policy_mask, sig.is_w)
        loss_of = lambda a, c, *x: grpo_loss(*x[:7], c, x[7], a.gens["clip_cov"], x[8])
        # the entropy controls read this run's own generator and coefficient
        if self.own_loss:
            loss, policy_loss, kl_tok, ent = m.each(loss_of, sig.loss_cfg, *args)
        else:
            loss, policy_loss, kl_tok, ent = m.map(partial(loss_of, self, cfg), *args)
        if sig.drop is not None:  # rows masked, not dropped (m.keep): a mean over sequences
            scale = lambda mode: sig.drop if mode != "token-mean" else 1.0  # counts only the kept
            loss = policy_loss * scale(reduction(cfg)) + (loss - policy_loss) * scale(cfg.loss_agg)
            policy_loss = policy_loss * scale(reduction(cfg))
        figures, ratio = m.map(
            lambda *x: update_figures(cfg, i, *x),
            *(logp.detach(), sig.old_logp, sig.adv, kl_tok, logits, sig.ref_logits, ent, sig.mask),
        )
        return loss, {"policy_loss": policy_loss, "loss": loss, **figures}, ratio

    def greedy_rewards(self, batch: RolloutBatch) -> torch.Tensor | None:
        """ReMax's baseline: the rewards of π_old's greedy completions of the batch's prompts
        (prompts,); None for another --baseline."""
        if not BASELINES[self.cfg.baseline].needs_greedy:
            return None
        cfg, run = self.cfg, self.run
        return greedy_rewards(
            self.policy,
            run.tok,
            run.reward,
            batch.prompts[:: cfg.group_size],
            cfg.max_new_tokens,
            cfg.unfinished_reward,
        )


@torch.no_grad()
def update_figures(cfg, i, logp, old_logp, adv, kl_tok, logits, ref_logits, ent, mask) -> tuple:
    """What inner update i logs beside its losses -> (figures, ratio figures), 0-dim tensors: the KL
    per token (the chosen estimator's and the exact one; none without π_ref: variants/kl.kl_figures)
    and the entropy, token-means over the completions; the ratio's (losses.surrogate_stats), none
    ({}) at the first of μ > 1 updates, whose ρ ≡ 1 would halve what the clip saw. Shapes as
    grpo_loss's; mappable over a leading member dim (population/grpo_update.py)."""
    figures = {
        **kl_figures(kl_tok, logits, ref_logits, mask, cfg),
        "entropy": aggregate(ent, mask, "token-mean"),
    }
    if i == 0 and cfg.updates > 1:
        return figures, {}
    args = (cfg.clip_low, cfg.clip_high, cfg.ratio)
    return figures, surrogate_stats(logp, old_logp, adv[:, None], mask, *args)


PANELS = (
    OUTCOME_PANELS
    + [KL_PANEL]
    + entropy_family.PANELS
    + loss_family.PANELS
    + adv_family.PANELS
    + sampler_family.PANELS
    + [("completion length (tokens)", ["completion_len"])]
    + COST_PANELS
)

# the algorithm a lockstep population's members run (population/lockstep.Member)
ALGORITHM = GRPO


def train(cfg: GRPOConfig, log=print) -> dict:
    check_config(cfg)
    return run(cfg, GRPO, "grpo", PANELS, log)


def parse(argv) -> GRPOConfig:
    """The command line's config (a UsageError names a bad flag)."""
    return parse_rl_config(GRPOConfig, argv, __doc__.split("\n\n")[0], "grpo", PRESETS)


@main_guard
@finish_unread
def main(argv=None):
    train(parse(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_now()  # the files are closed: skip the interpreter's teardown (util/cli.exit_now)
