"""GRPO (DeepSeekMath, arXiv 2402.03300) and its variants, one flag (or one --preset) apart.

    python -m minigrpo.grpo --reward pizza
    python -m minigrpo.grpo --preset dr_grpo --reward food:apple\\ pie

Per step (rl.py runs the loop): sample G completions for each of the step's prompts from π_old;
score them; advantages from the group's rewards; then μ = --updates inner updates of

    L = aggregate( −min(ρ·Â, clip(ρ, 1−ε_low, 1+ε_high)·Â)  +  β·KL_t  −  c_H·H_t )  +  preservation

with ρ = π_θ/π_old per token (or GSPO's per-sequence ratio). With μ = 1 the ratio is identically 1 at
the only update, so clipping never acts; the default μ = 2 makes the second update a real PPO-style
step against π_old.

Defaults follow the DeepSeekMath GRPO recipe (group-normalised advantages with the Bessel std, ε 0.2,
KL in the loss, per-sequence token mean) except where we measured better for this task (median
figures and the commands: README "Never break the model"):
  μ = 2        the paper's setting of one update per batch leaves the ratio at 1 and the clip dead
  --kl exact   the full-vocabulary KL(π‖π_ref) per position instead of the paper's sampled k3. At the
               character level it costs nothing, and its gradient is the true reverse-KL gradient (k3's
               is the forward KL's, see kl.py); k3's gradient on an all-pizza batch only pushes the
               sampled token down, leaking mass into malformed lines (final malformed up to 0.017).
  β 0.3        (paper 0.04) with lr 6e-4 (papers use ~1e-6 on billion-parameter models) and G = 16 x 4
               prompts (rl_config.py). Judged at EVERY step on 4 hard targets x 2 seeds (ravin's apple
               pie and fried rice, bob's and jo's salad, p = 0.02-0.04) plus pizza: β 0.04, lr 1e-3, G 8
               passed 0 of 8 (peak malformed mass median 0.077, max 0.096: GRPO gives a failing
               completion a negative advantage at every token, forced ones included, and pushing down
               the "y" of "curr|y" put 7 % of ravin's mass on "curram"); β 0.2 0/8; lr 5e-4 4/10;
               lr 5e-4 with β 0.2 6/10 (peak malformed max 0.026); the default 14 of 16 over 8 hard
               pairs (peak malformed max 0.020). Measured against the exact optimum (frontier.py), this
               per-token β under the token mean ends where a sequence-level β of about 0.15 would on pizza
               (compare's implied β 0.149, 0.115-0.16); every (person, food) pair reaches 0.95.
  --fork-entropy h (off) lets only tokens where π_ref's entropy is >= h carry the policy loss
               (losses.forking_token_mask); measured, it did not lower the malformed peaks (0/10).
The per-step trust region (trust_region.py, on for every algorithm) and the stop rule (stopping.py)
belong to the run, not to the loss.
Presets, each only the flags it names (the run's lr, G, trust region and preservation stay);
explicit flags override a preset:
  grpo       the paper's loss, β 0.04 and k3 estimator (μ = 2, ε 1e-4 in the std, warm-up, gradient
             clip and trust region as everywhere here)
  dr_grpo    no std division, Σ over tokens / (B·max_len), β 0           (Dr. GRPO, 2503.20783)
  dapo       ε_high 0.28, equal-reward groups dropped, token-mean, β 0   (DAPO, 2503.14476; dropped, not
             re-sampled, and no overlong shaping: completions here are far below the length limit)
  gspo       sequence-level ratio, ε 3e-4 / 4e-4, β 0                  (GSPO, 2507.18071; one ratio per
             sequence, the paper's GSPO, not verl's GSPO-token variant)
  rloo       RLOO-style: leave-one-out baseline, no std, k1 KL (β 0.04) folded into the reward (RLOO, 2402.14740;
             departure: μ = 2 clipped updates, where RLOO takes one REINFORCE step)
  reinforce  REINFORCE++-style: batch-mean baseline and batch std, token-mean, k1 KL (β 0.04) folded into
             the reward as ONE scalar per sequence (2501.03262 puts it per token into token-level returns)
  j_beta     the exact gradient of J_β(π) = E_y[r(y)] − β·KL(π(·|x)‖π_ref(·|x)) over whole completions
             (β 0.1). Differentiating, with E[∇log π] = 0:
                 ∇J_β = E_{y~π}[(r(y) − β·log(π(y)/π_ref(y)) − b)·∇log π(y)], any b independent of y,
             and log π(y)/π_ref(y) = Σ_t log(π/π_ref)(y_t). So: k1 summed over the completion, in the reward
             (on-policy π_old = π_θ); RLOO's leave-one-out baseline (independent of y_i); no std division
             (a y-dependent rescaling per group); Σ over tokens per sequence, mean over sequences (no 1/|o|);
             μ = 1 (ρ ≡ 1: the expected update IS the gradient). Its fixed point is the exact optimum
             π*_β ∝ π_ref·e^{r/β} (minigrpo/frontier.py): measured in bench's optimum section (README, "What
             only exact ground truth can show"). Every other preset changes the objective it climbs: the
             default's per-token KL under a 1/|o| mean is a length-dependent β, std division and clipping
             reweight groups and samples.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

from minigrpo.advantages import batch_scaled, equal_groups, group_advantages, rloo_advantages
from minigrpo.cli import UsageError, main_guard, meta
from minigrpo.kl import ESTIMATORS, exact
from minigrpo.losses import AGG_MODES, aggregate, clipped_surrogate, entropy, forking_token_mask, surrogate_stats
from minigrpo.metrics import combine_stats
from minigrpo.rl import COST_PANELS, OUTCOME_PANELS, run
from minigrpo.rl_config import RLConfig, check_ranges, parse_rl_config
from minigrpo.rollout import RolloutBatch, generation_logprobs

PRESETS = {
    "grpo": {"kl": "k3", "beta": 0.04},
    "dr_grpo": {"adv_scale": "none", "loss_agg": "seq-mean-token-sum-norm", "beta": 0.0},
    "dapo": {"clip_high": 0.28, "skip_equal_groups": True, "loss_agg": "token-mean", "beta": 0.0},
    "gspo": {"ratio": "sequence", "clip_low": 3e-4, "clip_high": 4e-4, "beta": 0.0},
    "rloo": {"baseline": "rloo", "adv_scale": "none", "kl": "k1", "kl_in": "reward", "loss_agg": "token-mean",
             "beta": 0.04},
    "reinforce": {"baseline": "batch", "adv_scale": "batch", "kl": "k1", "kl_in": "reward", "loss_agg": "token-mean",
                  "beta": 0.04},
    "j_beta": {"baseline": "rloo", "adv_scale": "none", "kl": "k1", "kl_in": "reward", "loss_agg": "seq-mean-token-sum",
               "updates": 1, "beta": 0.1},
}


@dataclass
class GRPOConfig(RLConfig):
    preset: str | None = field(default=None, metadata=meta(
        "set several flags at once (explicit flags win)", choices=sorted(PRESETS)))
    updates: int = field(default=2, metadata=meta(
        "μ: inner updates per rollout (1 makes the ratio identically 1 and the clip dead)"))
    clip_low: float = field(default=0.2, metadata={"help": "ε_low: ratio clipped below at 1−ε_low"})
    clip_high: float | None = field(default=None, metadata=meta(
        "ε_high: ratio clipped above at 1+ε_high (default ε_low; DAPO 0.28)"))
    dual_clip: float | None = field(default=None, metadata=meta(
        "dual-clip constant c > 1 bounding the loss for negative advantages"))
    beta: float = field(default=0.3, metadata=meta("β: KL(π‖π_ref) weight (the paper: 0.04; see the docstring)"))
    kl: str = field(default="exact", metadata=meta(
        "KL estimator per token (exact: full vocabulary; the paper uses k3)", choices=["k1", "k2", "k3", "exact"]))
    kl_in: str = field(default="loss", metadata=meta(
        "where the KL goes: a loss term, or subtracted from the reward (β·Σ_t k)", choices=["loss", "reward"]))
    baseline: str = field(default="group", metadata=meta(
        "reward baseline: group mean, leave-one-out (rloo), or batch mean", choices=["group", "rloo", "batch"]))
    adv_scale: str = field(default="group", metadata=meta(
        "divide advantages by the group std, the batch std, or nothing", choices=["group", "batch", "none"]))
    adv_std: str = field(default="unbiased", metadata=meta(
        "std with Bessel's correction (paper, TRL) or the population std", choices=["unbiased", "population"]))
    adv_eps: float = field(default=1e-4, metadata={"help": "ε added to the std"})
    loss_agg: str = field(default="seq-mean-token-mean", metadata=meta(
        "loss aggregation over tokens and sequences", choices=list(AGG_MODES)))
    ratio: str = field(default="token", metadata=meta(
        "importance ratio per token, or one per sequence (GSPO; not GSPO-token)", choices=["token", "sequence"]))
    entropy_coef: float = field(default=0.0, metadata={"help": "entropy bonus weight"})
    fork_entropy: float = field(default=0.0, metadata=meta(
        "only tokens where π_ref's entropy is >= this (nats) carry the policy loss (0 = all; "
        "losses.forking_token_mask)"))
    skip_equal_groups: bool = field(default=False, metadata=meta(
        "drop groups whose rewards are all equal (they carry no signal)"))


def advantages(rewards: torch.Tensor, cfg: GRPOConfig) -> torch.Tensor:
    """(N,) rewards grouped G by G -> (N,) advantages per the --baseline / --adv-scale flags."""
    r = rewards.view(-1, cfg.group_size)  # (prompts, G)
    unbiased = cfg.adv_std == "unbiased"
    if cfg.baseline == "group":
        return group_advantages(r, cfg.adv_scale, unbiased, cfg.adv_eps).flatten()
    if cfg.baseline == "rloo":
        adv = rloo_advantages(r).flatten()
    else:  # batch mean (REINFORCE++)
        adv = rewards - rewards.mean()
    if cfg.adv_scale == "none":
        return adv
    if cfg.adv_scale == "batch":  # REINFORCE++: the centred advantages over their batch std
        return batch_scaled(adv, unbiased, cfg.adv_eps)
    raise UsageError(f"--adv-scale group needs --baseline group (got --baseline {cfg.baseline}); use batch or none")


def kl_per_token(logp, ref_logp, logits, ref_logits, kind: str) -> torch.Tensor:
    """(N, T) per-token KL(π‖π_ref) by the chosen estimator; 'exact' sums over the whole vocabulary."""
    return exact(logits, ref_logits) if kind == "exact" else ESTIMATORS[kind](logp, ref_logp)


def grpo_loss(logp, old_logp, ref_logp, logits, ref_logits, adv, mask, cfg: GRPOConfig, policy_mask=None):
    """The loss of one GRPO update (preservation, added by the run, aside) -> (loss, policy_loss, KL_t, H_t).

        loss = aggregate(−min(ρ·Â, clip(ρ, 1−ε_low, 1+ε_high)·Â)) + β·aggregate(KL_t) − c_H·aggregate(H_t)

    logp (N, T): log π_θ of the sampled completion tokens (with gradient); old_logp, ref_logp (N, T):
    π_old's and π_ref's (no gradient); logits, ref_logits (N, T, V): π_θ's and π_ref's next-token logits
    at those positions; adv (N,): one advantage per completion; mask (N, T) bool: valid tokens.
    The surrogate (losses.clipped_surrogate, ε = cfg.clip_low / clip_high, cfg.dual_clip, cfg.ratio) runs
    over policy_mask (default mask; --fork-entropy narrows it), every aggregate over mask with
    cfg.loss_agg and max_len cfg.max_new_tokens. KL_t = kl_per_token(…, cfg.kl) enters the loss only when
    cfg.beta > 0 and cfg.kl_in == "loss" (with "reward" the run folded it into the rewards already);
    H_t = losses.entropy(logits), subtracted when cfg.entropy_coef ≠ 0. KL_t and H_t (N, T) are returned
    for logging. (DeepSeekMath 2402.03300 eq. 3; the flags: the module docstring.)
    """
    agg = lambda x: aggregate(x, mask, cfg.loss_agg, cfg.max_new_tokens)  # noqa: E731 (one reduction for all)
    per_token = clipped_surrogate(logp, old_logp, adv[:, None], mask if policy_mask is None else policy_mask,
                                  cfg.clip_low, cfg.clip_high, cfg.dual_clip, cfg.ratio)
    policy_loss = agg(per_token)
    kl_tok = kl_per_token(logp, ref_logp, logits, ref_logits, cfg.kl)
    ent = entropy(logits)
    loss = policy_loss
    if cfg.beta > 0 and cfg.kl_in == "loss":
        loss = loss + cfg.beta * agg(kl_tok)
    if cfg.entropy_coef:
        loss = loss - cfg.entropy_coef * agg(ent)
    return loss, policy_loss, kl_tok, ent


class GRPO:
    needs_ref_logits = True  # for the exact-KL metric (cheap: the vocabulary is ~30 characters)

    def __init__(self, run):
        self.run, self.cfg, self.policy = run, run.cfg, run.policy
        # π_old's log-probs are needed before the first update only to fold the KL into the reward;
        # otherwise the first update's own forward pass gives them (π_θ = π_old there): one forward saved.
        self.needs_old_logp = self.cfg.beta > 0 and self.cfg.kl_in == "reward"

    def parameters(self):
        return list(self.policy.parameters())

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def update(self, batch: RolloutBatch, opt) -> dict:
        cfg, G = self.cfg, self.cfg.group_size
        rewards = batch.rewards
        stats = {}
        if self.needs_old_logp:  # fold β·Σ_t k(π_old, π_ref) into each sequence's reward
            kl_seq = torch.where(batch.mask, ESTIMATORS[cfg.kl](batch.old_logp, batch.ref_logp), 0.0).sum(1)
            rewards = rewards - cfg.beta * kl_seq
            stats["kl_reward_penalty"] = (cfg.beta * kl_seq).mean().item()
        equal = equal_groups(rewards.view(-1, G))  # (prompts,)
        stats["equal_groups"] = equal.float().mean().item()
        adv = advantages(rewards, cfg)
        stats.update(adv_mean=adv.mean().item(), adv_std=adv.std().item())
        if cfg.skip_equal_groups:
            keep = (~equal).repeat_interleave(G).nonzero().flatten()
            if len(keep) == 0:  # no RL signal in this batch; preservation still gets its update
                anchor = self.run.anchor_term()
                if anchor is not None:
                    stats["preserve_loss"] = anchor.item()
                    stats["grad_norm"] = self.run.clip_and_step(opt, anchor, self.parameters())
                return {**stats, "skipped": 1.0}
            batch, adv = batch.select(keep), adv[keep]
        mask, per_update, ratio_stats, fork = batch.mask, [], [], None
        for i in range(cfg.updates):
            logp, logits = generation_logprobs(self.policy, batch.gen, cfg.temperature, return_logits=True)
            if batch.old_logp is None:  # first update: π_θ is π_old, so its log-probs are π_old's exactly
                batch.old_logp = logp.detach()
            if fork is None:  # once per rollout, from π_ref's entropies
                fork = forking_token_mask(entropy(batch.ref_logits), mask, cfg.fork_entropy) \
                    if cfg.fork_entropy else mask
            loss, policy_loss, kl_tok, ent = grpo_loss(logp, batch.old_logp, batch.ref_logp, logits, batch.ref_logits,
                                                       adv, mask, cfg, fork)
            anchor = self.run.anchor_term()
            if anchor is not None:
                loss = loss + anchor
            if i > 0 or cfg.updates == 1:  # the first of μ > 1 updates has ρ ≡ 1: it would halve what the clip saw
                s = surrogate_stats(logp, batch.old_logp, adv[:, None], mask, cfg.clip_low, cfg.clip_high, cfg.ratio)
                ratio_stats.append({k: v.item() for k, v in s.items()})
            per_update.append(update_stats(cfg, policy_loss, loss, kl_tok, logits, batch.ref_logits, ent, mask, anchor))
            per_update[-1]["grad_norm"] = self.run.clip_and_step(opt, loss, self.parameters())
        # losses: the mean over the μ updates; ratio and clip statistics: over updates 2..μ (max ratio: the max)
        return {**stats, **combine_stats(per_update), **combine_stats(ratio_stats)}


@torch.no_grad()
def update_stats(cfg, policy_loss, loss, kl_tok, logits, ref_logits, ent, mask, anchor) -> dict:
    """What one inner update logs: its losses, the KL per token (the chosen estimator's and the exact one)
    and the entropy, token-means over the completions."""
    exact_kl = kl_tok if cfg.kl == "exact" else exact(logits, ref_logits)
    return {"policy_loss": policy_loss.item(), "loss": loss.item(),
            f"kl_{cfg.kl}": aggregate(kl_tok, mask, "token-mean").item(),
            "kl_exact": aggregate(exact_kl, mask, "token-mean").item(),
            "entropy": aggregate(ent, mask, "token-mean").item(),
            **({"preserve_loss": anchor.item()} if anchor is not None else {})}


PANELS = OUTCOME_PANELS + [
    ("KL to π_ref per token (lower = closer)", ["kl_exact", "kl_k1", "kl_k2", "kl_k3"]),
    ("entropy per token", ["entropy"]),
    ("clip fractions", ["clip_frac_low", "clip_frac_high"]),
    ("ratio π/π_old", ["ratio_mean", "ratio_max"]),
    ("advantage mean / std", ["adv_mean", "adv_std"]),
    ("share of equal-reward groups (lower = more signal)", ["equal_groups"]),
    ("completion length (tokens)", ["completion_len"]),
] + COST_PANELS


def train(cfg: GRPOConfig, log=print) -> dict:
    check_ranges(cfg, {"clip_low": (0, 1), "clip_high": (0, None), "beta": (0, None), "adv_eps": (0, None),
                       "entropy_coef": (None, None), "fork_entropy": (0, None)})
    if cfg.updates < 1:
        raise UsageError(f"--updates must be >= 1, got {cfg.updates}")
    if cfg.dual_clip is not None and cfg.dual_clip <= 1:
        raise UsageError(f"--dual-clip must be > 1, got {cfg.dual_clip}")
    if cfg.kl == "exact" and cfg.kl_in == "reward" and cfg.beta > 0:
        raise UsageError("--kl exact works only with --kl-in loss (the reward penalty uses k1, k2 or k3)")
    if cfg.adv_scale == "group" and cfg.baseline != "group":
        raise UsageError(f"--adv-scale group needs --baseline group (got {cfg.baseline}); "
                         f"use --adv-scale batch or none")
    return run(cfg, GRPO, "grpo", PANELS, log)


@main_guard
def main(argv=None):
    cfg = parse_rl_config(GRPOConfig, argv, __doc__.split("\n\n")[0], "grpo", PRESETS)
    train(cfg)


if __name__ == "__main__":
    main(sys.argv[1:])
