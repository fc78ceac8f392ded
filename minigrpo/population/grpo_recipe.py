"""One GRPO recipe's advantages and loss for a lockstep population's members that follow it
(grpo_update.py drives them): the pure functions of grpo.py (`GRPO.update`), mapped over a leading
member dim with torch.func.vmap.

    recipe = Recipe(cfg, grpo_loss)          # cfg: its first member's GRPOConfig
    sig = recipe.signal(step)                # its members' rollouts (population/rows.Rollouts) ->
                                             # advantages, mask
    loss, figures, ratio = recipe.loss(sig, i, logp, logits)   # inner update i's (P_r,) loss,
                                                               # without the anchor

RECIPE names what members may differ in beyond lockstep.OWN: the policy loss, the KL estimator and
where it goes, the baselines and scales, the entropy controls, the aggregation, β (and a preset's
name); none of them is read outside the update. Members with β's of their own (all > 0, or all 0)
follow one Recipe: β is a number inside grpo_loss, which vmap cannot map, so the loss is mapped
without its KL term and each member's β·agg(KL_t) is added after it (--kl-in reward: the penalty of
β = 1, times each β); the same arithmetic as the single run's where the entropy bonus is off.

What it runs: every variant whose functions are pure over one member's tensors (the policy losses,
KL estimators, baselines and scales, aggregations; --random-reward's draws, each member's from its
own stream; ReMax's greedy decodes, member by member). The entropy controls (the token filters that
rank, Clip-Cov's draws, an adaptive coefficient) take their loss member by member (`loss_each`),
each with its own generator and coefficient. Another sampler (its temperature, its nucleus, its
stale weights: population/stale.StaleWeights) samples every member's rows in the one batch; its
figures and --is-correction's weights are each member's own (`is_weights`). --skip-equal-groups
(DAPO, REINFORCE-Rej) drops a member's equal-reward groups by masking their tokens, which is
dropping them for a token-mean; a mean over sequences would still count the masked rows, so each
term that is one is rescaled by N / (the rows kept). A member with no group left takes its μ updates
of the anchor alone, as GRPO.preservation_only (without an anchor it keeps weights and optimiser
state: lm/optim.AdamW.step's mask).
"""

from __future__ import annotations

from dataclasses import fields, replace
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch.func import vmap

from minigrpo.objectives.advantages import equal_groups
from minigrpo.objectives.losses import aggregate, surrogate_stats
from minigrpo.population.rows import Rollouts
from minigrpo.rl.rollout import greedy_rewards
from minigrpo.variants.advantages import BASELINES, AdvantageFlags, advantages, update_rewards
from minigrpo.variants.entropy import EntropyFlags, fork_mask
from minigrpo.variants.kl import kl_figures, kl_reward_penalty
from minigrpo.variants.policy_losses import PolicyLossFlags, reduction
from minigrpo.variants.sampler import weights

# the settings of a member's recipe (its update's own; --rollout-kl, --is-correction and the sampler
# are the run's)
RECIPE = (
    *(f.name for flags in (PolicyLossFlags, AdvantageFlags, EntropyFlags) for f in fields(flags)),
    "kl",
    "kl_in",
    "beta",
    "loss_agg",
    "preset",
)


def recipe_of(cfg) -> tuple:
    """What members of one Recipe share: every RECIPE setting but β and the preset's name, and
    whether β is 0."""
    return (*(getattr(cfg, k) for k in RECIPE if k not in ("beta", "preset")), cfg.beta > 0)


