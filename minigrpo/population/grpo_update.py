"""GRPO's update (grpo.py, `GRPO.update`) for P members at once: the same pure functions, mapped over a leading
member dim with torch.func.vmap, and one backward and one optimiser step for all members.

    update = LockstepGRPO(cfg, anchor, grpo_loss)  # cfg: the members' common GRPOConfig; anchor: population/anchor.py
    figures = update(stack, ref, opt, step)        # step: the members' rollouts (population/rows.Rollouts)
    row = update.row(mine)                         # member p's figures {name: float} -> its metrics row's part

-> figures {name: (P,)}: the step's, and each inner update's (rl/report.packed), read back by the caller in one
go; `row` combines a member's inner updates as its single run combines them (rl/report.py).
Each member's figures are those of its single run, to float rounding (tests/test_lockstep.py).

Members with β's of their own (all > 0; cfg is the first member's): β is a number inside grpo_loss, which vmap cannot
map, so the loss is mapped without its KL term and each member's β·agg(KL_t) is added after it (--kl-in reward: the
penalty of β = 1, times each β); the same arithmetic as the single run's where the entropy bonus is off.

What it runs: every variant whose functions are pure over one member's tensors (the policy losses, KL estimators,
baselines and scales, aggregations; --random-reward's draws, each member's from its own stream; ReMax's greedy
decodes, member by member). The entropy controls (the token filters that rank, Clip-Cov's draws, an adaptive
coefficient) take their loss member by member (`loss_each`), each with its own generator and coefficient. Another
sampler (its temperature, its nucleus, its stale weights: population/sampling.StaleWeights) samples every member's
rows in the one batch; its figures and --is-correction's weights are each member's own (`is_weights`).
`unsupported(cfg)` names the rest (the sampled anchor: each member's own rows, whose π_ref logits its single run
takes from another forward than its policy's, so that at π_θ = π_ref their gradient is rounding that Adam's first
step amplifies, and no lockstep member could match it), which a population runs as threads (population/member.py).
--skip-equal-groups (DAPO, REINFORCE-Rej) drops a member's equal-reward groups by masking their tokens, which is
dropping them for a token-mean; a mean over sequences would still count the masked rows, so each term that is one is
rescaled by N / (the rows kept). A member with no group left takes its μ updates of the anchor alone, as
GRPO.preservation_only (without an anchor it keeps weights and optimiser state: MembersAdamW.step's mask).
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch.func import vmap

from minigrpo.objectives.advantages import equal_groups
from minigrpo.objectives.kl import exact
from minigrpo.objectives.losses import aggregate, surrogate_stats
from minigrpo.population.anchor import MembersAnchor
from minigrpo.population.optim import MembersAdamW, clip_grad_norms
from minigrpo.population.rows import Rollouts
from minigrpo.population.stacked import Stack
from minigrpo.rl.report import combine_stats, packed, unpacked
from minigrpo.rl.rollout import greedy_rewards
from minigrpo.variants.advantages import BASELINES, advantages, update_rewards
from minigrpo.variants.entropy import fork_mask
from minigrpo.variants.kl import kl_reward_penalty
from minigrpo.variants.policy_losses import reduction
from minigrpo.variants.sampler import weights


def unsupported(cfgs: list) -> str | None:
    """Why a lockstep population cannot run these members' configs (None: it can)."""
    cfg = cfgs[0]
    reasons = {"--preserve-anchor sampled": cfg.preserve and cfg.preserve_anchor == "sampled",
               "--beta 0 beside --beta > 0 (without the KL term)": len({c.beta > 0 for c in cfgs}) > 1}
    return next((name for name, yes in reasons.items() if yes), None)


