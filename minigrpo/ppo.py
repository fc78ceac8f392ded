"""PPO for language models with a learned critic (InstructGPT 2203.02155 and common practice).

    python -m minigrpo.ppo --reward pizza

The rollout, rewards, preservation anchor, trust region, metrics, checkpoints and resume are the
shared RL run's (rl/loop.py); PPO adds, per rollout of N completions with T completion slots:
  reward      r_t = −β·(log π_old − log π_ref)_t, plus the scalar reward at each row's last token; β
              fixed or adapted towards --kl-target (Ziegler et al. 1909.08593): β ← β·(1 +
              clip(KL/target − 1, ±0.2)·N/1000)
  values      V(s_t) of the state before each completion token, from a critic (rl/critics.py): a
              copy of the pretrained trunk with a scalar head (separate, default), a head on the
              policy's trunk (head), or the exact values of this return under π_old (oracle: no
              critic to learn, the ideal-critic bound)
  advantages  GAE(γ, λ) on r and V_old; returns R = A + V_old; A whitened over the batch's valid
              tokens
  loss        clipped surrogate − c_H·entropy + c_V·clipped value loss (token means), over --epochs
              passes of --minibatches shuffled minibatches per rollout (cleanrl's ppo.py, PPO2
              baselines)
The update (`PPO.figures`) takes tensors that may carry a leading dim of P members: a lockstep
population (population/ppo_update.py) runs this same update for all its members at once.
Departures: β 0.1 by default (InstructGPT-style runs use 0.02–0.05): the k1 penalty summed over a
completion is J_β's sequence KL, whose optimum π*_0.1 puts 0.9997 on pizza, clear of the 0.95 goal
(docs/experiments.md); lr 3e-4, half GRPO's: at 6e-4 its 4 Adam steps per rollout kept the other
people's drift oscillating after convergence; the value model starts from the policy, not from a
reward model; the separate critic is the default because a shared trunk's value loss pulls on the
policy's weights. The oracle's values leave out the KL penalty of continuations that leave the
task's support (the malformed mass). Learned critics also log `explained_variance_oracle`: how much
of the exact values' variance they explain, not only of the sampled returns'.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch.func import vmap

from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.objectives.advantages import explained_variance, gae, kl_shaped_rewards, whiten
from minigrpo.objectives.ppo_objective import ppo_objective
from minigrpo.rl.config import RLConfig, parse_rl_config
from minigrpo.rl.critics import CRITICS, OracleCritic
from minigrpo.rl.loop import run
from minigrpo.rl.report import COST_PANELS, OUTCOME_PANELS, combine_stats
from minigrpo.rl.rollout import RolloutBatch, take
from minigrpo.util.cli import (
    UsageError,
    check_positive,
    check_ranges,
    exit_now,
    finish_unread,
    flag,
    main_guard,
)


@dataclass
class PPOConfig(RLConfig):
    """PPO: the KL-shaped reward, the critic, GAE, the clipped losses"""

    lr: float = flag(
        3e-4,
        "AdamW learning rate: half the other trainers' 6e-4, as PPO takes epochs × minibatches = "
        "4 steps per rollout",
    )
    critic: str = flag(
        "separate",
        "value model: a separate copy of the trunk, a head on the policy, or the exact values (no "
        "critic to learn)",
        choices=sorted(CRITICS),
    )
    beta: float = flag(
        0.1,
        "β: per-token KL penalty in the reward (InstructGPT-style runs use 0.02–0.05; see the "
        "docstring)",
    )
    kl_target: float | None = flag(None, "adapt β towards this KL per sequence (off: fixed β)")
    gamma: float = flag(1.0, "γ: discount")
    lam: float = flag(0.95, "λ: GAE parameter")
    epochs: int = flag(2, "passes over each rollout")
    minibatches: int = flag(2, "minibatches per pass")
    clip: float = flag(0.2, "ε: policy ratio clip")
    vf_clip: float | None = flag(0.2, "value clip around the old values (none: unclipped)")
    vf_coef: float = flag(0.5, "value loss weight")
    entropy_coef: float = flag(0.0, "entropy bonus weight")


def mapped(f, lead: tuple):
    """f, a function of one run's tensors, mapped over the leading dims `lead` (torch.func.vmap
    once per dim; none: f itself)."""
    for _ in lead:
        f = vmap(f)
    return f


class PPO:
    needs_ref = True  # the KL penalty in the reward
    needs_ref_logits = True  # the exact KL to π_ref, logged
    needs_old_logp = True  # the KL penalty in the reward needs π_old before any update
    sampler = None  # rollouts always from π_old: the sampler-mismatch flags are GRPO's

    def __init__(self, run, critic=None, oracle=None):
        """run: the shared RL run (rl/loop.Run); or a lockstep population's members as one
        (population/ppo_update.py: their stacked policy, anchor term and optimiser step), with
        their stacked critic and exact values."""
        self.run, self.cfg, self.policy = run, run.cfg, run.policy
        self.critic = CRITICS[self.cfg.critic](run) if critic is None else critic
        # the exact values, to score a learned critic against
        self.oracle = OracleCritic(run) if oracle is None else oracle
        self.beta = self.cfg.beta  # a number; a population's: (P, 1, 1), each member's

    def parameters(self):
        return list(self.policy.parameters()) + self.critic.parameters()

    def state_dict(self, critic_weights: dict | None = None) -> dict:
        """{"value_head", "critic_trunk"} (None where the critic has none) and β; critic_weights:
        the critic's tensors to save in place of its own (Critic.state_dict: a population
        member's)."""
        return {**self.critic.state_dict(critic_weights), "beta": self.beta}

    def load_state_dict(self, state: dict) -> None:
        self.beta = state["beta"]
        self.critic.load_state_dict(state)

    def token_rewards(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, T) per-token rewards −β·k1 plus the scalar reward at each row's last valid token,
        and the (N,) summed KL penalty's k1 estimate (objectives/advantages.kl_shaped_rewards)."""
        return kl_shaped_rewards(
            batch.rewards, batch.old_logp, batch.ref_logp, batch.mask, self.beta
        )

    @torch.no_grad()
    def advantages(self, batch: RolloutBatch):
        """-> V_old (N, T), the raw GAE advantages (N, T), returns = A + V_old (N, T), the (N,) KL
        per sequence."""
        # the oracle values the penalty; learned critics fit it
        self.critic.beta = self.oracle.beta = self.beta
        old_values = self.critic.values(batch)
        rewards, kl_seq = self.token_rewards(batch)
        adv, returns = gae(rewards, old_values, batch.mask, self.cfg.gamma, self.cfg.lam)
        return old_values, adv, returns, kl_seq

    def update(self, batch: RolloutBatch, opt) -> dict:
        """One rollout's update (`figures`), its figures read as numbers -> the step's row."""
        per_update, rollout = self.figures(batch, opt, [self.run.gens["shuffle"]])
        number = lambda figures: {k: float(v) for k, v in figures.items()}
        return self.row([number(s) for s in per_update], number(rollout), batch.mask.size(0))

    def figures(self, batch: RolloutBatch, opt, shuffles: list, each=None) -> tuple[list, dict]:
        """One rollout: V_old, GAE, whitening, then epochs × minibatches of clipped policy and value
        updates, each pass's order drawn from `shuffles` -> each update's figures and the
        rollout's (0-dim tensors, read by the caller). Every tensor may carry a leading dim of P
        members (a lockstep population: population/ppo_update.py; shuffles: each member's
        generator): the functions of one run are mapped over it by `each(f, lead)` (None:
        `mapped`; a population's on the CPU: member by member, each at its own width)."""
        cfg, mask, each = self.cfg, batch.mask, each or mapped
        lead, N = mask.shape[:-2], mask.size(-2)
        old_values, adv, returns, kl_seq = self.advantages(batch)
        adv = each(whiten, lead)(adv, mask)
        with torch.no_grad():  # the exact values under π_old, to score a learned critic against
            oracle_values = self.oracle.values(batch) if self.critic.learned else None
        orders = [
            torch.stack([torch.randperm(N, generator=g) for g in shuffles]).view(*lead, N)
            for _ in range(cfg.epochs)
        ]
        chunks = [rows.to(mask.device) for o in orders for rows in o.chunk(cfg.minibatches, -1)]
        objective = each(lambda *t: ppo_objective(*t[:6], cfg, *t[6:]), lead)
        per_update = []
        for rows in chunks:
            sub = batch.select(rows)
            logp, logits, hidden = generation_logprobs(
                self.policy, sub.gen, cfg.temperature, True, True
            )
            # a learned critic's values of these rows, to fit (the oracle's: nothing to fit)
            fit = (
                (self.critic.values(sub, hidden), take(old_values, rows), take(returns, rows))
                if self.critic.learned
                else ()
            )
            loss, figures = objective(
                logp, sub.old_logp, take(adv, rows), logits, sub.ref_logits, sub.mask, *fit
            )
            anchor = self.run.anchor_term()
            if anchor is not None:
                loss = loss + anchor
                figures["preserve_loss"] = anchor
            figures = {"policy_loss": figures.pop("policy_loss"), "loss": loss, **figures}
            figures = {k: v.detach() for k, v in figures.items()}  # numbers, not graphs
            figures["grad_norm"] = self.run.clip_and_step(opt, loss, self.parameters())
            per_update.append(figures)
        return per_update, rollout_figures(
            old_values, adv, returns, kl_seq, mask, oracle_values, each
        )

    def row(self, per_update: list[dict], rollout: dict, n: int) -> dict:
        """The step's row from its figures as numbers: the updates' means (the max ratio is the
        max), then the rollout's; β adapted after a rollout of n completions."""
        out = combine_stats(per_update)
        self.adapt_beta(rollout["kl_k1_seq"], n)
        out.update(kl_k1_seq=rollout["kl_k1_seq"], beta=self.beta)
        out.update(rollout)
        return out

    def adapt_beta(self, kl_mean: float, n: int) -> None:
        """With --kl-target, β after a rollout of n completions whose KL per sequence was kl_mean
        (Ziegler et al. 2019): proportional control, the error clipped to ±0.2."""
        if self.cfg.kl_target is not None:
            error = max(-0.2, min(0.2, kl_mean / self.cfg.kl_target - 1))
            self.beta *= 1 + error * n / 1000


