"""GRPO in one file: the default recipe of `python -m minigrpo.grpo`, top to bottom, no tables.

    python -m minigrpo.pretrain                          # once: runs/pretrain/model.pt
    python -m minigrpo.grpo_one_file --reward pizza      # -> runs/grpo_one_file-pizza/

Each step (DeepSeekMath, arXiv 2402.03300, with this project's measured departures):
  1. sample    draw P = 4 prompts; sample G = 16 completions of each from π_old = π_θ now
               (the KV-cache sampler), score each with the reward: r (P·G,)
  2. advantage Â_i = (r_i − mean(r_group)) / (std(r_group) + 1e-4), Bessel std, one per completion
  3. update    μ = 2 times: L = agg(−min(ρ_t·Â, clip(ρ_t, 1 − ε, 1 + ε)·Â)) + β·agg(KL_t),
               ρ_t = π_θ/π_old per token (ε 0.2), KL_t = KL(π_θ‖π_ref) over the whole vocabulary at
               each position (β 0.3), agg = the mean over each completion's tokens, then over
               completions (the paper's eq. 3); AdamW (lr 6e-4, a 5-step warm-up and a linear
               warm-down over the last 20 % of --steps), gradient norm clipped to 1
  4. evaluate  exactly, from the world's declared truth: P(target), other people's drift, malformed
With μ = 1 the ratio is 1 at the only update and the clip never acts; the second update is a real
PPO-style step against π_old. The departures (μ = 2, the exact KL, β 0.3) are measured in
docs/algorithms.md and docs/experiments.md.

What `python -m minigrpo.grpo` adds, and why (compare this file's drift with its drift):
  preservation  RL on ravin's prompt moves the whole shared model: other people's food drifts
                (TV 0.46–0.93 unanchored). The real trainer adds a KL to π_ref on their prompts
                (rl/preserve.py) and holds them within 0.03.
  trust region  a step whose KL(π_old‖π_new) exceeds its bar is halved (rl/trust_region.py).
  stop rule     stops once the target is reached and stable, on a plateau, or at --steps.
  the rest      22 variants (variants/), resume, checkpoints, Ctrl-C, plots, other worlds.
Run with `--no-preserve --trust-region 0 --trust-region-anchor 0 --goal 0 --plateau 0`, grpo
logs the same numbers as this file (tests/test_grpo_one_file.py holds them equal).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import torch

from minigrpo.lm.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.lm.optim import AdamW, clip_grad_norm
from minigrpo.lm.sampling import encode_prompts, generate, read_completions
from minigrpo.objectives.advantages import equal_groups, group_advantages
from minigrpo.objectives.kl import exact
from minigrpo.objectives.losses import aggregate, clipped_surrogate, entropy, surrogate_stats
from toy_tasks import food
from toy_tasks.rewards import RewardError, make_reward, score
from toy_tasks.support import reward_table

# ---- the recipe: minigrpo.grpo's defaults ----
PERSON = "ravin"  # whose prompt RL trains on: "ravin likes "
G, PROMPTS_PER_STEP = 16, 4  # completions per prompt, prompts per step: N = 64 rows
MAX_NEW_TOKENS, TEMPERATURE = 14, 1.0
UPDATES = 2  # μ: updates per rollout (the first has ρ ≡ 1; the second is a real clipped step)
CLIP = 0.2  # ε: the ratio is clipped to [1 − ε, 1 + ε]
BETA = 0.3  # β: the weight of the exact KL to π_ref in the loss
ADV_EPS = 1e-4  # ε added to the group's std
LR, WARMUP, WARMDOWN, GRAD_CLIP = 6e-4, 5, 0.2, 1.0  # warm-up steps; the share of --steps to fall


def one_line_error(message: str):
    """A bad value: one line on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        "python -m minigrpo.grpo_one_file", description=__doc__.split("\n")[0]
    )
    p.error = one_line_error  # argparse's own error prints the usage too
    p.add_argument("--reward", default="pizza", help="pizza (default), food:<food>, graded, ...")
    p.add_argument("--init", default="runs/pretrain/model.pt", help="pretrained model, π_ref too")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--steps", type=int, default=30, help="RL steps, all of them run (default 30)")
    p.add_argument(
        "--out", default=None, help="output folder (default runs/grpo_one_file-<reward>)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    try:
        args.reward_fn = make_reward(args.reward, food.REWARDS, food.REWARD_HELP)
    except RewardError as e:
        p.error(str(e))
    slug = "".join(c if c.isalnum() else "-" for c in args.reward).strip("-")
    args.out = Path(args.out or f"runs/grpo_one_file-{slug}")
    if (args.out / "metrics.jsonl").exists() and not args.overwrite:
        p.error(f"--out {args.out} holds a run already: add --overwrite, or another --out")
    return args


def main(argv=None) -> None:
    args = parse(argv)
    # ---- set-up: seeds, models, generators (the order minigrpo.grpo's run uses) ----
    torch.set_num_threads(1)  # a model this small runs fastest on one thread
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        policy, tok, meta = load_checkpoint(args.init, device)
    except CheckpointError as e:
        first = "" if Path(args.init).exists() else " (run `python -m minigrpo.pretrain` first)"
        one_line_error(f"--init: {e}{first}")
    if meta["task"] != "food":
        one_line_error(f"--init {args.init!r} was pretrained on task {meta['task']!r}, not food")
    ref = copy.deepcopy(policy).eval().requires_grad_(False)  # π_ref: the pretrained model, frozen
    prompts = [food.prompt(PERSON)]  # ["ravin likes "]
    cfg = SimpleNamespace(person=PERSON, beta=BETA)  # what the exact evaluation reads
    table = reward_table(args.reward_fn, prompts, food.support, food.OFF_SUPPORT_PROBES)
    baseline = food.rl_baseline(ref, tok, cfg)  # every person's exact food distribution, at start
    policy.train()
    # one generator per purpose, seeded with (seed·1_000_003 + crc32(purpose)) mod 2^63: the
    # rollout's samples on the device, the prompt draws on the CPU
    gens = {
        purpose: torch.Generator(where).manual_seed(
            (args.seed * 1_000_003 + zlib.crc32(purpose.encode())) % 2**63
        )
        for purpose, where in (("rollout", device), ("prompts", "cpu"))
    }
    opt = AdamW(policy.parameters(), lr=LR)
    n_warmdown = round(WARMDOWN * args.steps)  # --steps sets the warm-down: 30 steps -> 6
    # the GRPO paper's eq. 3: the mean over each completion's valid tokens, then over completions
    agg = lambda x, m: aggregate(x, m, "seq-mean-token-mean")
    token_mean = lambda x, m: aggregate(x, m, "token-mean").item()  # the figures the log shows
    args.out.mkdir(parents=True, exist_ok=True)
    metrics = open(args.out / "metrics.jsonl", "w")

    def log(row: dict) -> None:  # strict JSON: a non-finite number is null
        row = {k: v if math.isfinite(v) else None for k, v in row.items()}
        metrics.write(json.dumps(row) + "\n")
        metrics.flush()

    def evaluation() -> dict:  # exact: P(target), drift, malformed from teacher-forced forwards
        ev = food.rl_evaluate(policy, tok, baseline, cfg, table)
        return {k: v for k, v in ev.items() if type(v) in (int, float)}

    print(
        f"grpo_one_file | reward {args.reward} | G={G} x {PROMPTS_PER_STEP} prompts | "
        f"{args.steps} steps | from {args.init}"
    )
    log({"step": 0, **evaluation()})
    for step in range(args.steps):
        # lr_t = LR·min(1, (t + 1)/WARMUP)·min(1, (steps − t)/n), n = round(WARMDOWN·steps): a
        # linear warm-up, then a linear fall to 0 over the last n steps (n = 0: none)
        lr = LR * min(1.0, (step + 1) / WARMUP)
        opt.param_groups[0]["lr"] = (
            lr * min(1.0, (args.steps - step) / n_warmdown) if n_warmdown else lr
        )

        # ---- 1. rollout: G completions of each drawn prompt from π_old, scored ----
        idx = torch.randint(len(prompts), (PROMPTS_PER_STEP,), generator=gens["prompts"])
        rows = [prompts[i] for i in idx.tolist() for _ in range(G)]  # (N,) grouped by prompt
        ids, key_mask = encode_prompts(tok, rows, device)  # (N, P) BOS + prompt, left-padded
        gen = generate(
            policy, ids, key_mask, MAX_NEW_TOKENS, TEMPERATURE, generator=gens["rollout"]
        )
        completions, finished = read_completions(tok, [gen])[0]
        r = torch.tensor(score(args.reward_fn, rows, completions, finished), device=device)  # (N,)
        mask = gen.completion_mask  # (N, T) bool: tokens up to and including the first EOS
        with torch.no_grad():  # π_ref's next-token logits at every completion slot: (N, T, V)
            _, ref_logits = generation_logprobs(ref, gen, TEMPERATURE, return_logits=True)

        # ---- 2. advantages: Â_i = (r_i − mean(r_group)) / (std(r_group) + ε), 0 for equal groups
        by_group = r.view(-1, G)  # (prompts, G)
        advantages = group_advantages(by_group, "group", unbiased=True, eps=ADV_EPS).flatten()

        # ---- 3. μ updates: the clipped surrogate against π_old, plus β·KL(π_θ‖π_ref) ----
        per_update, clipping = [], []
        for update in range(UPDATES):
            logprobs, logits = generation_logprobs(policy, gen, TEMPERATURE, return_logits=True)
            if update == 0:  # π_θ is π_old at the first update: its log-probs are π_old's
                old_logprobs = logprobs.detach()  # (N, T)
            # −min(ρ·Â, clip(ρ, 1 − ε, 1 + ε)·Â) per token, ρ = π_θ/π_old: (N, T)
            pg_loss = agg(
                clipped_surrogate(logprobs, old_logprobs, advantages[:, None], mask, CLIP), mask
            )
            kl = exact(logits, ref_logits)  # KL(π_θ‖π_ref) over the whole vocabulary: (N, T)
            loss = pg_loss + BETA * agg(kl, mask)
            if update > 0:  # the first update has ρ ≡ 1: nothing to clip yet
                s = surrogate_stats(logprobs, old_logprobs, advantages[:, None], mask, CLIP)
                clipping.append({k: v.item() for k, v in s.items()})
            opt.zero_grad()
            loss.backward()
            grad_norm = clip_grad_norm(opt.params, GRAD_CLIP)  # ‖g‖ before the clip
            opt.step()
            per_update.append({
                "policy_loss": pg_loss.item(),
                "loss": loss.item(),
                "kl_exact": token_mean(kl.detach(), mask),  # per token
                "entropy": token_mean(entropy(logits.detach()), mask),
                "grad_norm": grad_norm.item(),
            })  # fmt: skip

        # ---- 4. the step's row: the rollout's figures, means over the updates (the ratio's max:
        # its max), and the exact evaluation: every figure from the world's declared truth
        row = {"step": step + 1, "reward_mean": r.mean().item(), "reward_std": r.std().item()}
        row |= {
            "equal_groups": equal_groups(by_group).float().mean().item(),
            "adv_mean": advantages.mean().item(),
            "adv_std": advantages.std().item(),
        }
        for figures in (per_update, clipping):
            for k in figures[0]:
                v = [d[k] for d in figures]
                row[k] = max(v) if k.endswith("_max") else sum(v) / len(v)
        row |= {"completion_len": mask.sum(1).float().mean().item(), **evaluation()}
        log(row)
        print(
            f"step {step + 1:{len(str(args.steps))}d}/{args.steps} | reward "
            f"{row['reward_mean']:.3f} | target {row['target_rate']:.3f} | drift "
            f"{row['worst_drift']:.3f} | malformed {row['malformed']:.4f} | kl "
            f"{row['kl_exact']:.4f}"
        )
    metrics.close()
    save_checkpoint(args.out / "model.pt", policy, tok, task="food", step=args.steps)
    print(
        f"wrote {args.out}/ (metrics.jsonl, model.pt); other people drift: python -m "
        f"minigrpo.sample --checkpoint {args.out}/model.pt --prompt 'alice likes ' --num 1000"
    )


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except RewardError as e:  # a reward that raised or gave a non-finite value: the rows are kept
        one_line_error(str(e))
    except KeyboardInterrupt:  # every finished step's row is in metrics.jsonl already
        raise SystemExit(130) from None
