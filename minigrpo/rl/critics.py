"""PPO's critics: V(s_t), the expected return from the state before completion token t.

    CRITICS[name](run) -> Critic        name: PPOConfig's --critic (ppo.py)

separate  a copy of the pretrained trunk with a scalar head (InstructGPT 2203.02155: the value
          model is a network of its own, there initialised from the reward model; here from the
          policy's start)
head      a scalar head on the policy's own trunk (shared trunk: the value loss also moves the
          policy's weights)
oracle    no critic: the exact values of PPO's return (task reward and KL penalty at the current β)
          under π_old over the enumerable support (toy_tasks/value_tree.py); the ideal-critic bound

The value loss each learned critic is fitted with is PPO's (objectives/ppo_objective.py).

Shapes: a rollout of N completions, T completion slots, C the model width; values are (N, T), 0
where masked. `run` is the shared RL run (rl/loop.py's Run): the critics read its policy, device,
tokenizer, prompts, task support, reward table and temperature.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod

import torch
import torch.nn as nn

from minigrpo.lm.logprobs import sequence_logprobs, shifted_forward
from toy_tasks.value_tree import ValueTree


def completion_hidden(model, gen) -> torch.Tensor:
    """(N, T, C) final hidden states of `model` at the states before each completion token of a
    Generation (the input of a value head); one forward over the rollout's distinct prefixes."""
    # (N, P+T−1, C)
    _, hidden = shifted_forward(model, gen.ids, gen.key_mask, tree=gen.prefix_tree())
    return hidden[:, gen.prompt_len - 1 :]


class ValueHead(nn.Module):
    """V = w·h + b, (N, T, C) -> (N, T); zero-initialised, so every value starts at 0."""

    def __init__(self, n_embd: int):
        super().__init__()
        self.linear = nn.Linear(n_embd, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h):
        """h (N, T, C) -> (N, T)."""
        return self.linear(h).squeeze(-1)


class Critic(ABC):
    """What PPO asks of a value function. Its checkpoint state keeps the keys PPO has always saved:
    {"value_head": state_dict | None, "critic_trunk": state_dict | None}."""

    learned = True  # False: exact values, nothing to fit or to score them against
    # the return's KL penalty coefficient, set by PPO before each rollout's values (the oracle's
    # input)
    beta = 0.0
    head: ValueHead | None = None
    trunk: nn.Module | None = None

    def parameters(self) -> list[nn.Parameter]:
        """What the optimiser updates besides the policy: the head's, then the trunk's."""
        return [p for m in (self.head, self.trunk) if m is not None for p in m.parameters()]

    @abstractmethod
    def values(self, batch, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """(N, T) V(s_t) for a rollout (rl.rollout.RolloutBatch), 0 where masked; differentiable
        unless run under no_grad. hidden: the policy's (N, T, C) completion_hidden if the caller has
        it (else recomputed)."""

    def state_dict(self) -> dict:
        own = lambda m: m.state_dict() if m is not None else None
        return {"value_head": own(self.head), "critic_trunk": own(self.trunk)}

    def load_state_dict(self, state: dict) -> None:
        for name, m in (("value_head", self.head), ("critic_trunk", self.trunk)):
            if m is not None:
                m.load_state_dict(state[name])


class HeadCritic(Critic):
    """A scalar head on the policy's own trunk: V = head(h_policy); its gradient reaches the
    policy."""

    def __init__(self, run):
        self.policy = run.policy
        self.head = ValueHead(run.policy.cfg.n_embd).to(run.device)

    def values(self, batch, hidden=None):
        hidden = completion_hidden(self.policy, batch.gen) if hidden is None else hidden
        return torch.where(batch.mask, self.head(hidden), 0.0)


class SeparateCritic(Critic):
    """A copy of the policy's trunk at the start of the run with its own scalar head: V =
    head(h_copy). The policy's hidden states are not used; nothing of the policy is touched."""

    def __init__(self, run):
        self.head = ValueHead(run.policy.cfg.n_embd).to(run.device)
        self.trunk = copy.deepcopy(run.policy)

    def values(self, batch, hidden=None):
        return torch.where(batch.mask, self.head(completion_hidden(self.trunk, batch.gen)), 0.0)


class OracleCritic(Critic):
    """The exact V(s_t) = E_π[r − β·Σ_{j≥t} k1_j | prefix] of PPO's return under the policy now
    (π_old before the first update): teacher-forced forwards of the policy and π_ref over the task's
    support, then the support's value tree (toy_tasks/value_tree.py) with one model. The tree is
    made at the first call and kept (it depends only on the run's prompts, support and reward). No
    parameters, no value loss."""

    learned = False
    tree: ValueTree | None = None

    def __init__(self, run):
        self.run = run

    @torch.no_grad()
    def values(self, batch, hidden=None):
        r = self.run
        if self.tree is None:
            self.tree = ValueTree(r.tok, r.prompts, r.task.support, r.rewards, r.device)
            self.place = {x: i for i, x in enumerate(r.prompts)}
        tree, T = self.tree, r.cfg.temperature
        logp = sequence_logprobs(r.policy, tree.ids, tree.key_mask, T)[None]  # (1, M, W − 1)
        ref_logp = (  # β = 0: no penalty, no forward of π_ref
            sequence_logprobs(r.ref, tree.ids, tree.key_mask, T)[None]
            if r.ref is not None and self.beta
            else None
        )
        V = tree.values(logp, ref_logp, torch.tensor([float(self.beta)], device=logp.device))
        index = torch.tensor([[self.place[x] for x in batch.prompts]], device=tree.roots.device)
        v = tree.prefix_values(V, index, batch.gen.completion_ids[None], batch.mask[None])[0]
        return torch.where(batch.mask, v.to(batch.mask.device), 0.0)


CRITICS: dict[str, type[Critic]] = {
    "separate": SeparateCritic,
    "head": HeadCritic,
    "oracle": OracleCritic,
}