@torch.no_grad()
def rollout_figures(old_values, adv, returns, kl_seq, mask, oracle_values=None, each=mapped):
    """A rollout's logged figures of its values and advantages (N, T) and its (N,) KL per sequence,
    each (leading dims as given) a tensor not yet read: the KL's mean, V_old's token mean, the
    critic's explained variance of the returns (and of the exact values), the whitened advantages'
    mean and std over the valid tokens."""
    lead, n = mask.shape[:-2], mask.sum((-2, -1))
    valid = adv[mask].split(n.flatten().tolist())  # each run's valid advantages
    zero = adv.new_zeros(())
    explained = each(explained_variance, lead)
    out = {
        "kl_k1_seq": kl_seq.mean(-1),
        "value_mean": old_values.sum((-2, -1)).double() / n.clamp(min=1),
        "explained_variance": explained(old_values, returns, mask),
        "adv_mean": torch.stack([a.mean() for a in valid]).view(lead),
        "adv_std": torch.stack([a.std() if len(a) > 1 else zero for a in valid]).view(lead),
    }
    if oracle_values is not None:
        out["explained_variance_oracle"] = explained(old_values, oracle_values, mask)
    return out


PANELS = (
    OUTCOME_PANELS
    + [
        ("value loss (lower is better)", ["value_loss"]),
        ("explained variance (higher is better)", ["explained_variance"]),
        (
            "critic's explained variance of the exact values (higher is better)",
            ["explained_variance_oracle"],
        ),
        ("value mean", ["value_mean"]),
        ("KL to π_ref per token (lower = closer)", ["kl_exact"]),
        ("approx KL to π_old", ["approx_kl"]),
        (
            "clip fractions (policy low/high, value)",
            ["clip_frac_low", "clip_frac_high", "value_clip_frac"],
        ),
        ("entropy per token", ["entropy"]),
        ("β", ["beta"]),
    ]
    + COST_PANELS
)

