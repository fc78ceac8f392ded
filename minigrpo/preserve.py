"""Preservation: keep the model's behaviour on OFF-TARGET prompts while RL changes the target one.

RL on "ravin likes " alone moves the whole shared model: everybody else's food distribution drifts
(`--no-preserve`: every other person's pizza share goes to 0.81-0.99, README's spill-over table). The
anchor here is an exact distillation term on the other people's prompts:

    L_anchor = mean over anchor sequences x of  Σ_t KL( π_ref(· | x_<t) ‖ π_θ(· | x_<t) )

summed over the completion positions t of x (the food characters and the end token), with the full
vocabulary KL computed exactly at each position (`kl.exact`). The sequences x are sampled ONCE from
π_ref at the start (`per_prompt` per off-target prompt) and a fixed-size minibatch of them is used at
every step, so preservation costs no sampling. Because the prefixes come from π_ref, the summed
forward KL is, in expectation, exactly the sequence-level KL(π_ref ‖ π_θ) over whole completions —
the quantity that bounds how far each person's food distribution can move.

Compared with PPO-ptx (mixing the pretraining loss on corpus lines), the targets here are the
reference's full next-token distributions rather than one sampled character: the same fixed point,
much less noise. `--preserve-kl reverse` uses KL(π_θ ‖ π_ref) at the same positions instead (the
prototype's choice); `--no-preserve` turns the anchor off so the spill-over can be seen.

What --preserve-coef means: the anchor term, times the coefficient, is added to the loss of EVERY
optimiser step, each on a fresh minibatch of --preserve-batch anchor rows: μ times per GRPO rollout,
epochs × minibatches times per PPO rollout. Per step of the optimiser it is the same pull in every
algorithm; per rollout, an algorithm that takes more optimiser steps also takes more anchor steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minigrpo.kl import exact
from minigrpo.model import GPT
from minigrpo.rollout import generation_logprobs
from minigrpo.sampling import Generation, encode_prompts, generate
from minigrpo.tokenizer import CharTokenizer


@dataclass
class Anchor:
    gen: Generation  # (M, P+T) sequences sampled from π_ref on the off-target prompts
    ref_logits: torch.Tensor  # (M, T, V) π_ref's logits at each completion position

    def state_dict(self) -> dict:
        g = self.gen
        return {"ids": g.ids, "key_mask": g.key_mask, "prompt_len": g.prompt_len, "completion_mask": g.completion_mask,
                "logprobs": g.logprobs, "finished": g.finished, "ref_logits": self.ref_logits}

    @classmethod
    def from_state_dict(cls, d: dict, device) -> "Anchor":
        t = {k: v.to(device) if torch.is_tensor(v) else v for k, v in d.items()}
        return cls(Generation(t["ids"], t["key_mask"], t["prompt_len"], t["completion_mask"], t["logprobs"],
                              t["finished"]), t["ref_logits"])


@torch.no_grad()
def build_anchor(ref: GPT, tok: CharTokenizer, prompts: list[str], per_prompt: int, max_new_tokens: int,
                 generator: torch.Generator) -> Anchor:
    device = ref.wte.weight.device
    ids, mask = encode_prompts(tok, [p for p in prompts for _ in range(per_prompt)], device)
    gen = generate(ref, ids, mask, max_new_tokens, generator=generator)
    _, ref_logits = generation_logprobs(ref, gen, return_logits=True)
    return Anchor(gen, ref_logits)


def anchor_loss(policy: GPT, anchor: Anchor, rows: torch.Tensor, direction: str = "forward") -> torch.Tensor:
    """Mean over the chosen anchor rows of the summed exact per-position KL (see module docstring)."""
    sub = anchor.gen.select(rows)
    _, logits = generation_logprobs(policy, sub, return_logits=True)  # (m, T, V)
    ref_logits = anchor.ref_logits[rows]
    kl = exact(ref_logits, logits) if direction == "forward" else exact(logits, ref_logits)  # (m, T)
    kl = torch.where(sub.completion_mask, kl, torch.zeros((), device=kl.device))
    return kl.sum(dim=1).mean()
