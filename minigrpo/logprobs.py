"""Log-probabilities of given tokens: the one function every algorithm and evaluation uses.

`sequence_logprobs` runs ONE forward pass over whole sequences (prompt + completion) and returns the
log-probability of every next token; GRPO, PPO, the reference model and the exact evaluations of the
toy tasks all call it, so none of them can disagree about masks or positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minigrpo.model import GPT, positions
from minigrpo.tokenizer import CharTokenizer


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target]: logits (B, T, V), targets (B, T) -> (B, T)."""
    return F.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def sequence_logprobs(model: GPT, ids: torch.Tensor, key_mask: torch.Tensor | None = None,
                      temperature: float = 1.0, return_logits: bool = False, return_hidden: bool = False):
    """Next-token log-probs of a batch of (left-padded) sequences in one forward pass.

    ids (B, T), key_mask (B, T) bool (real tokens; None = all real)
    -> logp (B, T-1) with logp[:, t] = log π(ids[:, t+1] | ids[:, :t+1]) at the given temperature,
       and, with return_logits, the temperature-scaled logits (B, T-1, V) that produced them,
       and, with return_hidden, the final hidden states (B, T-1, C) (for a value head).
    Entries whose target is padding are meaningless; callers mask them.
    """
    inp = ids[:, :-1]
    km = key_mask[:, :-1] if key_mask is not None else None
    pos = positions(km) if km is not None else None
    hidden = model.hidden(inp, pos=pos, key_mask=km)  # (B, T-1, C)
    logits = model.head(hidden) / temperature  # (B, T-1, V)
    logp = gather_logprobs(logits, ids[:, 1:])
    if not (return_logits or return_hidden):
        return logp
    return (logp, logits, hidden) if return_hidden else (logp, logits)


def pad_left(rows: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to one tensor: -> ids (B, T) long, key_mask (B, T) bool."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = True
    return ids.to(device), mask.to(device)


@torch.no_grad()
def completion_logprobs(model: GPT, tok: CharTokenizer, prompts: list[str], completions: list[str],
                        end: bool = True) -> torch.Tensor:
    """log π(completion [+ EOS] | BOS + prompt) for each (prompt, completion) pair, one forward pass.

    Teacher-forced scoring: the exact probability that sampling (temperature 1) produces exactly this
    completion and then stops. -> (N,) float tensor of summed log-probs.
    """
    device = model.wte.weight.device
    rows, n_prompt = [], []
    for p, c in zip(prompts, completions):
        head = tok.encode(p, bos=True)
        rows.append(head + tok.encode(c, eos=end))
        n_prompt.append(len(head))
    width = max(len(r) for r in rows)
    ids, mask = pad_left(rows, tok.pad_id, device)
    logp = sequence_logprobs(model, ids, mask)  # (N, width-1)
    # the completion of row i occupies its last (len(row) - n_prompt) targets
    n_comp = torch.tensor([len(r) - n for r, n in zip(rows, n_prompt)], device=device)
    col = torch.arange(width - 1, device=device)[None, :]
    is_completion = col >= (width - 1 - n_comp)[:, None]  # (N, width-1)
    return torch.where(is_completion, logp, torch.zeros_like(logp)).sum(dim=1)