# the algorithm a lockstep population's members run (population/lockstep.Member)
ALGORITHM = PPO


def check_config(cfg: PPOConfig) -> None:
    """Refuse values PPO cannot run as asked, with one line each."""
    check_ranges(
        cfg,
        {
            "beta": (0, None),
            "kl_target": (1e-9, None),
            "gamma": (0, 1),
            "lam": (0, 1),
            "clip": (0, 1),
            "vf_clip": (0, None),
            "vf_coef": (0, None),
            "entropy_coef": (None, None),
        },
    )
    check_positive(cfg, "epochs", "minibatches", "clip")
    if cfg.minibatches > cfg.group_size * cfg.prompts_per_step:
        n = cfg.group_size * cfg.prompts_per_step
        raise UsageError(f"--minibatches ({cfg.minibatches}) exceeds the rollout's {n} completions")


def train(cfg: PPOConfig, log=print) -> dict:
    check_config(cfg)
    return run(cfg, PPO, "ppo", PANELS, log)


def parse(argv) -> PPOConfig:
    """The command line's config (a UsageError names a bad flag)."""
    return parse_rl_config(PPOConfig, argv, __doc__.split("\n\n")[0], "ppo")


@main_guard
@finish_unread
def main(argv=None):
    train(parse(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_now()  # the files are closed: skip the interpreter's teardown (cli.exit_now)
