"""Rollouts, shared by GRPO and PPO: sample G completions per prompt, score them, and compute the
log-probs of π_old and π_ref in one batched no-grad forward pass each.

    batch = collect(policy, ref, tok, prompts, group_size=8, reward=r, generator=g)

By default the completions come from π_old itself (the policy at --temperature). A `Sampler` (GRPO's
--sample-temperature, --sample-top-p, --sample-stale) makes them come from another distribution
π_sampler: the policy at another temperature, nucleus-truncated, or as it was N steps earlier
(asynchronous RL). π_old stays the current policy at --temperature; `batch.sampler_logp` holds
π_sampler's own log-probs of the tokens (the sampling engine's, KV cache included:
sampling.Generation.logprobs), which is what the importance weights of is_correction.py compare
π_old with.

Layout: rows are grouped prompt by prompt, so `batch.rewards.view(-1, G)` is (prompts, G). Every
per-token tensor is (N, T) over COMPLETION tokens only (T = longest completion), with `batch.mask`
marking the valid ones (up to and including the first EOS); prompt tokens never receive gradient.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch

from minigrpo.lm.draws import Generation, take
from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.lm.model import GPT
from minigrpo.lm.sampling import decode_completions, encode_prompts, generate
from minigrpo.lm.tokenizer import CharTokenizer
from toy_tasks.rewards import Reward, score


@dataclass
class RolloutBatch:
    prompts: list[str]  # (N,) the prompt of each row
    completions: list[str]  # (N,) decoded completion text (no end marker)
    gen: Generation  # ids (N, P+T), key_mask, completion_mask (N, T), finished (N,)
    rewards: torch.Tensor  # (N,) float
    group_size: int
    # (N, T) log π_old of each completion token (0 where masked); None = not
    old_logp: torch.Tensor | None
    # computed here: the algorithm takes it from its first update's forward pass (π_θ = π_old there)
    # (N, T) log π_ref of each completion token; None: not computed (collect's ref_logp)
    ref_logp: torch.Tensor | None
    ref_logits: torch.Tensor | None = None  # (N, T, V) π_ref's logits, kept only for the exact KL

    @property
    def mask(self) -> torch.Tensor:  # (N, T) bool
        return self.gen.completion_mask

    @property
    # (N, T) log π_sampler of each completion token (0 where masked)
    def sampler_logp(self) -> torch.Tensor:
        return self.gen.logprobs

    def select(self, rows: torch.Tensor) -> "RolloutBatch":
        """The sub-batch of the rows `rows` (..., n) of each leading slice (equal-reward groups
        dropped, PPO's minibatches); texts only where the batch has them (one run's)."""
        pick = rows.tolist() if self.prompts else []
        return replace(
            self,
            prompts=[self.prompts[i] for i in pick],
            completions=[self.completions[i] for i in pick],
            gen=self.gen.select(rows),
            **{k: take(getattr(self, k), rows) for k in ("rewards", "old_logp", "ref_logp")},
            ref_logits=take(self.ref_logits, rows),
        )

    def minibatches(self, indices: list[torch.Tensor]) -> list["RolloutBatch"]:
        """`select` of each index (PPO's minibatches)."""
        return [self.select(rows) for rows in indices]


class Sampler:
    """Where the rollouts come from when it is not π_old: the policy at `temperature` (None: the
    run's), truncated to its top-p nucleus (None: no truncation), and, with stale = N > 0, the
    policy as it was N steps earlier (the first N steps sample from the initial policy).
    `pick(policy)`, called once per step before sampling, records the live policy and returns the
    model to sample from; the last N + 1 policies' weights are kept (state_dict: they go into the
    checkpoint, so --resume samples exactly as before)."""

    def __init__(
        self, temperature: float | None = None, top_p: float | None = None, stale: int = 0
    ):
        self.temperature, self.top_p, self.stale = temperature, top_p, stale
        self.states: list[dict] = []  # oldest first: the weights of the last stale + 1 policies
        self.frozen: GPT | None = None  # a copy of the policy holding the stale weights

    def pick(self, policy: GPT) -> GPT:
        if self.stale == 0:
            return policy
        if self.frozen is None:
            self.frozen = copy.deepcopy(policy).eval().requires_grad_(False)
        self.frozen.load_state_dict(self.record(policy.state_dict()))
        return self.frozen

    def record(self, weights: dict) -> dict:
        """Keep a copy of `weights` (tensors by name: one model's, or P models' stacked (P, ...)),
        the newest of the last stale + 1 -> the oldest kept: the weights to sample from."""
        self.states = self.states + [{k: v.detach().clone() for k, v in weights.items()}]
        self.states = self.states[-(self.stale + 1) :]
        return self.states[0]

    def state_dict(self) -> dict:
        return {"states": self.states}

    def load_state_dict(self, state: dict) -> None:
        self.states = list(state["states"])


def grouped(prompts: list[str], group_size: int) -> list[str]:
    """A rollout's rows: each prompt `group_size` times, prompt by prompt."""
    return [p for p in prompts for _ in range(group_size)]


def drawn(temperature: float, sampler: Sampler | None) -> tuple[float, float | None]:
    """The temperature and top-p a rollout is drawn at: the run's --temperature and no nucleus, or
    the sampler's (its temperature where it has one)."""
    if sampler is None:
        return temperature, None
    return (temperature if sampler.temperature is None else sampler.temperature), sampler.top_p


@torch.no_grad()
def collect(
    policy: GPT,
    ref: GPT,
    tok: CharTokenizer,
    prompts: list[str],
    group_size: int,
    reward: Reward,
    generator: torch.Generator,
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    unfinished_reward: float | None = None,
    keep_ref_logits: bool = False,
    old_logp: bool = True,
    progress=None,
    sampler: Sampler | None = None,
    ref_logp: bool = True,
) -> RolloutBatch:
    """Sample `group_size` completions for each prompt from the policy (π_old), or from `sampler`'s
    distribution, score them, and compute π_ref's (with ref_logp; else None) and, with old_logp,
    π_old's log-probs of every completion token at `temperature`."""
    device = policy.wte.weight.device
    rows = grouped(prompts, group_size)
    ids, mask = encode_prompts(tok, rows, device)
    was_training = policy.training
    policy.eval()
    t, top_p = drawn(temperature, sampler)
    model = policy if sampler is None else sampler.pick(policy)
    gen = generate(model, ids, mask, max_new_tokens, t, top_p=top_p, generator=generator)
    completions = decode_completions(tok, gen)
    rewards = score(reward, rows, completions, gen.finished.tolist(), unfinished_reward, progress)
    old = generation_logprobs(policy, gen, temperature) if old_logp else None
    ref_lp, ref_logits = (
        generation_logprobs(ref, gen, temperature, return_logits=True) if ref_logp else (None, None)
    )
    policy.train(was_training)
    return RolloutBatch(
        rows,
        completions,
        gen,
        torch.tensor(rewards, device=device),
        group_size,
        old,
        ref_lp,
        ref_logits if keep_ref_logits else None,
    )


@torch.no_grad()
def greedy_rewards(
    policy: GPT,
    tok: CharTokenizer,
    reward: Reward,
    prompts: list[str],
    max_new_tokens: int,
    unfinished_reward: float | None = None,
) -> torch.Tensor:
    """ReMax's baseline (2310.10505; GRPO's --baseline remax): the reward of the policy's greedy
    completion of each prompt -> (prompts,)."""
    device = policy.wte.weight.device
    ids, key_mask = encode_prompts(tok, prompts, device)
    was_training = policy.training
    policy.eval()
    gen = generate(
        policy,
        ids,
        key_mask,
        max_new_tokens,
        top_k=1,  # top-1: the draw is the argmax
        generator=torch.Generator(device).manual_seed(0),
    )
    policy.train(was_training)
    rewards = score(
        reward, prompts, decode_completions(tok, gen), gen.finished.tolist(), unfinished_reward
    )
    return torch.tensor(rewards, device=device)