class LockstepGRPO:
    def __init__(self, cfg, anchor: MembersAnchor | None, grpo_loss):
        self.cfg, self.anchor = cfg, anchor
        self.needs_ref = cfg.rollout_kl or cfg.beta > 0 or cfg.fork_entropy > 0  # what the caller computes first
        self.needs_old_logp = cfg.beta > 0 and cfg.kl_in == "reward"
        self.stacks = []  # nothing to train but the policy (a critic's weights: ppo_update.py)
        self.grpo_loss = grpo_loss
        ref = 0 if self.needs_ref else None  # without π_ref's log-probs: None for every member
        loss = lambda c: vmap(lambda lp, old, rlp, lg, rlg, adv, m, w: grpo_loss(  # noqa: E731 (w: the sampler's)
            lp, old, rlp, lg, rlg, adv, m, c, is_weights=w), in_dims=(0, 0, ref, 0, ref, 0, 0,
                                                                      0 if cfg.is_correction != "none" else None))
        # the entropy controls (filters that rank by a count read from the data, Clip-Cov's draws from each member's
        # generator, a coefficient of each member's own) cannot be mapped: their loss is taken member by member
        self.each = (cfg.cov_control, cfg.top_entropy, cfg.fork_entropy, cfg.entropy_target) != ("none", 1, 0, None)
        self.loss = loss(cfg)
        self.ratio_stats = vmap(lambda lp, old, a, m: surrogate_stats(lp, old, a[:, None], m, cfg.clip_low,
                                                                      cfg.clip_high, cfg.ratio))
        self.mean = vmap(lambda x, m: aggregate(x, m, "token-mean"))
        greedy = 0 if BASELINES[cfg.baseline].needs_greedy else None  # ReMax's baseline: each member's (P, prompts)
        self.advantages = vmap(lambda r, g: advantages(r, cfg, g), in_dims=(0, greedy))
        self.penalty = vmap(lambda old, ref, m: kl_reward_penalty(old, ref, m, cfg))
        # members with β's of their own (a number inside grpo_loss, not a tensor vmap maps): the loss without its KL
        # term and the penalty per unit of β, then times each member's β
        self.loss_apart = loss(replace(cfg, beta=0.0))
        self.kl_term = vmap(lambda kl, m: aggregate(kl, m, cfg.loss_agg, cfg.max_new_tokens))
        self.penalty_per_beta = vmap(lambda old, ref, m: kl_reward_penalty(old, ref, m, replace(cfg, beta=1.0)))
        self.equal = vmap(lambda r: equal_groups(r.view(-1, cfg.group_size)))  # (P, prompts) bool

    def host_state(self, algo, copies, p: int) -> dict:
        """A member's GRPO state (its Clip-Cov generator, its entropy coefficient) is its algorithm's own."""
        return algo.state_dict()

    @torch.no_grad()
    def is_weights(self, step: Rollouts, old_logp, mask, stats: dict) -> torch.Tensor | None:
        """Another sampler's figures and its --is-correction weights (P, N, T) or None: variants/sampler.weights
        member by member on its own rows (its sampler's log-probs are its Generation's), as GRPO.update takes them
        at the first update."""
        some, T = next(b for b in step.batches if b is not None), mask.size(-1)
        figures, ws = [], []
        for p, (b, a) in enumerate(zip(step.batches, step.algos)):
            b, t = b or some, (b or some).gen.logprobs.size(1)  # a failed member's slot: any rows, not kept
            figures.append({})
            mine = SimpleNamespace(old_logp=old_logp[p, :, :t], sampler_logp=b.gen.logprobs)
            w = weights(self.cfg, a.sampler, mine, mask[p, :, :t], figures[-1]).get("is_weights")
            ws.append(None if w is None else F.pad(w, (0, T - t)))
        for k in figures[0]:
            stats[k] = torch.tensor([f[k] for f in figures], device=mask.device)
        return None if ws[0] is None else torch.stack(ws)

    def loss_each(self, logp, old_logp, ref_logp, logits, ref_logits, adv, mask, algos: list, stats: dict | None,
                  is_w=None):
        """grpo_loss member by member, each with its own Clip-Cov generator and entropy bonus -> its outputs stacked.
        `stats`: given at the step's first update, where each member's EntropyBonus sets its coefficient for the
        step (from π_old, as GRPO.update) and its figures join the step's."""
        take = lambda x, p: None if x is None else x[p]  # noqa: E731
        if stats is not None:
            figures = [{} for _ in algos]
            self.loss_cfgs = [a.entropy_bonus.for_step(logits[p], mask[p], figures[p]) for p, a in enumerate(algos)]
            for k in figures[0]:  # --entropy-target's e_k, c_k, α_k
                stats[k] = torch.tensor([f[k] for f in figures], device=logp.device)
        outs = [self.grpo_loss(logp[p], old_logp[p], take(ref_logp, p), logits[p], take(ref_logits, p), adv[p],
                               mask[p], c, fork_mask(take(ref_logits, p), mask[p], c), a.gens["clip_cov"],
                               take(is_w, p)) for p, (a, c) in enumerate(zip(algos, self.loss_cfgs))]
        return tuple(None if x[0] is None else torch.stack(x) for x in zip(*outs))

    def __call__(self, stack: Stack, ref: Stack, opt: MembersAdamW, step: Rollouts) -> dict:
        cfg, stats = self.cfg, {}
        rows, rewards, ref_logp, ref_logits, old_logp = step.rows, step.rewards, step.ref_logp, step.ref_logits, \
            step.old_logp
        # 1. rewards -> one advantage per completion
        if cfg.random_reward:  # each member's Bernoulli(0.5) draws from its own stream (on the CPU, as alone)
            rewards = torch.stack([update_rewards(torch.zeros(rewards.size(1)), cfg, a.gens["random_reward"], {})
                                   for a in step.algos]).to(rewards)
            stats["random_reward_mean"] = rewards.mean(-1)
        greedy = None
        if BASELINES[cfg.baseline].needs_greedy:  # ReMax: each member's greedy completions, by its own GPT (π_old)
            greedy = torch.stack([greedy_rewards(r.policy, r.tok, r.reward, b.prompts[::cfg.group_size],
                                                 cfg.max_new_tokens, cfg.unfinished_reward) if b is not None else
                                  torch.zeros(cfg.prompts_per_step, device=rewards.device)
                                  for r, b in zip(step.runs, step.batches)])
            stats["greedy_reward_mean"] = greedy.mean(-1)
        apart = any(r.cfg.beta != cfg.beta for r in step.runs)  # members of β's of their own (cfg: the first's)
        betas = torch.tensor([r.cfg.beta for r in step.runs], device=rewards.device) if apart else None
        if cfg.beta > 0 and cfg.kl_in == "reward":  # β·Σ_t k(π_old, π_ref) off each sequence's reward
            penalty = self.penalty(old_logp, ref_logp, rows.completion_mask) if not apart else \
                betas[:, None] * self.penalty_per_beta(old_logp, ref_logp, rows.completion_mask)
            rewards = rewards - penalty
            stats["kl_reward_penalty"] = penalty.mean(-1)
        equal = self.equal(rewards)
        stats["equal_groups"] = equal.float().mean(-1)
        adv = self.advantages(rewards, greedy)
        stats.update(adv_mean=adv.mean(-1), adv_std=adv.std(-1))
        mask, active, drop = rows.completion_mask, None, None
        if cfg.skip_equal_groups:  # DAPO, REINFORCE-Rej: only the groups whose rewards differ, their rows' tokens kept
            differ = ~equal
            kept = differ.repeat_interleave(cfg.group_size, -1)  # (P, N)
            mask = mask & kept[..., None]
            skipped = ~differ.any(-1)  # (P,): no RL signal; the anchor alone updates (GRPO.preservation_only)
            stats["skipped"] = skipped.float()
            active = [~skipped | (self.anchor is not None)] * cfg.updates
            drop = kept.size(1) / kept.sum(-1).clamp(min=1)  # a mean over sequences: over the kept ones (below)
        # 2. μ updates of the clipped surrogate against π_old, with the KL to π_ref
        per_update, ratio, is_w, self.before = [], [], None, list(stats)  # before: what a skipped member logs
        for i in range(cfg.updates):
            logp, logits = rows.logprobs(stack, cfg.temperature)
            if old_logp is None:  # first update: π_θ is π_old
                old_logp = logp.detach()
            sampled_otherwise = step.algos[0].sampler is not None or cfg.is_correction != "none"  # sampler.weights'
            if i == 0 and sampled_otherwise:  # rollouts from another sampler: its figures, its correction's weights
                is_w = self.is_weights(step, old_logp, mask, stats)
            if self.each:
                loss, policy_loss, kl_tok, ent = self.loss_each(logp, old_logp, ref_logp, logits, ref_logits, adv, mask,
                                                                step.algos, stats if i == 0 else None, is_w)
            else:
                loss, policy_loss, kl_tok, ent = (self.loss_apart if apart else self.loss)(
                    logp, old_logp, ref_logp, logits, ref_logits, adv, mask, is_w)
                if apart and cfg.kl_in == "loss":  # grpo_loss's β·agg(KL_t), each member's β
                    loss = loss + betas * self.kl_term(kl_tok, mask)
            if drop is not None:  # masked rows still count in a mean over sequences: rescale each term that is one
                scale = lambda mode: drop if mode != "token-mean" else 1.0  # noqa: E731 (grpo_loss's two reductions)
                loss = policy_loss * scale(reduction(cfg)) + (loss - policy_loss) * scale(cfg.loss_agg)
                policy_loss = policy_loss * scale(reduction(cfg))
            anchor = None if self.anchor is None else self.anchor.term(stack, ref)
            if anchor is not None:
                loss = loss + anchor
            if i > 0 or cfg.updates == 1:
                ratio.append(self.ratio_stats(logp.detach(), old_logp, adv, mask))
            with torch.no_grad():  # grpo.update_stats, per member
                s = {"policy_loss": policy_loss, "loss": loss}
                if kl_tok is not None:
                    s[f"kl_{cfg.kl}"] = self.mean(kl_tok, mask)
                    s["kl_exact"] = s[f"kl_{cfg.kl}"] if cfg.kl == "exact" else self.mean(exact(logits, ref_logits),
                                                                                          mask)
                s["entropy"] = self.mean(ent, mask)
                if anchor is not None:
                    s["preserve_loss"] = anchor
            opt.zero_grad()
            loss.sum().backward()  # each member's loss reaches only its own slice of the weights
            s["grad_norm"] = clip_grad_norms(opt.params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            opt.step(None if active is None else active[i])
            per_update.append({k: v.detach() for k, v in s.items()})
        self.inner = (len(per_update), len(ratio))
        return {**stats, **packed(per_update), **packed(ratio, "ratio")}

    def row(self, mine: dict, algo=None) -> dict:
        """Member p's figures (this update's names, read as floats) -> its row as GRPO.update returns it: the step's
        figures, then its inner updates' combined (rl/report.combine_stats)."""
        head = {k: v for k, v in mine.items() if isinstance(k, str) and k != "skipped"}
        updates, ratios = self.inner
        inner = unpacked(mine, updates)
        if mine.get("skipped"):  # every group's rewards equal: the anchor's updates alone, as GRPO.preservation_only
            alone = [{k: d[k] for k in ("preserve_loss", "grad_norm")} for d in inner if "preserve_loss" in d]
            return {**{k: head[k] for k in self.before if k in head}, **combine_stats(alone), "skipped": 1.0}
        return {**head, **combine_stats(inner), **combine_stats(unpacked(mine, ratios, "ratio"))}
