"""Rollouts, shared by GRPO and PPO: sample G completions per prompt, score them, and compute the
log-probs of π_old and π_ref in one batched no-grad forward pass each.

    batch = collect(policy, ref, tok, prompts, group_size=8, reward=r, generator=g)
    batches = collect_all(weights, tok, prompts, ...)  # P runs' in one sampling batch

By default the completions come from π_old itself (the policy at --temperature). A `Sampler` (GRPO's
--sample-temperature, --sample-top-p, --sample-stale) makes them come from another distribution
π_sampler: the policy at another temperature, nucleus-truncated, or as it was N steps earlier
(asynchronous RL). π_old stays the current policy at --temperature; `batch.sampler_logp` holds
π_sampler's own log-probs of the tokens (Generation.logprobs), which the importance weights of
is_correction.py compare π_old with.

Layout: rows are grouped prompt by prompt, so `batch.rewards.view(-1, G)` is (prompts, G). Every
per-token tensor is (N, T) over COMPLETION tokens only (T = longest completion), with `batch.mask`
marking the valid ones (up to and including the first EOS); prompt tokens never receive gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from minigrpo.lm.draws import Generation, take
from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.lm.model import GPT, Weights
from minigrpo.lm.sampling import Request, encode_prompts, generate, generate_all, read_completions
from minigrpo.lm.tokenizer import CharTokenizer
from toy_tasks.rewards import Reward, RewardError, score


@dataclass
class RolloutBatch:
    prompts: list[str]  # (N,) the prompt of each row
    completions: list[str]  # (N,) decoded completion text (no end marker)
    gen: Generation  # ids (N, P+T), key_mask, completion_mask (N, T), finished (N,)
    rewards: torch.Tensor  # (N,) float
    group_size: int
    # (N, T) log π_old of each completion token (0 where masked); None: not computed here (the
    # algorithm takes it from its first update's forward pass, π_θ = π_old there)
    old_logp: torch.Tensor | None
    ref_logp: torch.Tensor | None  # (N, T) log π_ref of each completion token; None: not computed
    ref_logits: torch.Tensor | None = None  # (N, T, V) π_ref's logits, kept only for the exact KL

    @property
    def mask(self) -> torch.Tensor:  # (N, T) bool
        return self.gen.completion_mask

    @property
    def sampler_logp(self) -> torch.Tensor:  # (N, T) log π_sampler of each token (0 where masked)
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


class Sampler:
    """Where the rollouts come from when it is not π_old: the policy at `temperature` (None: the
    run's), truncated to its top-p nucleus (None: no truncation), and, with stale = N > 0, the
    policy as it was N steps earlier (the first N steps sample from the initial policy). The last
    N + 1 policies' weights are kept (state_dict: they go into the checkpoint, so --resume samples
    exactly as before)."""

    def __init__(
        self, temperature: float | None = None, top_p: float | None = None, stale: int = 0
    ):
        self.temperature, self.top_p, self.stale = temperature, top_p, stale
        self.states: list[dict] = []  # oldest first: the weights of the last stale + 1 policies

    def pick(self, weights: Weights) -> Weights:
        """Called once per step before sampling: records the live `weights` (one model's, or P
        models' stacked (P, ...)) -> the weights to sample from (with stale, the oldest kept)."""
        if self.stale == 0:
            return weights
        self.states = self.states + [{k: v.detach().clone() for k, v in weights.w.items()}]
        self.states = self.states[-(self.stale + 1) :]
        return Weights(weights.cfg, self.states[0])

    def state_dict(self) -> dict:
        return {"states": self.states}

    def load_state_dict(self, state: dict) -> None:
        self.states = list(state["states"])


def collect_all(
    weights: Weights,
    tok: CharTokenizer,
    prompts: list[list[str]],
    group_size: int,
    rewards: list[Reward],
    generators: list[torch.Generator],
    max_new_tokens: int,
    temperature: float,
    sampler: Sampler | None = None,
    unfinished_reward: float | None = None,
    progress=None,
) -> list[RolloutBatch | ValueError]:
    """Runs' rollouts in one sampling batch, without log-probs: `group_size` completions of each of
    run p's prompts[p] through `weights` (stacked (P, ...); one model's for one run), or `sampler`'s
    (at its temperature, where it has one, and top-p), drawn from generators[p], scored by
    rewards[p] -> its RolloutBatch, or its sampling's ValueError (no room, probabilities not
    finite) or its reward's RewardError."""
    device, top_p = weights.w["wte.weight"].device, None
    if sampler is not None:
        weights, top_p = sampler.pick(weights), sampler.top_p
        temperature = temperature if sampler.temperature is None else sampler.temperature
    rows = [[p for p in ps for _ in range(group_size)] for ps in prompts]  # prompt by prompt
    encoded = [encode_prompts(tok, r, device) for r in rows]
    requests = [
        Request(ids, mask, max_new_tokens, temperature, None, top_p, generator, ids.size(1))
        for (ids, mask), generator in zip(encoded, generators)
    ]
    gens = generate_all(weights, requests)
    batches, scored = [], []
    for r, reward, gen, read in zip(rows, rewards, gens, read_completions(tok, gens)):
        mine = [0.0] * len(r)  # a failed run's rewards: any
        if read is not None:
            try:
                mine = score(reward, r, *read, unfinished_reward, progress)
                gen = RolloutBatch(r, read[0], gen, None, group_size, None, None)
            except RewardError as e:
                gen = e
        batches.append(gen)
        scored.append(mine)
    values = torch.tensor(scored, device=device)  # one copy to the device
    for b, v in zip(batches, values):
        if isinstance(b, RolloutBatch):
            b.rewards = v
    return batches


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
    """One run's collect_all from the policy (π_old), or from `sampler`'s distribution, with π_ref's
    (with ref_logp; else None) and, with old_logp, π_old's log-probs of every completion token at
    `temperature`."""
    (batch,) = collect_all(
        policy.weights(),
        tok,
        [prompts],
        group_size,
        [reward],
        [generator],
        max_new_tokens,
        temperature,
        sampler,
        unfinished_reward,
        progress,
    )
    if isinstance(batch, ValueError):
        raise batch
    if old_logp:
        batch.old_logp = generation_logprobs(policy, batch.gen, temperature)
    if ref_logp:
        ref_lp, ref_logits = generation_logprobs(ref, batch.gen, temperature, return_logits=True)
        batch.ref_logp, batch.ref_logits = ref_lp, ref_logits if keep_ref_logits else None
    return batch


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
    greedy = torch.Generator(device).manual_seed(0)  # top-1: the draw is the argmax
    gen = generate(policy, ids, key_mask, max_new_tokens, top_k=1, generator=greedy)
    rewards = score(reward, prompts, *read_completions(tok, [gen])[0], unfinished_reward)
    return torch.tensor(rewards, device=device)
