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

The values are computed once, by `head_values` (a learned critic's) and `exact_values` (the
oracle's) over weights that may be stacked (M models', with a leading (M, ...)): the critics call
them with one model's weights; P runs' critics stacked call them once with theirs.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod

import torch
import torch.nn as nn

from minigrpo.lm.logprobs import sequence_logprobs, shifted_forward
from minigrpo.lm.model import GPT, Weights, linear
from minigrpo.lm.prefix_tree import next_token_tree
from toy_tasks.value_tree import ValueTree


def completion_hidden(model: GPT | Weights, gen) -> torch.Tensor:
    """(N, T, C) final hidden states of `model` at the states before each completion token of a
    Generation (the input of a value head); one forward over the rollout's distinct prefixes.
    Stacked weights: a Generation of (M, N, ...) rows (a batch of M trees) -> (M, N, T, C)."""
    # (N, P+T−1, C)
    _, hidden = shifted_forward(model, gen.ids, gen.key_mask, tree=gen.prefix_tree())
    return hidden[..., gen.prompt_len - 1 :, :]


def value_head(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """V = w·h + b: h (..., C), weight (1, C), bias (1,) -> (...); stacked weight (M, 1, C), bias
    (M, 1) and h (M, ..., C), each model's own head."""
    return linear(h, weight, bias).squeeze(-1)


def head_values(
    weight: torch.Tensor,
    bias: torch.Tensor,
    gen,
    hidden: torch.Tensor | None = None,
    trunk: GPT | Weights | None = None,
) -> torch.Tensor:
    """A learned critic's V(s_t) = w·h_t + b before each completion token of the rows `gen` (a
    Generation: ids, key_mask, prompt_len, completion_mask, prefix_tree()), 0 where masked: weight
    (1, C), bias (1,); h_t the states `hidden` (N, T, C) where given (the policy's, the head
    critic's), else the trunk's completion_hidden. -> (N, T). Stacked: weight (M, 1, C), bias (M,
    1), a trunk of M models' weights and rows (M, N, ...) -> (M, N, T)."""
    hidden = completion_hidden(trunk, gen) if hidden is None else hidden
    return torch.where(gen.completion_mask, value_head(hidden, weight, bias), 0.0)


def support_logprobs(model: GPT | Weights, tree: ValueTree, temperature: float) -> torch.Tensor:
    """Every next-token log-prob of the tree's support rows -> (M, rows, W − 1) under M models: one
    GPT (M = 1) or M models' stacked weights, each over the rows' one prefix tree."""
    wte = model.wte.weight if isinstance(model, GPT) else model.w["wte.weight"]
    lead = wte.shape[:-2]  # () for one model
    every = lambda x: x.expand(*lead, *x.shape)
    prefixes = next_token_tree(tree.ids, tree.key_mask).expand(*lead)
    logp = sequence_logprobs(model, every(tree.ids), every(tree.key_mask), temperature, prefixes)
    return logp if lead else logp[None]


@torch.no_grad()
def exact_values(
    tree: ValueTree,
    policy: GPT | Weights,
    ref: GPT | Weights | None,
    betas: list[float],
    temperature: float,
    index: torch.Tensor,
    completion_ids: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """The oracle's V(s_t) of M models' rows (toy_tasks/value_tree.py): each model's log-probs of
    the support (and π_ref's where some β ≠ 0), the tree's recursion under each model's β, read at
    each row's prefixes. policy, ref: one GPT (M = 1) or M models' stacked weights; betas (M,);
    index (M, N) each row's prompt's place in the tree's prompts; completion_ids, mask (M, N, T)
    -> (M, N, T) float32, 0 where masked."""
    logp = support_logprobs(policy, tree, temperature)  # (M, rows, W − 1)
    ref_logp = (  # β = 0: no penalty, no forward of π_ref
        support_logprobs(ref, tree, temperature) if ref is not None and any(betas) else None
    )
    V = tree.values(logp, ref_logp, torch.tensor(betas, device=logp.device))
    return tree.prefix_values(V, index, completion_ids, mask)


class ValueHead(nn.Module):
    """V = w·h + b, (N, T, C) -> (N, T); zero-initialised, so every value starts at 0."""

    def __init__(self, n_embd: int):
        super().__init__()
        self.linear = nn.Linear(n_embd, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h):
        """h (N, T, C) -> (N, T)."""
        return value_head(h, self.linear.weight, self.linear.bias)


class Critic(ABC):
    """What PPO asks of a value function. Its checkpoint state keeps the keys PPO has always saved:
    {"value_head": state_dict | None, "critic_trunk": state_dict | None}."""

    learned = True  # False: exact values, nothing to fit or to score them against
    # the return's KL penalty coefficient, set by PPO before each rollout's values (the oracle's
    # input)
    beta = 0.0
    head: ValueHead | None = None
    trunk: nn.Module | None = None

    def named_weights(self) -> dict[str, torch.Tensor]:
        """Its parameters by name, in the optimiser's order: "head.weight", "head.bias", then the
        trunk's (GPT names): what P runs' critics stack."""
        head = {} if self.head is None else dict(self.head.linear.named_parameters(prefix="head"))
        trunk = {} if self.trunk is None else dict(self.trunk.named_parameters())
        return {**head, **trunk}

    def parameters(self) -> list[nn.Parameter]:
        """What the optimiser updates besides the policy: the head's, then the trunk's."""
        return list(self.named_weights().values())

    @abstractmethod
    def values(self, batch, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """(N, T) V(s_t) for a rollout (rl.rollout.RolloutBatch), 0 where masked; differentiable
        unless run under no_grad. hidden: the policy's (N, T, C) completion_hidden if the caller has
        it (else recomputed)."""

    def state_dict(self, weights: dict[str, torch.Tensor] | None = None) -> dict:
        """Its checkpoint state; weights: tensors by named_weights' names to save in place of its
        own (e.g. its slice of P stacked critics, copied to the host)."""
        state = {
            "value_head": None if self.head is None else self.head.state_dict(),
            "critic_trunk": None if self.trunk is None else self.trunk.state_dict(),
        }
        if weights is not None:  # "linear.weight" -> "head.weight"; the trunk's names are its own
            for k in state["value_head"] or {}:
                state["value_head"][k] = weights["head." + k.removeprefix("linear.")]
            for k in state["critic_trunk"] or {}:
                state["critic_trunk"][k] = weights[k]
        return state

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
        w = self.head.linear
        trunk, hidden = (self.policy, hidden) if self.trunk is None else (self.trunk, None)
        return head_values(w.weight, w.bias, batch.gen, hidden, trunk)


class SeparateCritic(HeadCritic):
    """A copy of the policy's trunk at the start of the run with its own scalar head: V =
    head(h_copy). The policy's hidden states are not used; nothing of the policy is touched."""

    def __init__(self, run):
        super().__init__(run)
        self.trunk = copy.deepcopy(run.policy)


class OracleCritic(Critic):
    """The exact V(s_t) = E_π[r − β·Σ_{j≥t} k1_j | prefix] of PPO's return under the policy now
    (π_old before the first update): `exact_values` of the run's policy (and π_ref) over the value
    tree of its prompts' support. The tree is made at the first call and kept (it depends only on
    the run's prompts, support and reward). No parameters, no value loss."""

    learned = False
    tree: ValueTree | None = None

    def __init__(self, run):
        self.run = run

    @torch.no_grad()
    def values(self, batch, hidden=None):
        r = self.run
        if self.tree is None:
            self.tree, self.place = value_tree([r])
        index = torch.tensor(
            [[self.place[x] for x in batch.prompts]], device=self.tree.roots.device
        )
        v = exact_values(
            self.tree, r.policy, r.ref, [float(self.beta)], r.cfg.temperature,
            index, batch.gen.completion_ids[None], batch.mask[None],
        )[0]  # fmt: skip
        return torch.where(batch.mask, v.to(batch.mask.device), 0.0)


def value_tree(runs: list) -> tuple[ValueTree, dict]:
    """The value tree of runs of one set of prompts (rl/run_state.Run's), over their rewards (one
    table where they share one), and each prompt's place in it."""
    r, specs = runs[0], {x.cfg.reward for x in runs}
    tables = r.rewards if len(specs) == 1 else [x.rewards for x in runs]
    return ValueTree(r.tok, r.prompts, r.task.support, tables, r.device), {
        x: i for i, x in enumerate(r.prompts)
    }


CRITICS: dict[str, type[Critic]] = {
    "separate": SeparateCritic,
    "head": HeadCritic,
    "oracle": OracleCritic,
}
