"""PPO for language models with a learned critic (InstructGPT 2203.02155 and common practice).

    python -m minigrpo.ppo --reward pizza

Shares the rollout, rewards, preservation, metrics, checkpoints and resume with GRPO (rl.py); what
PPO adds:
  per-token reward   r_t = −β·(log π_old − log π_ref)_t  (+ the scalar reward at the last completion
                     token); β fixed, or adapted towards --kl-target (Ziegler et al. 2019)
  critic             V(s_t) for the state before each completion token: a separate copy of the
                     pretrained trunk with a scalar head (--critic separate, default), a scalar
                     head on the policy's own trunk (--critic head), or no critic at all: the exact
                     values under π_old (--critic oracle, toy_tasks/oracle.py)
  advantages         GAE(γ, λ) from the math core, whitened over the batch; returns = A + V
  losses             clipped surrogate (token-mean) + vf_coef · clipped value loss, several epochs
                     over shuffled minibatches per rollout
β 0.2 (InstructGPT-style runs use 0.02-0.05), lr 6e-4, G 16 x 4 prompts, with the run's trust region:
with the old β 0.05, lr 1e-3 and G 8, single PPO steps put up to 89 % of ravin's mass on malformed lines
for a step (fried rice, seed 0) and 60 % on pizza (seed 0) before recovering; with lr 5e-4, G 16 and the
trust region, β 0.05 still broke the every-step malformed bar on 2 of 3 pizza seeds (peaks 0.024,
0.057) and β 0.2 kept every step of all 3 within it (peak malformed <= 0.0104).
Why the separate critic by default: with a shared trunk the value loss pulls on the same weights as
the policy. Measured (`python -m minigrpo.compare --algos ppo --seeds 3 --critic head|separate`): the
separate critic reached 0.95 in 8–9 steps on all 3 seeds (final exact pizza 0.994–0.998, malformed
≤ 0.007); with the head one seed of 3 reached 0.95, then collapsed (final pizza 0.017, malformed mass 0.98).
--critic oracle is the ideal-critic upper bound: what PPO does with a perfect value function. The task's
completions are enumerable, so V(s) of every prefix under π_old is computed exactly (one teacher-forced
forward over the support) instead of learned: no value loss, no critic parameters, GAE on the exact
values. It values the task reward only (the KL penalty's expected remainder is not in it; exact at β = 0).
The learned critics log `explained_variance_oracle` beside `explained_variance`: how much of the exact
values' variance they explain, not only of the noisy sampled returns.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from minigrpo.objectives.advantages import explained_variance, gae, whiten
from minigrpo.util.cli import UsageError, exit_now, main_guard, meta
from minigrpo.objectives.kl import exact, k1
from minigrpo.lm.logprobs import shifted_forward
from minigrpo.objectives.losses import aggregate, clipped_surrogate, entropy, surrogate_stats, value_loss
from minigrpo.metrics import combine_stats
from minigrpo.rl.loop import COST_PANELS, OUTCOME_PANELS, run
from minigrpo.rl.config import RLConfig, check_ranges, parse_rl_config
from minigrpo.rl.rollout import RolloutBatch, generation_logprobs
from toy_tasks.oracle import prefix_values


@dataclass
class PPOConfig(RLConfig):
    critic: str = field(default="separate", metadata=meta(
        "value model: a separate copy of the trunk, a head on the policy, or the exact values (no critic to learn)",
        choices=["separate", "head", "oracle"]))
    beta: float = field(default=0.2, metadata=meta(
        "β: per-token KL penalty in the reward (InstructGPT-style runs use 0.02–0.05; see the docstring)"))
    kl_target: float | None = field(default=None, metadata=meta(
        "adapt β towards this KL per sequence (off: fixed β)"))
    gamma: float = field(default=1.0, metadata={"help": "γ: discount"})
    lam: float = field(default=0.95, metadata={"help": "λ: GAE parameter"})
    epochs: int = field(default=2, metadata={"help": "passes over each rollout"})
    minibatches: int = field(default=2, metadata={"help": "minibatches per pass"})
    clip: float = field(default=0.2, metadata={"help": "ε: policy ratio clip"})
    vf_clip: float | None = field(default=0.2, metadata={"help": "value clip around the old values (none: unclipped)"})
    vf_coef: float = field(default=0.5, metadata={"help": "value loss weight"})
    entropy_coef: float = field(default=0.0, metadata={"help": "entropy bonus weight"})


class ValueHead(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.linear = nn.Linear(n_embd, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h):  # (N, T, C) -> (N, T)
        return self.linear(h).squeeze(-1)


class PPO:
    needs_ref = True  # the KL penalty in the reward
    needs_ref_logits = True
    needs_old_logp = True  # the KL penalty in the reward needs π_old before any update
    sampler = None  # rollouts always from π_old: the sampler-mismatch flags are GRPO's (grpo_config.py)

    def __init__(self, run):
        self.run, self.cfg, self.policy = run, run.cfg, run.policy
        learned = self.cfg.critic != "oracle"
        self.value_head = ValueHead(self.policy.cfg.n_embd).to(run.device) if learned else None
        self.critic_trunk = copy.deepcopy(self.policy) if self.cfg.critic == "separate" else None
        self.beta = self.cfg.beta

    def parameters(self):
        critic = [p for m in (self.value_head, self.critic_trunk) if m is not None for p in m.parameters()]
        return list(self.policy.parameters()) + critic

    def state_dict(self) -> dict:
        own = lambda m: m.state_dict() if m is not None else None
        return {"value_head": own(self.value_head), "beta": self.beta, "critic_trunk": own(self.critic_trunk)}

    def load_state_dict(self, state: dict) -> None:
        self.beta = state["beta"]
        for name, m in (("value_head", self.value_head), ("critic_trunk", self.critic_trunk)):
            if m is not None:
                m.load_state_dict(state[name])

    def forward(self, gen):
        """-> logp (N, T), logits (N, T, V), and the learned critic's values (N, T) (None: the oracle)
        for the completion tokens of `gen`."""
        logp, logits, hidden = generation_logprobs(self.policy, gen, self.cfg.temperature, True, True)
        if self.cfg.critic == "head":
            return logp, logits, self.value_head(hidden)
        return logp, logits, self.trunk_values(gen) if self.critic_trunk is not None else None

    def trunk_values(self, gen):
        """The separate critic's (N, T) values: its trunk only (no LM head, no log-softmax)."""
        _, hidden = shifted_forward(self.critic_trunk, gen.ids, gen.key_mask, tree=gen.prefix_tree())  # (N, P+T−1, C)
        return self.value_head(hidden[:, gen.prompt_len - 1:])

    def oracle_values(self, batch: RolloutBatch):
        """(N, T) exact values of the task reward under the policy now (π_old before the first update)."""
        r = self.run
        return prefix_values(self.policy, r.tok, batch.prompts, batch.gen.completion_ids, batch.mask, r.prompts,
                             r.task.support, r.rewards, self.cfg.temperature)

    def values(self, batch: RolloutBatch):
        """(N, T) values of the states before each completion token, 0 where masked."""
        if self.cfg.critic == "oracle":
            v = self.oracle_values(batch)
        else:
            v = self.forward(batch.gen)[2] if self.critic_trunk is None else self.trunk_values(batch.gen)
        return torch.where(batch.mask, v, 0.0)

    def token_rewards(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, T) per-token rewards −β·k1 plus the scalar reward at each row's last valid token,
        and the (N,) summed KL penalty's k1 estimate."""
        mask = batch.mask
        kl = torch.where(mask, k1(batch.old_logp, batch.ref_logp), 0.0)  # (N, T)
        r = -self.beta * kl
        last = (mask.sum(1) - 1).clamp(min=0)  # (N,) index of the last valid token
        r = r.scatter_add(1, last[:, None], batch.rewards[:, None] * mask.any(1, keepdim=True))
        return r, kl.sum(1)

    @torch.no_grad()
    def advantages(self, batch: RolloutBatch):
        """-> V_old (N, T), the raw GAE advantages (N, T), returns = A + V_old (N, T), the (N,) KL per sequence."""
        old_values = self.values(batch)
        rewards, kl_seq = self.token_rewards(batch)
        adv, returns = gae(rewards, old_values, batch.mask, self.cfg.gamma, self.cfg.lam)
        return old_values, adv, returns, kl_seq

    def update(self, batch: RolloutBatch, opt) -> dict:
        cfg, mask = self.cfg, batch.mask
        old_values, adv, returns, kl_seq = self.advantages(batch)
        adv = whiten(adv, mask)
        oracle = self.oracle_values(batch) if self.value_head is not None else None  # to score a learned critic
        N = mask.size(0)
        per_update = []
        for _ in range(cfg.epochs):
            order = torch.randperm(N, generator=self.run.gens["shuffle"]).to(mask.device)
            for rows in order.chunk(cfg.minibatches):
                sub = batch.select(rows)
                logp, logits, values = self.forward(sub.gen)
                m = sub.mask
                pg = aggregate(clipped_surrogate(logp, sub.old_logp, adv[rows], m, cfg.clip), m, "token-mean")
                ent = aggregate(entropy(logits), m, "token-mean")
                loss = pg - cfg.entropy_coef * ent
                if values is not None:  # a learned critic: fit it to the returns
                    vl = aggregate(value_loss(values, old_values[rows], returns[rows], m, cfg.vf_clip), m, "token-mean")
                    loss = loss + cfg.vf_coef * vl
                anchor = self.run.anchor_term()
                if anchor is not None:
                    loss = loss + anchor
                with torch.no_grad():
                    s = surrogate_stats(logp, sub.old_logp, adv[rows], m, cfg.clip)
                    stats = {"policy_loss": pg.item(), "loss": loss.item(), "entropy": ent.item(),
                             "kl_exact": aggregate(exact(logits, sub.ref_logits), m, "token-mean").item(),
                             **({"preserve_loss": anchor.item()} if anchor is not None else {}),
                             **{k: v.item() for k, v in s.items()}}
                    if values is not None:
                        limit = float("inf") if cfg.vf_clip is None else cfg.vf_clip
                        v_clipped = (values - old_values[rows]).abs() > limit
                        stats.update(value_loss=vl.item(),
                                     value_clip_frac=(v_clipped & m).sum().item() / max(int(m.sum()), 1))
                stats["grad_norm"] = self.run.clip_and_step(opt, loss, self.parameters())
                per_update.append(stats)
        out = combine_stats(per_update)  # means over the minibatch updates; the max ratio is the max
        kl_mean = kl_seq.mean().item()
        if cfg.kl_target is not None:  # adaptive β (Ziegler et al. 2019): proportional control, error clipped to ±0.2
            error = max(-0.2, min(0.2, kl_mean / cfg.kl_target - 1))
            self.beta *= 1 + error * N / 1000
        out.update(kl_k1_seq=kl_mean, beta=self.beta, value_mean=old_values.sum().item() / max(int(mask.sum()), 1),
                   explained_variance=explained_variance(old_values, returns, mask).item(),
                   adv_mean=adv[mask].mean().item(), adv_std=adv[mask].std().item() if mask.sum() > 1 else 0.0)
        if oracle is not None:
            out["explained_variance_oracle"] = explained_variance(old_values, oracle, mask).item()
        return out


