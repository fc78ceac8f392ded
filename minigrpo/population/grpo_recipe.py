"""One GRPO recipe's advantages and loss for a lockstep population's members that follow it
(grpo_update.py drives them): the single run's own stages of `GRPO.update` (grpo.py), mapped over a
leading member dim with torch.func.vmap: variants/advantages.signal (rewards -> advantages and their
figures), the trainer's grpo_loss and update_figures (passed down by population/lockstep.KINDS).

    recipe = Recipe(cfg, grpo)               # cfg: its first member's GRPOConfig; grpo: the trainer
    sig = recipe.signal(step)                # its members' rollouts (population/rows.Rollouts) ->
                                             # advantages, mask
    loss, figures, ratio = recipe.loss(sig, i, logp, logits)   # inner update i's (P_r,) loss,
                                                               # without the anchor

What stays here is what a population does otherwise than a run alone: the randomness and the
decodes each member makes for its signal (its --random-reward draws, its ReMax greedy rewards: the
single run's own methods, member by member), β per member, masks for --skip-equal-groups, and the
entropy controls' loss member by member.

RECIPE names what members may differ in beyond lockstep.OWN: the policy loss, the KL estimator and
where it goes, the baselines and scales, the entropy controls, the aggregation, β (and a preset's
name); none of them is read outside the update. Members with β's of their own (all > 0, or all 0)
follow one Recipe: β is a number inside grpo_loss, which vmap cannot map, so the loss is mapped
without its KL term and each member's β·agg(KL_t) is added after it; `signal` takes each member's β
(--kl-in reward).

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

from minigrpo.objectives.losses import aggregate
from minigrpo.population.rows import Rollouts
from minigrpo.variants.advantages import BASELINES, AdvantageFlags, random_rewards, signal
from minigrpo.variants.entropy import EntropyFlags, fork_mask
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

    def __init__(self, cfg, trainer):
        # the single run's loss and its inner update's figures (minigrpo.grpo's)
        self.cfg, self.grpo_loss, self.figures = cfg, trainer.grpo_loss, trainer.update_figures
        # what the caller computes first
        self.needs_ref = cfg.rollout_kl or cfg.beta > 0 or cfg.fork_entropy > 0
        self.needs_old_logp = cfg.beta > 0 and cfg.kl_in == "reward"
        # the entropy controls (filters that rank by a count read from the data, Clip-Cov's draws
        # from each member's generator, a coefficient of each member's own) cannot be mapped: their
        # loss is taken member by member
        off = ("none", 1, 0, None)
        self.each = (cfg.cov_control, cfg.top_entropy, cfg.fork_entropy, cfg.entropy_target) != off
        # members with β's of their own (a number inside grpo_loss, not a tensor vmap maps): the
        # loss without its KL term, then each member's β times it
        self.apart = replace(cfg, beta=0.0)
        self.kl_term = vmap(lambda kl, m: aggregate(kl, m, cfg.loss_agg, cfg.max_new_tokens))
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
        members' step): variants/advantages.signal mapped, with each member's own draws, greedy
        rewards and β."""
        cfg, rewards, drawn, greedy, betas = self.cfg, step.rewards, None, None, None
        # each member's Bernoulli(0.5) draws from its own stream (on the CPU, as alone)
        if cfg.random_reward:
            gens = [a.gens["random_reward"] for a in step.algos]
            drawn = torch.stack([random_rewards(r, cfg, g) for r, g in zip(rewards, gens)])
        # ReMax: each member's greedy completions, by its own GPT (π_old); a failed member's: 0
        if BASELINES[cfg.baseline].needs_greedy:
            none = torch.zeros(cfg.prompts_per_step, device=rewards.device)
            greedy = torch.stack(
                [
                    none if b is None else a.greedy_rewards(b)
                    for a, b in zip(step.algos, step.batches)
                ]
            )
        # members of β's of their own (cfg: the first's)
        if any(r.cfg.beta != cfg.beta for r in step.runs):
            betas = torch.tensor([r.cfg.beta for r in step.runs], device=rewards.device)
        args = (rewards, drawn, greedy, step.old_logp, step.ref_logp, step.rows.completion_mask)
        adv, equal, stats = _map(lambda r, *a: signal(r, cfg, *a), *args, betas)
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
            c = cfg if sig.betas is None else self.apart
            loss, policy_loss, kl_tok, ent = _map(  # w: the sampler correction's weights
                lambda *a: self.grpo_loss(*a[:-1], c, is_weights=a[-1]), *args, sig.is_w
            )
            # grpo_loss's β·agg(KL_t), each member's β
            if sig.betas is not None and cfg.kl_in == "loss":
                loss = loss + sig.betas * self.kl_term(kl_tok, mask)
        # masked rows still count in a mean over sequences: rescale each term that is one
        if sig.drop is not None:
            # grpo_loss's two reductions
            scale = lambda mode: sig.drop if mode != "token-mean" else 1.0
            loss = policy_loss * scale(reduction(cfg)) + (loss - policy_loss) * scale(cfg.loss_agg)
            policy_loss = policy_loss * scale(reduction(cfg))
        figures, ratio = _map(
            lambda *a: self.figures(cfg, i, *a),
            *(logp.detach(), sig.old_logp, sig.adv, kl_tok, logits, step.ref_logits, ent, mask),
        )
        s = {"policy_loss": policy_loss, "loss": loss, **figures}
        return loss, s, ratio or None


def _map(fn, *args):
    """fn mapped over the leading member dim of each of its tensor arguments (None: not mapped)."""
    return vmap(fn, in_dims=tuple(None if a is None else 0 for a in args))(*args)
