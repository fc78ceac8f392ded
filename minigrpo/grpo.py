"""GRPO (DeepSeekMath, arXiv 2402.03300) and its variants, one flag (or one --preset) apart.

    python -m minigrpo.grpo --reward pizza
    python -m minigrpo.grpo --preset dr_grpo --reward food:apple\\ pie

Per step (rl.py runs the loop): sample G completions for each of the step's prompts from π_old;
score them; advantages from the group's rewards; then μ = --updates inner updates of

    L = aggregate( −min(ρ·Â, clip(ρ, 1−ε_low, 1+ε_high)·Â)  +  β·KL_t  −  c_H·H_t )  +  preservation

with ρ = π_θ/π_old per token (or GSPO's per-sequence ratio). With μ = 1 the ratio is identically 1 at
the only update, so clipping never acts; the default μ = 2 makes the second update a real PPO-style
step against π_old. --policy-loss cispo|gmpo|sapo replaces the first term (policy_losses.py).

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
belong to the run, not to the loss. The flags, their checks and the presets (--preset NAME: grpo, dr_grpo,
dapo, gspo, rloo, reinforce, j_beta and the second wave: cispo, gmpo, sapo, clip_cov, kl_cov, entropy_8020,
remax, reinforce_rej, gpg, random_reward), each with its paper and departures: grpo_config.py.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import torch

from minigrpo.objectives.advantages import (batch_scaled, equal_groups, gpg_scale, group_advantages, remax_advantages,
                                 rloo_advantages)
from minigrpo.util.cli import UsageError, exit_now, main_guard
from minigrpo.objectives.entropy_control import (applied_coef, clip_cov_mask, kl_cov_penalty, next_coef, token_covariance,
                                      top_entropy_mask)
from minigrpo.variants.grpo_config import (LOSS_HYPER, PRESETS, SEQUENCE_LOSSES, GRPOConfig, check_grpo_config, is_band,
                                  mismatch)
from minigrpo.objectives.kl import ALL_ESTIMATORS, ESTIMATORS, exact, k3_iw
from minigrpo.objectives.losses import aggregate, entropy, forking_token_mask, surrogate_stats
from minigrpo.metrics import combine_stats
from minigrpo.objectives.policy_losses import POLICY_LOSSES
from minigrpo.rl.loop import COST_PANELS, OUTCOME_PANELS, purpose_seed, run
from minigrpo.rl.config import parse_rl_config
from minigrpo.objectives.importance import correction
from minigrpo.rl.rollout import RolloutBatch, Sampler, generation_logprobs, greedy_rewards

__all__ = ["GRPO", "GRPOConfig", "PRESETS", "advantages", "grpo_loss", "kl_per_token", "main", "train"]


def advantages(rewards: torch.Tensor, cfg: GRPOConfig, greedy_rewards: torch.Tensor | None = None) -> torch.Tensor:
    """(N,) rewards grouped G by G -> (N,) advantages per the --baseline / --adv-scale flags; greedy_rewards
    (prompts,): the reward of each prompt's greedy completion, ReMax's baseline (--baseline remax)."""
    if cfg.adv_scale == "gpg":  # GPG (2504.02546): centred, not divided, times α = N/#(Â ≠ 0) over the batch
        adv = advantages(rewards, replace(cfg, adv_scale="none"), greedy_rewards)
        return adv * gpg_scale(adv)
    r = rewards.view(-1, cfg.group_size)  # (prompts, G)
    unbiased = cfg.adv_std == "unbiased"
    if cfg.baseline == "group":
        return group_advantages(r, cfg.adv_scale, unbiased, cfg.adv_eps).flatten()
    if cfg.baseline == "rloo":
        adv = rloo_advantages(r).flatten()
    elif cfg.baseline == "remax":
        adv = remax_advantages(r, greedy_rewards).flatten()
    else:  # batch mean (REINFORCE++)
        adv = rewards - rewards.mean()
    if cfg.adv_scale == "none":
        return adv
    if cfg.adv_scale == "batch":  # REINFORCE++: the centred advantages over their batch std
        return batch_scaled(adv, unbiased, cfg.adv_eps)
    raise UsageError(f"--adv-scale group needs --baseline group (got --baseline {cfg.baseline}); use batch or none")


def kl_per_token(logp, ref_logp, logits, ref_logits, kind: str, old_logp=None) -> torch.Tensor:
    """(N, T) per-token KL(π‖π_ref) by the chosen estimator; 'exact' sums over the whole vocabulary, 'k3_iw'
    weights k3 by ρ = π_θ/π_old (old_logp: π_old's log-probs of the tokens)."""
    if kind == "exact":
        return exact(logits, ref_logits)
    return k3_iw(logp, ref_logp, old_logp) if kind == "k3_iw" else ALL_ESTIMATORS[kind](logp, ref_logp)


def grpo_loss(logp, old_logp, ref_logp, logits, ref_logits, adv, mask, cfg: GRPOConfig, policy_mask=None,
              generator=None, is_weights=None):
    """The loss of one GRPO update (preservation, added by the run, aside) -> (loss, policy_loss, KL_t, H_t).

        loss = aggregate(L_t) + β·aggregate(KL_t) − c_H·aggregate(H_t),   L_t = POLICY_LOSSES[cfg.policy_loss]

    by default (ppo_clip) L_t = −min(ρ·Â, clip(ρ, 1−ε_low, 1+ε_high)·Â).
    logp (N, T): log π_θ of the sampled completion tokens (with gradient); old_logp, ref_logp (N, T):
    π_old's and π_ref's (no gradient); logits, ref_logits (N, T, V): π_θ's and π_ref's next-token logits
    at those positions; adv (N,): one advantage per completion; mask (N, T) bool: valid tokens.
    L_t (policy_losses.py; its hyper-parameters from the flags: grpo_config.LOSS_HYPER) runs over policy_mask
    (default mask; --fork-entropy narrows it), narrowed further with --top-entropy ρ < 1 to the top ρ share by
    H_t (entropy_control.top_entropy_mask, the 80/20 rule). --cov-control (cov_controlled): clip_cov detaches
    a few high-covariance tokens drawn with `generator`; kl_cov drops the clip and adds k·|log ρ_t|. Every
    is_weights (N, T), --is-correction's constants (is_correction.correction), multiply L_t before its aggregate,
    as TRL and verl apply them (grpo_config.py). Every
    aggregate runs over mask with cfg.loss_agg (a sequence loss, gmpo, with its own: SEQUENCE_LOSSES) and
    max_len cfg.max_new_tokens. KL_t = kl_per_token(…, cfg.kl,
    old_logp) enters the loss only when cfg.beta > 0 and cfg.kl_in == "loss" (with "reward" the run folded
    it into the rewards already); H_t = losses.entropy(logits), subtracted when cfg.entropy_coef ≠ 0. KL_t
    and H_t (N, T) are returned for logging (KL_t None without π_ref: --no-rollout-kl at β = 0). (DeepSeekMath
    2402.03300 eq. 3; the flags: grpo_config.py.)
    """
    agg = lambda x: aggregate(x, mask, cfg.loss_agg, cfg.max_new_tokens)  # noqa: E731 (one reduction for all)
    ent = entropy(logits)
    pmask = mask if policy_mask is None else policy_mask
    if cfg.top_entropy < 1:  # the 80/20 rule: only the current policy's highest-entropy tokens
        pmask = top_entropy_mask(ent.detach(), pmask, cfg.top_entropy)
    hyper = LOSS_HYPER[cfg.policy_loss](cfg)
    if cfg.cov_control == "kl_cov":  # KL-Cov replaces the clip: the unclipped −ρ·Â
        hyper.update(eps_low=math.inf, eps_high=math.inf, dual_clip=None)
    per_token = POLICY_LOSSES[cfg.policy_loss](logp, old_logp, adv[:, None], pmask, **hyper)
    if cfg.cov_control != "none":
        per_token = cov_controlled(per_token, logp, old_logp, adv, pmask, cfg, generator)
    if is_weights is not None:  # the sampler-mismatch correction: constants, no gradient
        per_token = per_token * is_weights
    policy_loss = aggregate(per_token, mask, SEQUENCE_LOSSES.get(cfg.policy_loss, cfg.loss_agg), cfg.max_new_tokens)
    kl_tok = None if ref_logp is None else kl_per_token(logp, ref_logp, logits, ref_logits, cfg.kl, old_logp)
    loss = policy_loss
    if cfg.beta > 0 and cfg.kl_in == "loss":
        loss = loss + cfg.beta * agg(kl_tok)
    if cfg.entropy_coef:
        loss = loss - cfg.entropy_coef * agg(ent)
    return loss, policy_loss, kl_tok, ent


def cov_controlled(per_token, logp, old_logp, adv, mask, cfg: GRPOConfig, generator=None) -> torch.Tensor:
    """Clip-Cov or KL-Cov (Cui et al. 2505.22617, verl) on ppo_clip's per-token loss, (N, T) -> (N, T).

    c_t = (Â_t − Ā)(log π_t − mean log π) over the valid tokens (entropy_control.token_covariance).
    kl_cov: + k·|log ρ_t| on the top --cov-ratio share by c_t. clip_cov: a random --cov-ratio share of the
    tokens with c_t in [--clip-cov-low, --clip-cov-high] that the clip does not already stop is detached.
    """
    cov = token_covariance(logp, adv, mask)
    if cfg.cov_control == "kl_cov":
        return per_token + kl_cov_penalty(logp, old_logp, cov, mask, cfg.cov_ratio, cfg.kl_cov_coef)
    ratio, a = (logp - old_logp).detach().exp(), adv[:, None]
    high = 1 + (cfg.clip_low if cfg.clip_high is None else cfg.clip_high)
    stopped = ((a > 0) & (ratio > high)) | ((a < 0) & (ratio < 1 - cfg.clip_low))  # verl's clip_by_origin
    chosen = clip_cov_mask(cov, mask, cfg.cov_ratio, cfg.clip_cov_low, cfg.clip_cov_high, generator, stopped)
    return torch.where(chosen, per_token.detach(), per_token)


class GRPO:
    needs_ref_logits = True  # for the exact-KL metric (cheap: the vocabulary is ~30 characters)

    def __init__(self, run):
        self.run, self.cfg, self.policy = run, run.cfg, run.policy
        # π_old's log-probs are needed before the first update only to fold the KL into the reward;
        # otherwise the first update's own forward pass gives them (π_θ = π_old there): one forward saved.
        self.needs_old_logp = self.cfg.beta > 0 and self.cfg.kl_in == "reward"
        self.needs_ref = self.cfg.rollout_kl or self.cfg.beta > 0 or self.cfg.fork_entropy > 0
        # the second wave's random streams, never the run's (rl.purpose_seed), and the adaptive entropy state c_k
        device = next(self.policy.parameters()).device
        self.gens = {"random_reward": torch.Generator().manual_seed(purpose_seed(self.cfg.seed, "random_reward")),
                     "clip_cov": torch.Generator(device).manual_seed(purpose_seed(self.cfg.seed, "clip_cov"))}
        self.entropy_coef = self.cfg.entropy_coef
        c = self.cfg  # rollouts from π_sampler ≠ π_old (rollout.Sampler), or None: from π_old
        self.sampler = Sampler(c.sample_temperature, c.sample_top_p, c.sample_stale) if mismatch(c) else None

    def parameters(self):
        return list(self.policy.parameters())

    def state_dict(self) -> dict:
        return {"gens": {k: g.get_state() for k, g in self.gens.items()}, "entropy_coef": self.entropy_coef,
                **({"sampler": self.sampler.state_dict()} if self.sampler is not None else {})}

    def load_state_dict(self, state: dict) -> None:
        for k, g_state in state.get("gens", {}).items():  # a checkpoint of an older minigrpo holds none
            self.gens[k].set_state(g_state)
        self.entropy_coef = state.get("entropy_coef", self.entropy_coef)
        if self.sampler is not None:
            self.sampler.load_state_dict(state["sampler"])

    def update(self, batch: RolloutBatch, opt) -> dict:
        cfg, G = self.cfg, self.cfg.group_size
        rewards, stats, greedy = batch.rewards, {}, None
        if cfg.random_reward:  # the control of 2506.10947: Bernoulli(0.5) draws, blind to the completions
            rewards = torch.bernoulli(torch.full(rewards.shape, 0.5), generator=self.gens["random_reward"]).to(rewards)
            stats["random_reward_mean"] = rewards.mean().item()
        if cfg.baseline == "remax":
            greedy = greedy_rewards(self.policy, self.run.tok, self.run.reward, batch.prompts[::G],
                                    cfg.max_new_tokens, cfg.unfinished_reward)
            stats["greedy_reward_mean"] = greedy.mean().item()
        if self.needs_old_logp:  # fold β·Σ_t k(π_old, π_ref) into each sequence's reward
            kl_seq = torch.where(batch.mask, ESTIMATORS[cfg.kl](batch.old_logp, batch.ref_logp), 0.0).sum(1)
            rewards = rewards - cfg.beta * kl_seq
            stats["kl_reward_penalty"] = (cfg.beta * kl_seq).mean().item()
        equal = equal_groups(rewards.view(-1, G))  # (prompts,)
        stats["equal_groups"] = equal.float().mean().item()
        adv = advantages(rewards, cfg, greedy)
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
        mask, per_update, ratio_stats, fork, loss_cfg, is_w = batch.mask, [], [], None, cfg, {}
        for i in range(cfg.updates):
            logp, logits = generation_logprobs(self.policy, batch.gen, cfg.temperature, return_logits=True)
            if batch.old_logp is None:  # first update: π_θ is π_old, so its log-probs are π_old's exactly
                batch.old_logp = logp.detach()
            if i == 0 and (self.sampler is not None or cfg.is_correction != "none"):  # π_old/π_sampler, once
                w, s = correction(cfg.is_correction, batch.old_logp, batch.sampler_logp, mask, cfg.is_level,
                                  cfg.is_cap or 2.0, is_band(cfg))
                stats.update(s)
                is_w = {} if w is None else {"is_weights": w}  # passed only when on (a learner's grpo_loss has none)
            if fork is None:  # once per rollout, from π_ref's entropies
                fork = forking_token_mask(entropy(batch.ref_logits), mask, cfg.fork_entropy) \
                    if cfg.fork_entropy else mask
            if i == 0 and cfg.entropy_target is not None:  # this step's coefficient, from π_old's entropy
                loss_cfg = self.adapt_entropy_coef(logits, mask, stats)
            loss, policy_loss, kl_tok, ent = grpo_loss(logp, batch.old_logp, batch.ref_logp, logits, batch.ref_logits,
                                                       adv, mask, loss_cfg, fork, self.gens["clip_cov"], **is_w)
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
    def adapt_entropy_coef(self, logits, mask, stats: dict) -> GRPOConfig:
        """Skywork-OR1's adaptive entropy control (2505.22312): this step's bonus α_k = c_k·1[e_k ≤ target] from
        the rollout's mean token entropy e_k under π_old, then c_{k+1} = clip(c_k ± Δ, 0, max) toward the target
        (entropy_control.next_coef). -> the config with entropy_coef α_k; logs e_k, c_k and α_k into stats."""
        cfg = self.cfg
        e = aggregate(entropy(logits), mask, "token-mean").item()
        alpha = applied_coef(self.entropy_coef, e, cfg.entropy_target)
        stats.update(entropy_rollout=e, entropy_coef=self.entropy_coef, entropy_coef_applied=alpha)
        self.entropy_coef = next_coef(self.entropy_coef, e, cfg.entropy_target, cfg.entropy_step, 0.0,
                                      cfg.entropy_coef_max)
        return replace(cfg, entropy_coef=alpha)


@torch.no_grad()
def update_stats(cfg, policy_loss, loss, kl_tok, logits, ref_logits, ent, mask, anchor) -> dict:
    """What one inner update logs: its losses, the KL per token (the chosen estimator's and the exact one; not
    without π_ref) and the entropy, token-means over the completions."""
    mean = lambda x: aggregate(x, mask, "token-mean").item()  # noqa: E731
    kl = {} if kl_tok is None else {f"kl_{cfg.kl}": mean(kl_tok),
                                    "kl_exact": mean(kl_tok if cfg.kl == "exact" else exact(logits, ref_logits))}
    return {"policy_loss": policy_loss.item(), "loss": loss.item(), **kl,
            "entropy": mean(ent), **({"preserve_loss": anchor.item()} if anchor is not None else {})}


PANELS = OUTCOME_PANELS + [
    ("KL to π_ref per token (lower = closer)", ["kl_exact", "kl_k1", "kl_k2", "kl_k3", "kl_k3+", "kl_k3_iw"]),
    ("entropy per token", ["entropy", "entropy_rollout"]),
    ("adaptive entropy coefficient", ["entropy_coef", "entropy_coef_applied"]),
    ("clip fractions", ["clip_frac_low", "clip_frac_high"]),
    ("ratio π/π_old", ["ratio_mean", "ratio_max"]),
    ("advantage mean / std", ["adv_mean", "adv_std"]),
    ("rewards in the update: random control, greedy baseline", ["random_reward_mean", "greedy_reward_mean"]),
    ("sampler mismatch: mean IS weight, share capped / masked, KL(π_sampler‖π_old)",
     ["is_weight_mean", "is_capped", "is_masked", "sampler_kl"]),
    ("share of equal-reward groups (lower = more signal)", ["equal_groups"]),
    ("completion length (tokens)", ["completion_len"]),
] + COST_PANELS


def train(cfg: GRPOConfig, log=print) -> dict:
    check_grpo_config(cfg)
    return run(cfg, GRPO, "grpo", PANELS, log)


@main_guard
def main(argv=None):
    cfg = parse_rl_config(GRPOConfig, argv, __doc__.split("\n\n")[0], "grpo", PRESETS)
    train(cfg)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_now()  # the files are closed: skip the interpreter's teardown (cli.exit_now)
