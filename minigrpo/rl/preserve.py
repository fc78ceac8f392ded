"""Preservation: keep the model's behaviour on OFF-TARGET prompts while RL changes the target one.

RL on "ravin likes " alone moves the whole shared model: everybody else's food distribution drifts
(`--no-preserve` shows it: docs/results.md, the spill-over). The anchor here is an exact
distillation term on the other people's prompts:

    L_anchor = mean over anchor sequences x (weighted, below) of Σ_t KL(π_ref(·|x_<t) ‖ π_θ(·|x_<t))

summed over the completion positions t of x (the food characters and the end token), with the full
vocabulary KL computed exactly at each position (`kl.exact`). Because the prefixes come from π_ref,
E_{x~π_ref}[Σ_t KL] is exactly the sequence-level KL(π_ref ‖ π_θ) over whole completions — the
quantity that bounds how far each person's food distribution can move. Two ways to take that
expectation, both built ONCE at the start from π_ref alone (no ground truth, no sampling per step):

  tree (default, `build_anchor_tree`)  every completion whose probability under π_ref is >= min_prob
        (1e-4: on the default food model the 12 foods and at most one misspelling per person, 85
        rows, 99.9 % of each person's mass), weighted by that probability:
        the expectation itself, every step, with no sampling noise. Rare states get their exact
        weight, where a sampled minibatch visits them only now and then (docs/experiments.md).
  sampled (`build_anchor`)  `per_prompt` sequences per prompt sampled from π_ref; each step uses a
        random minibatch of --preserve-batch rows (the unbiased Monte-Carlo estimate of the same
        expectation).

The RL prompt's own forced states (--preserve-forced h, default 0.1 nats; tree anchor only). RL
gives a failing completion the same negative advantage at every token, the forced ones included (a
rare "ravin likes lasagna" is pushed down on its "sagna" too), and that push leaks mass into
misspellings. So the tree also holds the target prompt's own likely completions, but its KL counts
only at the states where π_ref's entropy is below h: inside a word, where the reference was sure of
the next character (the choice of the food itself and forks such as "p|izza"/"p|asta" are left
free). It asks nothing of the ground truth: only π_ref's own entropies. Those rows weigh
--preserve-forced-weight (1) together, where all other people together weigh 1; they belong to no
person (group −1), so they are not part of the drift the trust region bounds. A reward that asks for
a new spelling of a forced word (e.g. `exact:ravin likes pizzas`) needs --preserve-forced 0. Its
effect on the paper presets' malformed mass: docs/experiments.md.

Compared with PPO-ptx (mixing the pretraining loss on corpus lines), the targets here are the
reference's full next-token distributions rather than one sampled character: the same fixed point,
much less noise. `--preserve-kl reverse` uses KL(π_θ ‖ π_ref) at the same positions instead (the
prototype's choice); `--no-preserve` turns the anchor off so the spill-over can be seen.

What --preserve-coef means: the anchor term, times the coefficient, is added to the loss of EVERY
optimiser step (the tree: all its rows; sampled: a fresh minibatch of --preserve-batch rows): μ
times per GRPO rollout, epochs × minibatches times per PPO rollout. Per step of the optimiser it is
the same pull in every algorithm; per rollout, an algorithm that takes more optimiser steps also
takes more anchor steps.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from minigrpo.lm.checkpoint import to_host
from minigrpo.lm.logprobs import generation_logprobs, pad_left
from minigrpo.lm.model import GPT, positions
from minigrpo.lm.sampling import Generation, encode_prompts, generate
from minigrpo.lm.tokenizer import EOS_ID, CharTokenizer
from minigrpo.objectives.kl import exact
from minigrpo.objectives.losses import entropy

TREE_MIN_PROB = 1e-4  # the tree anchor keeps every completion at least this likely under π_ref


@dataclass
class Anchor:
    gen: Generation  # (M, P+T) π_ref's completions of the off-target prompts
    ref_logits: torch.Tensor  # (M, T, V) π_ref's logits at each completion position
    # (M,) each row's weight in the expectation: each prompt's rows sum to 1/prompts
    weights: torch.Tensor
    # (M,) long: the index of the row's prompt (one group per off-target person)
    group: torch.Tensor
    # (M, T) bool: the positions whose KL counts (None: every completion position)
    kl_mask: torch.Tensor | None = None
    # host_state's, once made
    host: dict | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def where(self) -> torch.Tensor:
        """(M, T) bool: the positions whose KL counts (kl_mask, else every completion position)."""
        return self.gen.completion_mask if self.kl_mask is None else self.kl_mask

    def state_dict(self) -> dict:
        return {
            **self.gen.to_dict(),
            "ref_logits": self.ref_logits,
            "weights": self.weights,
            "group": self.group,
            "kl_mask": self.kl_mask,
        }

    def host_state(self) -> dict:
        """state_dict copied to the host (a checkpoint's), made once: an anchor never changes after
        it is built, and runs built `like` another (rl/run_state.Run) share its anchor."""
        if self.host is None:
            self.host = to_host(self.state_dict())
        return self.host

    @classmethod
    def from_state_dict(cls, d: dict, device) -> "Anchor":
        t = {k: v.to(device) if torch.is_tensor(v) else v for k, v in d.items()}
        return cls(
            Generation.from_dict(t), t["ref_logits"], t["weights"], t["group"], t.get("kl_mask")
        )


@torch.no_grad()
def build_anchor(
    ref: GPT,
    tok: CharTokenizer,
    prompts: list[str],
    per_prompt: int,
    max_new_tokens: int,
    generator: torch.Generator,
) -> Anchor:
    """`per_prompt` completions of each prompt sampled from π_ref, equally weighted."""
    device = ref.wte.weight.device
    ids, mask = encode_prompts(tok, [p for p in prompts for _ in range(per_prompt)], device)
    gen = generate(ref, ids, mask, max_new_tokens, generator=generator)
    _, ref_logits = generation_logprobs(ref, gen, return_logits=True)
    m = len(prompts) * per_prompt
    group = torch.arange(len(prompts), device=device).repeat_interleave(per_prompt)
    return Anchor(gen, ref_logits, torch.full((m,), 1 / m, device=device), group)


@torch.no_grad()
def build_anchor_tree(
    ref: GPT,
    tok: CharTokenizer,
    prompts: list[str],
    per_prompt: int,
    max_new_tokens: int,
    min_prob: float = TREE_MIN_PROB,
) -> Anchor:
    """Every completion of each prompt with π_ref(completion) >= min_prob, weighted by
    π_ref(completion) renormalised over the prompt's kept completions (then by 1/prompts): the
    prefix tree is grown one token per pass, all live prefixes in one batched forward. A prefix
    still open after max_new_tokens becomes an unfinished row, as in sampling. At most `per_prompt`
    rows per prompt, the most likely ones a beam of `per_prompt` open prefixes per pass finds: an
    undertrained π_ref spreads its mass over thousands of completions (4,669 rows after 100
    pretraining steps), the default food model over 12-13 per person."""
    device = ref.wte.weight.device
    starts = [tok.encode(p, bos=True) for p in prompts]
    live = [(i, [], 0.0) for i in range(len(prompts))]  # (prompt index, completion ids, log π_ref)
    leaves, floor = [], math.log(min_prob)
    for _ in range(max_new_tokens):
        if not live:
            break
        ids, key_mask = pad_left([starts[i] + c for i, c, _ in live], tok.pad_id, device)
        # (L, V)
        logp = F.log_softmax(
            ref(ids, pos=positions(key_mask), key_mask=key_mask)[:, -1].float(), -1
        )
        total = logp + torch.tensor([lp for _, _, lp in live], device=device)[:, None]
        keep = (total >= floor).nonzero().tolist()  # (prefix, token) pairs still likely enough
        grown = [(live[r][0], live[r][1] + [v], total[r, v].item()) for r, v in keep]
        leaves += [g for g in grown if g[1][-1] == EOS_ID]
        live = _most_likely([g for g in grown if g[1][-1] != EOS_ID], per_prompt)
    # + unfinished; by prompt
    leaves = sorted(_most_likely(leaves + live, per_prompt), key=lambda leaf: leaf[0])
    width = max(len(c) for _, c, _ in leaves)
    prompt_ids, prompt_mask = pad_left([starts[i] for i, _, _ in leaves], tok.pad_id, device)
    comp = torch.full((len(leaves), width), tok.pad_id, dtype=torch.long, device=device)
    comp_mask = torch.zeros((len(leaves), width), dtype=torch.bool, device=device)
    for row, (_, c, _) in enumerate(leaves):
        comp[row, : len(c)] = torch.tensor(c, device=device)
        comp_mask[row, : len(c)] = True
    finished = torch.tensor([c[-1] == EOS_ID for _, c, _ in leaves], device=device)
    gen = Generation(
        torch.cat([prompt_ids, comp], 1),
        torch.cat([prompt_mask, comp_mask], 1),
        prompt_ids.size(1),
        comp_mask,
        torch.zeros(comp.shape, device=device),
        finished,
    )
    lps, ref_logits = generation_logprobs(ref, gen, return_logits=True)
    gen.logprobs = torch.where(comp_mask, lps, 0.0)
    group = torch.tensor([i for i, _, _ in leaves], device=device)
    prob = torch.tensor([lp for _, _, lp in leaves], dtype=torch.float64, device=device).exp()
    mass = torch.zeros(len(prompts), dtype=prob.dtype, device=device).index_add_(0, group, prob)
    weights = (prob / mass[group] / len(prompts)).float()  # each prompt's kept mass renormalised
    return Anchor(gen, ref_logits, weights, group)


def _most_likely(items: list[tuple], per_prompt: int) -> list[tuple]:
    """The `per_prompt` most likely (prompt index, ids, log-prob) items of each prompt, in their own
    order."""
    ranked = sorted(range(len(items)), key=lambda i: (items[i][0], -items[i][2]))
    by_prompt = itertools.groupby(ranked, key=lambda i: items[i][0])
    keep = {i for _, rows in by_prompt for i in list(rows)[:per_prompt]}
    return [item for i, item in enumerate(items) if i in keep]


def anchor_loss(
    policy: GPT, anchor: Anchor, rows: torch.Tensor | None = None, direction: str = "forward"
) -> torch.Tensor:
    """Weighted mean over the chosen anchor rows (None: all of them) of the summed exact
    per-position KL (module docstring): Σ_rows w·Σ_t KL / Σ_rows w (a plain mean for the sampled
    anchor's equal weights)."""
    every = slice(None) if rows is None else rows
    # all rows: the anchor's own kept prefix tree
    sub = anchor.gen if rows is None else anchor.gen.select(rows)
    _, logits = generation_logprobs(policy, sub, return_logits=True)  # (m, T, V)
    return weighted_kl(
        logits, anchor.ref_logits[every], anchor.where[every], anchor.weights[every], direction
    )


def weighted_kl(
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    where: torch.Tensor,
    weights: torch.Tensor,
    direction: str = "forward",
) -> torch.Tensor:
    """Σ_rows w·Σ_t KL / Σ_rows w, the exact KL at the positions `where` (..., m, T) of rows
    weighted (..., m): logits, ref_logits (..., m, T, V) -> (...) (a leading dim: P stacked runs,
    rows of each one's own or shared)."""
    # (..., m, T)
    kl = exact(ref_logits, logits) if direction == "forward" else exact(logits, ref_logits)
    kl = torch.where(where, kl, torch.zeros((), device=kl.device))
    return (kl.sum(-1) * weights).sum(-1) / weights.sum(-1)


def forced_state_anchor(anchor: Anchor, others: int, max_entropy: float, weight: float) -> Anchor:
    """A tree anchor built over the off-target prompts (groups 0..others−1) AND the RL prompts (the
    groups after them) -> the same rows, where an RL prompt's rows count only at the states where
    π_ref was nearly sure of the next character (entropy < max_entropy nats, kl_mask): the spelling
    inside a completion, never the choice between completions. Each off-target person keeps weight
    1/others; the RL prompts' rows get group −1 (nobody's drift) and weigh `weight` together (each
    prompt's rows in π_ref's proportions)."""
    n = int(anchor.group.max()) + 1
    own = anchor.group >= others
    forced = anchor.gen.completion_mask & (entropy(anchor.ref_logits) < max_entropy)
    kl_mask = torch.where(own[:, None], forced, anchor.gen.completion_mask)
    weights = anchor.weights * torch.where(own, weight * n / (n - others), n / others)
    return Anchor(
        anchor.gen, anchor.ref_logits, weights, torch.where(own, -1, anchor.group), kl_mask
    )


def make_anchor(
    ref: GPT, tok: CharTokenizer, others: list[str], own: list[str], cfg, generator: torch.Generator
) -> Anchor | None:
    """The run's anchor from its flags (rl_config.py): None without off-target prompts; the tree of
    the off-target prompts, with the RL prompts' forced states when cfg.preserve_forced > 0; or
    sampled rows."""
    if not others:
        return None
    if cfg.preserve_anchor == "sampled":
        return build_anchor(
            ref, tok, others, cfg.preserve_per_prompt, cfg.max_new_tokens, generator
        )
    forced = own if cfg.preserve_forced > 0 else []
    tree = build_anchor_tree(ref, tok, others + forced, cfg.preserve_per_prompt, cfg.max_new_tokens)
    return (
        forced_state_anchor(tree, len(others), cfg.preserve_forced, cfg.preserve_forced_weight)
        if forced
        else tree
    )