PANELS = OUTCOME_PANELS + [
    ("value loss (lower is better)", ["value_loss"]),
    ("explained variance (higher is better)", ["explained_variance"]),
    ("critic's explained variance of the exact values (higher is better)", ["explained_variance_oracle"]),
    ("value mean", ["value_mean"]),
    ("KL to π_ref per token (lower = closer)", ["kl_exact"]),
    ("approx KL to π_old", ["approx_kl"]),
    ("clip fractions (policy low/high, value)", ["clip_frac_low", "clip_frac_high", "value_clip_frac"]),
    ("entropy per token", ["entropy"]),
    ("β", ["beta"]),
] + COST_PANELS


def train(cfg: PPOConfig, log=print) -> dict:
    check_ranges(cfg, {"beta": (0, None), "kl_target": (1e-9, None), "gamma": (0, 1), "lam": (0, 1), "clip": (0, 1),
                       "vf_clip": (0, None), "vf_coef": (0, None), "entropy_coef": (None, None)})
    for name in ("epochs", "minibatches", "clip"):
        if getattr(cfg, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {getattr(cfg, name)}")
    if cfg.minibatches > cfg.group_size * cfg.prompts_per_step:
        n = cfg.group_size * cfg.prompts_per_step
        raise UsageError(f"--minibatches ({cfg.minibatches}) exceeds the rollout's {n} completions")
    return run(cfg, PPO, "ppo", PANELS, log)


@main_guard
def main(argv=None):
    cfg = parse_rl_config(PPOConfig, argv, __doc__.split("\n\n")[0], "ppo")
    train(cfg)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_now()  # the files are closed: skip the interpreter's teardown (cli.exit_now)
