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

import torch

from minigrpo.lm.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.lm.optim import AdamW, clip_grad_norm
from minigrpo.lm.sampling import decode_completions, encode_prompts, generate
from minigrpo.objectives.advantages import equal_groups, group_advantages
from minigrpo.objectives.kl import exact as exact_kl
from minigrpo.objectives.losses import aggregate, clipped_surrogate, entropy, surrogate_stats
from toy_tasks import food
from toy_tasks.rewards import RewardError, make_reward
from toy_tasks.support import reward_table


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--reward", default="pizza", help="pizza, food:<food>, graded[:<food>], ...")
    p.add_argument("--person", default="ravin", choices=food.PEOPLE, help="whose prompt")
    p.add_argument("--init", default="runs/pretrain/model.pt", help="pretrained model (π_ref)")
    p.add_argument("--out", default=None, help="output folder (runs/grpo_one_file-<reward>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=30, help="RL steps (no stop rule: all of them)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    args.out = args.out or f"runs/grpo_one_file-{args.reward.replace(':', '-').replace(' ', '-')}"
    # the default recipe of minigrpo.grpo (its flags of the same names)
    args.prompts_per_step, args.group_size, args.max_new_tokens = 4, 16, 14  # P, G, T
    args.temperature, args.updates, args.clip, args.beta = 1.0, 2, 0.2, 0.3  # τ, μ, ε, β
    args.lr, args.warmup, args.lr_warmdown, args.grad_clip = 6e-4, 5, 0.2, 1.0
    return args


def seeded(seed: int, purpose: str, device="cpu") -> torch.Generator:
    """One random stream per purpose (as rl/loop.py's purpose_seed): sampling and prompt draws
    never share one, so changing one part of a run leaves the other's draws alone."""
    return torch.Generator(device).manual_seed(
        (seed * 1_000_003 + zlib.crc32(purpose.encode())) % 2**63
    )


def learning_rate(args, step: int) -> float:
    """lr · min(1, (step+1)/warmup) · min(1, (steps − step)/n), n = round(warmdown · steps)."""
    n = round(args.lr_warmdown * args.steps)
    return (
        args.lr
        * min(1.0, (step + 1) / args.warmup)
        * (min(1.0, (args.steps - step) / n) if n else 1.0)
    )


def train(args) -> list[dict]:
    torch.set_num_threads(1)  # a model this small runs fastest on one thread
    torch.manual_seed(args.seed)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    policy, tok, _ = load_checkpoint(args.init, device)
    reward = make_reward(args.reward, food.REWARDS, food.REWARD_HELP)  # reward(prompt, completion)
    prompts = [food.prompt(args.person)]  # RL trains on this one prompt
    table = reward_table(reward, prompts, food.support, food.OFF_SUPPORT_PROBES)  # exact E[r]
    ref = copy.deepcopy(policy).eval().requires_grad_(False)  # π_ref: the pretrained model, frozen
    baseline = food.rl_baseline(ref, tok, args)  # each person's exact food distribution, π_ref
    policy.train()
    gens = {
        "rollout": seeded(args.seed, "rollout", device),
        "prompts": seeded(args.seed, "prompts"),
    }
    opt = AdamW(policy.parameters(), lr=args.lr)
    G, T = args.group_size, args.max_new_tokens
    agg = lambda x, mask: aggregate(x, mask, "seq-mean-token-mean", T)  # mean per row, then rows
    token_mean = lambda x, mask: aggregate(x, mask, "token-mean").item()  # for the log

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "metrics.jsonl").open("w")
    ev = food.rl_evaluate(policy, tok, baseline, args, table)
    rows = [{"step": 0, **numbers(ev)}]
    log.write(json.dumps(rows[-1]) + "\n")
    for step in range(args.steps):
        opt.param_groups[0]["lr"] = learning_rate(args, step)

        # 1. sample G completions of each of the step's prompts from π_old, and score them
        draw = torch.randint(len(prompts), (args.prompts_per_step,), generator=gens["prompts"])
        texts = [prompts[i] for i in draw.tolist() for _ in range(G)]  # grouped: G rows a prompt
        ids, key_mask = encode_prompts(tok, texts, device)  # BOS + prompt, left-padded (N, P)
        policy.eval()
        gen = generate(policy, ids, key_mask, T, args.temperature, generator=gens["rollout"])
        completions = decode_completions(tok, gen)
        rewards = torch.tensor(
            [float(reward(p, c)) for p, c in zip(texts, completions)], device=device
        )
        with torch.no_grad():  # π_ref's next-token logits at every completion slot (N, T, V)
            _, ref_logits = generation_logprobs(ref, gen, args.temperature, return_logits=True)
        policy.train()
        mask = gen.completion_mask  # (N, T) bool: the tokens up to and including the first EOS

        # 2. group-normalised advantages: one per completion, 0 for a group of equal rewards
        by_group = rewards.view(-1, G)  # (P, G)
        adv = group_advantages(by_group, "group", unbiased=True, eps=1e-4).flatten()  # (N,)
        stats = {
            "equal_groups": equal_groups(by_group).float().mean().item(),
            "adv_mean": adv.mean().item(),
            "adv_std": adv.std().item(),
        }

        # 3. μ updates of the clipped surrogate against π_old, with the exact KL to π_ref
        updates, clip_stats = [], []
        for i in range(args.updates):
            logp, logits = generation_logprobs(policy, gen, args.temperature, return_logits=True)
            if i == 0:  # π_θ is π_old at the first update: its log-probs are π_old's
                old_logp = logp.detach()  # (N, T)
            policy_loss = agg(
                clipped_surrogate(logp, old_logp, adv[:, None], mask, args.clip), mask
            )
            kl = exact_kl(logits, ref_logits)  # KL(π_θ‖π_ref) at each position (N, T)
            loss = policy_loss + args.beta * agg(kl, mask)
            if i > 0:  # the first update has ρ ≡ 1: nothing to clip yet
                s = surrogate_stats(logp, old_logp, adv[:, None], mask, args.clip)
                clip_stats.append({k: v.item() for k, v in s.items()})
            opt.zero_grad()
            loss.backward()
            grad_norm = clip_grad_norm(opt.params, args.grad_clip)
            opt.step()
            updates.append(
                {
                    "policy_loss": policy_loss.item(),
                    "loss": loss.item(),
                    "kl_exact": token_mean(kl.detach(), mask),
                    "entropy": token_mean(entropy(logits.detach()), mask),
                    "grad_norm": grad_norm.item(),
                }
            )
        stats |= mean_of(updates) | mean_of(clip_stats)

        # 4. exact evaluation: every figure from the world's declared distribution, no sampling
        ev = food.rl_evaluate(policy, tok, baseline, args, table)
        rows.append(
            {
                "step": step + 1,
                "reward_mean": rewards.mean().item(),
                "reward_std": rewards.std().item(),
                **stats,
                "completion_len": mask.sum(1).float().mean().item(),
                **numbers(ev),
            }
        )
        print(
            f"step {step + 1:3d}/{args.steps} | reward {rows[-1]['reward_mean']:.3f} | target "
            f"{ev['target_rate']:.3f} | drift {ev['worst_drift']:.3f} | malformed "
            f"{ev['malformed']:.4f} | kl {stats['kl_exact']:.4f}",
            flush=True,
        )
        log.write(json.dumps(rows[-1]) + "\n")
        log.flush()
    log.close()
    save_checkpoint(out / "model.pt", policy, tok, "food", args.steps)
    print(f"wrote {out}/ (metrics.jsonl, model.pt); compare the drift with python -m minigrpo.grpo")
    return rows


def numbers(ev: dict) -> dict:
    """The numeric figures of an exact evaluation (its per-person tables aside); strict JSON has
    no infinity: a figure that is not finite (an implied β of a run still at π_ref) is null."""
    return {
        k: v if math.isfinite(v) else None
        for k, v in ev.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def mean_of(per_update: list[dict]) -> dict:
    """A step's figures from its updates': the mean of each, the max of the *_max ones."""
    keys = dict.fromkeys(k for d in per_update for k in d)
    return {
        k: (max if k.endswith("_max") else lambda v: sum(v) / len(v))([d[k] for d in per_update])
        for k in keys
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        train(args)
    except CheckpointError as e:
        sys.exit(
            print(f"error: --init: {e} (python -m minigrpo.pretrain makes one)", file=sys.stderr)
            or 2
        )
    except (RewardError, ValueError) as e:  # a reward or a --person the world does not know
        sys.exit(print(f"error: {e}", file=sys.stderr) or 2)


if __name__ == "__main__":
    main(sys.argv[1:])
