"""The `mismatch` section of `python -m minigrpo.bench`: what a sampler other than π does to GRPO's
gradient, exactly, and to whole runs (issue 15's mismatch lab; the flags: variants/sampler.py).

    python -m minigrpo.bench --only mismatch

1. The exact expected gradient. For a policy π, a sampler q and ravin's prompt, every completion y
   with π(y) >= 1e-6 or q(y) >= 1e-6 (a prefix tree grown under both: a prefix's probability bounds
   its completions', so none above the floor is missed), r = the pizza reward, b = E_π[r] over that
   set:
       g_true = Σ_y π(y)·(r(y) − b)·∇log π(y)                  = ∇E_π[r] (up to the mass below the
       floor)
       g_w    = Σ_y q(y)·(r(y) − b)·Σ_t w_t(y)·∇log π(y_t | y_<t)
   g_w is the expectation, under the sampler, of the per-token policy-gradient estimator with the
   correction's constant weights w (none: 1; tis / mis: is_correction.tis_weights / mis_weights with
   w = π/q per token or Π_t per sequence, cap 2, band [0.5, 2]). Sequence sums and one baseline, so
   rows differ only in the sampler and the correction; each g is one backward over the enumerated
   set. Reported: cosine to g_true, ‖g − g_true‖/‖g_true‖, KL(q‖π) over whole completions, and the
   mass of π that q cannot reach (top-p's truncation: no weight can bring it back). Samplers: q = π
   (the control: exactly g_true), temperature 0.8 and 1.2, top-p 0.9 and 0.95 (π = the pretrained
   model), and stale: π = the policy after 5 default GRPO pizza steps (seed 0), q = the pretrained
   model, 5 steps back.
2. Runs: pizza with each of RUN_MISMATCHES, with no correction, TIS and MIS, beside the on-policy
   default, seeds 0..n−1, --jobs at a time: bench's table (final exact target, steps to 0.95, peak
   malformed, peak drift).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from minigrpo.bench.common import ROW_HEADER, run_all, run_module, seed_row, table
from minigrpo.lm.checkpoint import load_checkpoint
from minigrpo.lm.draws import process_logits
from minigrpo.lm.logprobs import pad_left, shifted_forward
from minigrpo.lm.model import GPT, positions
from minigrpo.lm.sampling import Generation
from minigrpo.lm.tokenizer import EOS_ID, CharTokenizer
from minigrpo.objectives.importance import mis_weights, tis_weights
from toy_tasks import food
from toy_tasks.rewards import make_reward, score

MIN_PROB = 1e-6
PROMPT = "ravin likes "
CORRECTIONS = {
    "none": None,
    "tis token": ("tis", "token"),
    "tis sequence": ("tis", "sequence"),
    "mis token": ("mis", "token"),
    "mis sequence": ("mis", "sequence"),
}
SAMPLERS = {
    "q = π (control)": (1.0, None),
    "temperature 0.8": (0.8, None),
    "temperature 1.2": (1.2, None),
    # (temperature, top-p) of q, from π's logits
    "top-p 0.9": (1.0, 0.9),
    "top-p 0.95": (1.0, 0.95),
}
STALE_STEPS = 5
RUN_MISMATCHES = {
    "--sample-temperature 1.2": ["--sample-temperature", "1.2"],
    "--sample-top-p 0.9": ["--sample-top-p", "0.9"],
    "--sample-stale 4": ["--sample-stale", "4"],
}
RUN_CORRECTIONS = {"none": [], "tis": ["--is-correction", "tis"], "mis": ["--is-correction", "mis"]}


def token_logp(
    model: GPT, gen: Generation, temperature: float = 1.0, top_p: float | None = None
) -> torch.Tensor:
    """(N, T) log-probs of the completion tokens under the model's distribution at `temperature`,
    truncated to its top-p nucleus (−inf outside it), 0 in masked slots; differentiable. The same
    arithmetic for π and q, so q = π gives identical log-probs."""
    P = gen.prompt_len
    logits, _ = shifted_forward(model, gen.ids, gen.key_mask)
    logits = logits[:, P - 1 :]  # (N, T, V): the logits before each completion token
    q = F.log_softmax(
        process_logits(logits.reshape(-1, logits.size(-1)), temperature, None, top_p), -1
    )
    lp = q.view_as(logits).gather(-1, gen.completion_ids[..., None]).squeeze(-1)
    return torch.where(gen.completion_mask, lp, torch.zeros((), dtype=lp.dtype))


@torch.no_grad()
def enumerate_completions(
    dists: list[tuple[GPT, float, float | None]],
    tok: CharTokenizer,
    prompt: str,
    max_new_tokens: int,
    min_prob: float = MIN_PROB,
) -> Generation:
    """Every completion of `prompt` whose probability under at least one of the distributions
    (model, temperature, top-p) is >= min_prob, as a Generation (finished rows end in EOS; a prefix
    still above the floor after max_new_tokens is an unfinished row). A prefix is dropped once it is
    below the floor under every distribution: its completions are all less likely than it is."""
    start, floor, device = (
        tok.encode(prompt, bos=True),
        math.log(min_prob),
        dists[0][0].wte.weight.device,
    )
    # (completion ids, log-prob under each distribution)
    live, done = [([], [0.0] * len(dists))], []
    for _ in range(max_new_tokens):
        if not live:
            break
        ids, key_mask = pad_left([start + c for c, _ in live], tok.pad_id, device)
        nxt = torch.stack(
            [
                F.log_softmax(
                    process_logits(
                        m(ids, pos=positions(key_mask), key_mask=key_mask)[:, -1],
                        # (D, L, V)
                        t,
                        None,
                        p,
                    ),
                    -1,
                )
                for m, t, p in dists
            ]
        )
        total = nxt + torch.tensor([lp for _, lp in live], device=device).T[:, :, None]  # (D, L, V)
        # (prefix, token): above the floor somewhere
        keep = (total.max(0).values >= floor).nonzero().tolist()
        grown = [(live[r][0] + [v], total[:, r, v].tolist()) for r, v in keep]
        done += [g for g in grown if g[0][-1] == EOS_ID]
        live = [g for g in grown if g[0][-1] != EOS_ID]
    rows = [c for c, _ in done + live]
    prompt_ids, prompt_mask = pad_left([start] * len(rows), tok.pad_id, device)
    width = max(len(c) for c in rows)
    comp = torch.tensor([c + [tok.pad_id] * (width - len(c)) for c in rows], device=device)
    mask = (
        torch.arange(width, device=device)[None, :]
        < torch.tensor([len(c) for c in rows], device=device)[:, None]
    )
    return Generation(
        torch.cat([prompt_ids, comp], 1),
        torch.cat([prompt_mask, mask], 1),
        prompt_ids.size(1),
        mask,
        torch.zeros(comp.shape, device=device),
        torch.tensor([c[-1] == EOS_ID for c in rows]),
    )


def estimator_coefs(
    pi_logp, q_logp, mask, rewards, baseline, correction=None, cap=2.0, band=(0.5, 2.0)
):
    """The constants c (N, T) with g_w = ∇ Σ_{y,t} c_{y,t}·log π(y_t | y_<t): q(y)·(r(y) − b)·w_t(y)
    on the valid tokens (module docstring); correction None (w = 1) or (kind, level). pi_logp,
    q_logp (N, T) (detached inside), rewards (N,); rows q cannot reach (q(y) = 0) get 0."""
    pi_logp, q_logp = pi_logp.detach(), q_logp.detach()
    reach = torch.isfinite(torch.where(mask, q_logp, 0.0)).all(1)  # (N,) q(y) > 0
    q_safe = torch.where(reach[:, None] & mask, q_logp, 0.0)
    q_y = torch.where(reach, q_safe.sum(1).exp(), 0.0)  # (N,)
    w = torch.ones_like(pi_logp)
    if correction is not None:
        kind, level = correction
        w = (
            tis_weights(pi_logp, q_safe, mask, cap, level)
            if kind == "tis"
            else mis_weights(pi_logp, q_safe, mask, band[0], band[1], level)
        )
    return torch.where(mask, (q_y * (rewards - baseline))[:, None] * w, 0.0)


def grad_of(model: GPT, pi_logp: torch.Tensor, coefs: torch.Tensor) -> torch.Tensor:
    """∇_θ Σ c·log π as one flat vector (the graph is kept for the next one)."""
    g = torch.autograd.grad(
        (coefs * pi_logp).sum(), list(model.parameters()), retain_graph=True, allow_unused=True
    )
    return torch.cat(
        [
            (x if x is not None else torch.zeros_like(p)).flatten()
            for x, p in zip(g, model.parameters())
        ]
    )


def versus(g: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    """(cosine, ‖g − truth‖/‖truth‖), in float64 (a float32 cosine can read 1.00001)."""
    g, truth = g.double(), truth.double()
    return F.cosine_similarity(g, truth, dim=0).item(), ((g - truth).norm() / truth.norm()).item()


def exact_rows(
    label: str, pi: GPT, q: tuple[GPT, float, float | None], tok: CharTokenizer, max_new: int
) -> list:
    """The rows of part 1 for one sampler: one per correction."""
    gen = enumerate_completions([(pi, 1.0, None), q], tok, PROMPT, max_new)
    mask, texts = gen.completion_mask, [tok.decode(r.tolist()) for r in gen.completion_ids]
    rewards = torch.tensor(
        score(
            make_reward("pizza", food.REWARDS), [PROMPT] * len(texts), texts, gen.finished.tolist()
        ),
        dtype=torch.float32,
    )
    pi_logp = token_logp(pi, gen)
    with torch.no_grad():
        q_logp = token_logp(q[0], gen, q[1], q[2])
    pi_y = pi_logp.detach().sum(1).exp()
    b = (pi_y * rewards).sum() / pi_y.sum()
    truth = grad_of(pi, pi_logp, torch.where(mask, (pi_y * (rewards - b))[:, None], 0.0))
    reach = torch.isfinite(torch.where(mask, q_logp, 0.0)).all(1)
    q_y = torch.where(reach, torch.where(mask & reach[:, None], q_logp, 0.0).sum(1).exp(), 0.0)
    kl = (q_y[reach] * (q_y[reach].log() - pi_y[reach].log())).sum().item()
    rows = []
    for name, corr in CORRECTIONS.items():
        cos, err = versus(
            grad_of(pi, pi_logp, estimator_coefs(pi_logp, q_logp, mask, rewards, b, corr)), truth
        )
        first = [
            label,
            name,
            f"{cos:.5f}",
            f"{err:.4f}",
            f"{kl:.4f}",
            f"{pi_y[~reach].sum().item():.4f}",
            f"{len(texts)}, π {pi_y.sum().item():.5f}",
        ]
        rows.append(first if name == "none" else ["", name, f"{cos:.5f}", f"{err:.4f}", "", "", ""])
    return rows


def bench_exact(out: Path, init: Path) -> str:
    """Part 1 (module docstring): the table for every sampler and correction."""
    pi, tok, _ = load_checkpoint(init)
    max_new = pi.cfg.block_size - 1 - len(tok.encode(PROMPT, bos=True))
    pi.eval()
    rows = [
        r
        for label, (t, p) in SAMPLERS.items()
        for r in exact_rows(label, pi, (pi, t, p), tok, max_new)
    ]
    stale = out / "mismatch" / f"grpo-{STALE_STEPS}-steps"
    _, error, _ = run_module(
        [
            "minigrpo.grpo",
            "--reward",
            "pizza",
            "--steps",
            str(STALE_STEPS),
            "--goal",
            "0",
            "--init",
            str(init),
            "--out",
            str(stale),
            "--quiet",
            "--overwrite",
            "--no-plot",
        ]
    )
    if error:
        raise RuntimeError(f"the stale policy's run failed: {error}")
    moved, _, _ = load_checkpoint(stale / "model.pt")
    rows += exact_rows(
        f"stale: π after {STALE_STEPS} steps, q before", moved.eval(), (pi, 1.0, None), tok, max_new
    )
    return table(
        f"mismatch, exact: E_q[Σ_t w_t·(r − E_π r)·∇log π] against ∇E_π[r], pizza, '{PROMPT}', "
        f"every completion with π or q >= {MIN_PROB:g} (cap 2, band [0.5, 2])",
        [
            "sampler q",
            "correction",
            "cosine to ∇E_π[r]",
            "‖g − g_true‖/‖g_true‖",
            "KL(q‖π), whole",
            "π mass q cannot reach",
            "completions, π mass",
        ],
        rows,
    )


def bench_runs(out: Path, init: Path, seeds: int, jobs: int) -> str:
    """Part 2 (module docstring): whole runs with each mismatch and correction."""
    configs = [("default (on-policy)", [])] + [
        (f"{m} + {c}", margs + cargs)
        for m, margs in RUN_MISMATCHES.items()
        for c, cargs in RUN_CORRECTIONS.items()
    ]
    runs = [
        (
            f"{label}|{s}",
            [
                "minigrpo.grpo",
                "--reward",
                "pizza",
                *args,
                "--init",
                str(init),
                "--seed",
                str(s),
                "--no-plot",
            ],
            out / "mismatch" / f"c{i}" / f"s{s}",
        )
        for i, (label, args) in enumerate(configs)
        for s in range(seeds)
    ]
    res = run_all(runs, jobs)
    rows = [seed_row(label, [res[f"{label}|{s}"] for s in range(seeds)]) for label, _ in configs]
    errors = [f"  {k}: {v['error']}" for k, v in res.items() if "error" in v]
    return table(
        "mismatch, runs: grpo --reward pizza with a mismatched sampler and each correction (cap "
        f"2, band [0.5, 2]), medians (min–max) over {seeds} seeds",
        ROW_HEADER,
        rows,
    ) + ("\nfailed:\n" + "\n".join(errors) if errors else "")


def bench_mismatch(out: Path, init: Path, seeds: int, jobs: int) -> str:
    return bench_exact(out, init) + "\n" + bench_runs(out, init, seeds, jobs)