class Recipe:
    """One recipe's advantages and loss, over its members' leading dim (cfg: its first member's)."""

    def __init__(self, cfg, grpo_loss):
        self.cfg, self.grpo_loss = cfg, grpo_loss
        # what the caller computes first
        self.needs_ref = cfg.rollout_kl or cfg.beta > 0 or cfg.fork_entropy > 0
        self.needs_old_logp = cfg.beta > 0 and cfg.kl_in == "reward"
        ref = 0 if self.needs_ref else None  # without π_ref's log-probs: None for every member
        loss = lambda c: vmap(
            lambda lp, old, rlp, lg, rlg, adv, m, w: grpo_loss(  # w: the sampler's
                lp, old, rlp, lg, rlg, adv, m, c, is_weights=w
            ),
            in_dims=(0, 0, ref, 0, ref, 0, 0, 0 if cfg.is_correction != "none" else None),
        )
        # the entropy controls (filters that rank by a count read from the data, Clip-Cov's draws
        # from each member's
        # generator, a coefficient of each member's own) cannot be mapped: their loss is taken
        # member by member
        self.each = (cfg.cov_control, cfg.top_entropy, cfg.fork_entropy, cfg.entropy_target) != (
            "none",
            1,
            0,
            None,
        )
        self.mapped = loss(cfg)
        self.ratio_stats = vmap(
            lambda lp, old, a, m: surrogate_stats(
                lp, old, a[:, None], m, cfg.clip_low, cfg.clip_high, cfg.ratio
            )
        )
        self.mean = vmap(lambda x, m: aggregate(x, m, "token-mean"))
        self.kl_figures = vmap(lambda kl, lg, rlg, m: kl_figures(kl, lg, rlg, m, cfg))
        # ReMax's baseline: each member's (P, prompts)
        greedy = 0 if BASELINES[cfg.baseline].needs_greedy else None
        self.advantages = vmap(lambda r, g: advantages(r, cfg, g), in_dims=(0, greedy))
        self.penalty = vmap(lambda old, ref, m: kl_reward_penalty(old, ref, m, cfg))
        # members with β's of their own (a number inside grpo_loss, not a tensor vmap maps): the
        # loss without its KL
        # term and the penalty per unit of β, then times each member's β
        self.mapped_apart = loss(replace(cfg, beta=0.0))
        self.kl_term = vmap(lambda kl, m: aggregate(kl, m, cfg.loss_agg, cfg.max_new_tokens))
        self.penalty_per_beta = vmap(
            lambda old, ref, m: kl_reward_penalty(old, ref, m, replace(cfg, beta=1.0))
        )
        self.equal = vmap(lambda r: equal_groups(r.view(-1, cfg.group_size)))  # (P, prompts) bool
        # the step's figures a skipped member logs; its figures in its run's order
        self.before, self.order = [], []

    @torch.no_grad()
    def is_weights(self, step: Rollouts, old_logp, mask, stats: dict) -> torch.Tensor | None:
        """Another sampler's figures and its --is-correction weights (P, N, T) or None:
        variants/sampler.weights member by member on its own rows (its sampler's log-probs are its
        Generation's), as GRPO.update takes them at the first update."""
        some, T = next(b for b in step.batches if b is not None), mask.size(-1)
        figures, ws = [], []
        for p, (b, a) in enumerate(zip(step.batches, step.algos)):
            # a failed member's slot: any rows, not kept
            b, t = b or some, (b or some).gen.logprobs.size(1)
            figures.append({})
            mine = SimpleNamespace(old_logp=old_logp[p, :, :t], sampler_logp=b.gen.logprobs)
            w = weights(self.cfg, a.sampler, mine, mask[p, :, :t], figures[-1]).get("is_weights")
            ws.append(None if w is None else F.pad(w, (0, T - t)))
        for k in figures[0]:
            stats[k] = torch.tensor([f[k] for f in figures], device=mask.device)
        return None if ws[0] is None else torch.stack(ws)

    def loss_each(
        self,
        logp,
        old_logp,
        ref_logp,
        logits,
        ref_logits,
        adv,
        mask,
        algos: list,
        stats: dict | None,
        is_w=None,
    ):
        """grpo_loss member by member, each with its own Clip-Cov generator and entropy bonus -> its
        outputs stacked. `stats`: given at the step's first update, where each member's EntropyBonus
        sets its coefficient for the step (from π_old, as GRPO.update) and its figures join the
        step's."""
        take = lambda x, p: None if x is None else x[p]
        if stats is not None:
            figures = [{} for _ in algos]
            self.loss_cfgs = [
                a.entropy_bonus.for_step(logits[p], mask[p], figures[p])
                for p, a in enumerate(algos)
            ]
            for k in figures[0]:  # --entropy-target's e_k, c_k, α_k
                stats[k] = torch.tensor([f[k] for f in figures], device=logp.device)
        outs = [
            self.grpo_loss(
                logp[p],
                old_logp[p],
                take(ref_logp, p),
                logits[p],
                take(ref_logits, p),
                adv[p],
                mask[p],
                c,
                fork_mask(take(ref_logits, p), mask[p], c),
                a.gens["clip_cov"],
                take(is_w, p),
            )
            for p, (a, c) in enumerate(zip(algos, self.loss_cfgs))
        ]
        return tuple(None if x[0] is None else torch.stack(x) for x in zip(*outs))

    def signal(self, step: Rollouts) -> SimpleNamespace:
        """Rewards -> one advantage per completion, the tokens that count and who updates (its
        members' step)."""
        cfg, stats, rewards = self.cfg, {}, step.rewards
        # each member's Bernoulli(0.5) draws from its own stream (on the CPU, as alone)
        if cfg.random_reward:
            rewards = torch.stack(
                [
                    update_rewards(torch.zeros(rewards.size(1)), cfg, a.gens["random_reward"], {})
                    for a in step.algos
                ]
            ).to(rewards)
            stats["random_reward_mean"] = rewards.mean(-1)
        greedy = None
        # ReMax: each member's greedy completions, by its own GPT (π_old)
        if BASELINES[cfg.baseline].needs_greedy:
            greedy = torch.stack(
                [
                    greedy_rewards(
                        r.policy,
                        r.tok,
                        r.reward,
                        b.prompts[:: cfg.group_size],
                        cfg.max_new_tokens,
                        cfg.unfinished_reward,
                    )
                    if b is not None
                    else torch.zeros(cfg.prompts_per_step, device=rewards.device)
                    for r, b in zip(step.runs, step.batches)
                ]
            )
            stats["greedy_reward_mean"] = greedy.mean(-1)
        # members of β's of their own (cfg: the first's)
        apart = any(r.cfg.beta != cfg.beta for r in step.runs)
        betas = (
            torch.tensor([r.cfg.beta for r in step.runs], device=rewards.device) if apart else None
        )
        # β·Σ_t k(π_old, π_ref) off each sequence's reward
        if cfg.beta > 0 and cfg.kl_in == "reward":
            mask = step.rows.completion_mask
            penalty = (
                self.penalty(step.old_logp, step.ref_logp, mask)
                if not apart
                else betas[:, None] * self.penalty_per_beta(step.old_logp, step.ref_logp, mask)
            )
            rewards = rewards - penalty
            stats["kl_reward_penalty"] = penalty.mean(-1)
        equal = self.equal(rewards)
        stats["equal_groups"] = equal.float().mean(-1)
        adv = self.advantages(rewards, greedy)
        stats.update(adv_mean=adv.mean(-1), adv_std=adv.std(-1))
        mask, active, drop = step.rows.completion_mask, None, None
        # DAPO, REINFORCE-Rej: only the groups whose rewards differ, their rows' tokens kept
        if cfg.skip_equal_groups:
            differ = ~equal
            kept = differ.repeat_interleave(cfg.group_size, -1)  # (P, N)
            mask = mask & kept[..., None]
            # (P,): no RL signal; the anchor alone updates (GRPO.preservation_only)
            skipped = ~differ.any(-1)
            stats["skipped"] = skipped.float()
            active = ~skipped
            # a mean over sequences: over the kept ones (below)
            drop = kept.size(1) / kept.sum(-1).clamp(min=1)
        self.before = list(stats)
        return SimpleNamespace(
            stats=stats,
            adv=adv,
            mask=mask,
            active=active,
            drop=drop,
            betas=betas,
            old_logp=step.old_logp,
            is_w=None,
            step=step,
        )

    def loss(self, sig, i: int, logp: torch.Tensor, logits: torch.Tensor) -> tuple:
        """Inner update i's loss (P,) without the anchor's term, its figures, and its ratio's
        figures (or None)."""
        cfg, step, mask = self.cfg, sig.step, sig.mask
        if sig.old_logp is None:  # first update: π_θ is π_old
            sig.old_logp = logp.detach()
        # sampler.weights'
        sampled_otherwise = step.algos[0].sampler is not None or cfg.is_correction != "none"
        # rollouts from another sampler: its figures, its correction's weights
        if i == 0 and sampled_otherwise:
            sig.is_w = self.is_weights(step, sig.old_logp, mask, sig.stats)
        args = (logp, sig.old_logp, step.ref_logp, logits, step.ref_logits, sig.adv, mask)
        if self.each:
            loss, policy_loss, kl_tok, ent = self.loss_each(
                *args, step.algos, sig.stats if i == 0 else None, sig.is_w
            )
        else:
            loss, policy_loss, kl_tok, ent = (
                self.mapped_apart if sig.betas is not None else self.mapped
            )(*args, sig.is_w)
            # grpo_loss's β·agg(KL_t), each member's β
            if sig.betas is not None and cfg.kl_in == "loss":
                loss = loss + sig.betas * self.kl_term(kl_tok, mask)
        # masked rows still count in a mean over sequences: rescale each term that is one
        if sig.drop is not None:
            scale = lambda mode: (
                sig.drop if mode != "token-mean" else 1.0
            )  # grpo_loss's two reductions
            loss = policy_loss * scale(reduction(cfg)) + (loss - policy_loss) * scale(cfg.loss_agg)
            policy_loss = policy_loss * scale(reduction(cfg))
        ratio = (
            self.ratio_stats(logp.detach(), sig.old_logp, sig.adv, mask)
            if i > 0 or cfg.updates == 1
            else None
        )
        with torch.no_grad():  # grpo.update_stats, per member
            s = {"policy_loss": policy_loss, "loss": loss}
            if kl_tok is not None:
                s.update(self.kl_figures(kl_tok, logits, step.ref_logits, mask))
            s["entropy"] = self.mean(ent, mask)
        return loss, s, ratio
