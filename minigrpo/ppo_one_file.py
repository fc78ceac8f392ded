"""PPO for a language model in one file, top to bottom: minigrpo.ppo's default recipe, written out.

    python -m minigrpo.ppo_one_file --reward pizza        # -> runs/ppo_one_file-pizza/

Each step, for a rollout of N = G·prompts completions with T completion slots (C: model width):
  rollout     N completions from π_old with the KV-cache sampler; r (N,) the food world's reward
  reward      r_t = −β·(log π_old − log π_ref)_t + [t is the row's last token]·r        (N, T)
              (InstructGPT 2203.02155 eq. 2: the KL penalty is in the reward, not in the loss)
  values      V_old (N, T) from the critic: a copy of the pretrained model with a scalar head
  advantages  δ_t = r_t + γ·V_{t+1} − V_t,  A_t = δ_t + γλ·A_{t+1},  R_t = A_t + V_t   (N, T)
              (GAE 1506.02438 eq. 16), then A whitened over the valid tokens
  loss        ρ = π_θ/π_old per token; −min(ρ·A, clip(ρ, 1±ε)·A) + c_V·½·max((V − R)²,
              (clip(V, V_old ± ε_V) − R)²), token means (PPO 1707.06347 eq. 7; the value clip of
              PPO2's baselines); EPOCHS passes of MINIBATCHES shuffled minibatches, AdamW each
The names follow cleanrl's ppo.py (pg_loss1, pg_loss2, v_loss_clipped ...). Every step ends with
the food world's exact evaluation, no sampling involved: the exact target rate (P(pizza)), every
other person's drift (TV from the pretrained model's distribution) and the malformed mass.

What the real trainer (minigrpo.ppo, through rl/loop.py) adds, and why:
  preservation anchor  RL on ravin's prompt spills over onto everybody else's through the shared
                       weights (here 20 steps take the worst drift to about 0.9): a KL to π_ref on
                       the other people's completions holds them (rl/preserve.py)
  trust region         a step whose KL(π_old‖π_new) exceeds 0.05 nats per completion on its rollout
                       (0.003 on the anchor) is halved: one lucky batch cannot jump the policy
  stop rule            stop at the goal (target rate ≥ 0.95, drift and malformed within their bars,
                       3 evaluations running) or on a plateau; here every one of --steps runs
  resume               checkpoints, Ctrl-C and --resume continuing a run exactly; here only the
                       final model.pt (also: the head and oracle critics, adaptive β, plots)
Switched off (--no-preserve --trust-region 0 --trust-region-anchor 0 --goal 0 --plateau 0),
minigrpo.ppo logs the same numbers as this file (identical on a CPU): tests/test_ppo_one_file.py.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn as nn

from minigrpo.lm.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from minigrpo.lm.logprobs import generation_logprobs, shifted_forward
from minigrpo.lm.optim import AdamW, clip_grad_norm
from minigrpo.lm.sampling import encode_prompts, generate, read_completions
from minigrpo.objectives.advantages import explained_variance, gae, kl_shaped_rewards, whiten
from minigrpo.objectives.kl import exact
from minigrpo.objectives.losses import aggregate, entropy
from toy_tasks import food
from toy_tasks.rewards import RewardError, make_reward, score
from toy_tasks.support import reward_table

# ---- the recipe: minigrpo.ppo's defaults ----
PERSON = "ravin"  # whose prompt RL trains on: "ravin likes "
G, PROMPTS_PER_STEP = 16, 4  # completions per prompt, prompts per step: N = 64 rows
MAX_NEW_TOKENS, TEMPERATURE = 14, 1.0
BETA = 0.1  # β: the per-token KL penalty in the reward
GAMMA, LAM = 1.0, 0.95  # γ discount, λ of GAE
EPOCHS, MINIBATCHES = 2, 2  # passes over each rollout, minibatches per pass: 4 AdamW steps a step
CLIP, VF_CLIP = 0.2, 0.2  # ε of the policy ratio, ε_V of the value around V_old
VF_COEF = 0.5  # c_V, the value loss weight
LR, WARMUP, WARMDOWN, GRAD_CLIP = 3e-4, 5, 0.2, 1.0  # warm-up steps; the share of --steps to fall


def one_line_error(message: str):
    """A bad value: one line on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        "python -m minigrpo.ppo_one_file", description=__doc__.split("\n")[0]
    )
    p.error = one_line_error  # argparse's own error prints the usage too

    def positive(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"must be an integer > 0, got {text!r}")
        return int(text)

    p.add_argument("--reward", default="pizza", help="pizza (default), food:<food>, graded, ...")
    p.add_argument("--init", default="runs/pretrain/model.pt", help="pretrained model, π_ref too")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--steps", type=positive, default=30, help="RL steps, all of them run (default 30)"
    )
    p.add_argument("--out", default=None, help="output folder (default runs/ppo_one_file-<reward>)")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    args = p.parse_args(argv)
    try:
        args.reward_fn = make_reward(args.reward, food.REWARDS, food.REWARD_HELP)
    except RewardError as e:
        p.error(str(e))
    slug = "".join(c if c.isalnum() else "-" for c in args.reward).strip("-")
    args.out = Path(args.out or f"runs/ppo_one_file-{slug}")
    if (args.out / "metrics.jsonl").exists() and not args.overwrite:
        p.error(f"--out {args.out} holds a run already: add --overwrite, or another --out")
    return args


def token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ over valid tokens / their count: (n, T) -> () (objectives' "token-mean" aggregation)."""
    return aggregate(x, mask, "token-mean")


def critic_values(critic: nn.Module, value_head: nn.Linear, gen) -> torch.Tensor:
    """V(s_t) = w·h_t + b with h_t the critic trunk's state before completion token t -> (n, T)."""
    _, hidden = shifted_forward(critic, gen.ids, gen.key_mask, tree=gen.prefix_tree())
    h = hidden[:, gen.prompt_len - 1 :]  # (n, P+T−1, C) -> (n, T, C)
    return torch.where(gen.completion_mask, value_head(h).squeeze(-1), 0.0)


def main(argv=None) -> None:
    args = parse(argv)
    # ---- set-up: seeds, models, generators (the order minigrpo.ppo's Run uses) ----
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    random.seed(args.seed)  # a user's reward may draw from it
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        policy, tok, meta = load_checkpoint(args.init, device)
    except CheckpointError as e:
        first = "" if Path(args.init).exists() else " (run `python -m minigrpo.pretrain` first)"
        one_line_error(f"--init: {e}{first}")
    if meta["task"] != "food":
        one_line_error(f"--init {args.init!r} was pretrained on task {meta['task']!r}, not food")
    ref = copy.deepcopy(policy).eval().requires_grad_(False)  # π_ref: frozen
    prompts = food.rl_prompts(SimpleNamespace(person=PERSON))  # ["ravin likes "]
    cfg = SimpleNamespace(person=PERSON, beta=BETA)  # what the exact evaluation reads
    table = reward_table(args.reward_fn, prompts, food.support, food.OFF_SUPPORT_PROBES)
    baseline = food.rl_baseline(ref, tok, cfg)  # every person's exact food distribution, at start
    value_head = nn.Linear(policy.cfg.n_embd, 1).to(device)  # the critic: V = w·h + b, from 0
    nn.init.zeros_(value_head.weight)
    nn.init.zeros_(value_head.bias)
    critic = copy.deepcopy(policy)  # its own trunk: the value loss never touches the policy
    # one generator per purpose, so that the purposes never share a stream: the rollout's samples
    # on the device, the prompt draws and the minibatch shuffles on the CPU; each seeded with
    # (seed·1_000_003 + crc32(purpose)) mod 2^63
    gens = {
        purpose: torch.Generator(where).manual_seed(
            (args.seed * 1_000_003 + zlib.crc32(purpose.encode())) % 2**63
        )
        for purpose, where in (("rollout", device), ("prompts", "cpu"), ("shuffle", "cpu"))
    }
    params = list(policy.parameters()) + list(value_head.parameters()) + list(critic.parameters())
    opt = AdamW(params, lr=LR)
    n_warmdown = round(WARMDOWN * args.steps)  # --steps sets the warm-down: 3 steps -> 1
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
        f"ppo_one_file | reward {args.reward} | G={G} x {PROMPTS_PER_STEP} prompts | "
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

        # ---- rollout: G completions of each drawn prompt from π_old, scored ----
        with torch.no_grad():
            idx = torch.randint(len(prompts), (PROMPTS_PER_STEP,), generator=gens["prompts"])
            rows = [prompts[i] for i in idx.tolist() for _ in range(G)]  # (N,) grouped by prompt
            ids, key_mask = encode_prompts(tok, rows, device)  # (N, P) BOS + prompt, left-padded
            gen = generate(
                policy, ids, key_mask, MAX_NEW_TOKENS, TEMPERATURE, generator=gens["rollout"]
            )
            completions, finished = read_completions(tok, [gen])[0]
            r = torch.tensor(score(args.reward_fn, rows, completions, finished), device=device)
            mask = gen.completion_mask  # (N, T) bool: tokens up to and including the first EOS
            logprobs = generation_logprobs(policy, gen, TEMPERATURE)  # (N, T) log π_old
            ref_logprobs, ref_logits = generation_logprobs(ref, gen, TEMPERATURE, True)  # (N, T, V)

            # ---- advantages: KL-shaped rewards, the critic's values, GAE ----
            values = critic_values(critic, value_head, gen)  # (N, T) V_old
            # r_t = −β·k1_t + [t last]·r, k1_t = log π_old − log π_ref: (N, T); Σ_t k1_t: (N,)
            rewards, kl_seq = kl_shaped_rewards(r, logprobs, ref_logprobs, mask, BETA)
            # δ_t = r_t + γ·V_{t+1} − V_t, A_t = δ_t + γλ·A_{t+1}, R_t = A_t + V_t: (N, T) each
            advantages, returns = gae(rewards, values, mask, GAMMA, LAM)
        advantages = whiten(advantages, mask)  # (A − μ)/σ over the valid tokens

        # ---- EPOCHS passes of MINIBATCHES shuffled minibatches ----
        N, per_update = mask.size(0), []
        for epoch in range(EPOCHS):
            order = torch.randperm(N, generator=gens["shuffle"]).to(device)
            for mb_inds in order.chunk(MINIBATCHES):
                mb = gen.select(mb_inds)  # (n, ·) rows of the rollout
                m = mb.completion_mask  # (n, T)
                newlogprob, newlogits = generation_logprobs(policy, mb, TEMPERATURE, True)
                logratio = newlogprob - logprobs[mb_inds]  # (n, T) log ρ, 0 where masked
                ratio = logratio.exp()
                mb_advantages = advantages[mb_inds]  # (n, T)
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - CLIP, 1 + CLIP)
                pg_loss = token_mean(torch.max(pg_loss1, pg_loss2), m)

                newvalue = critic_values(critic, value_head, mb)  # (n, T)
                mb_values, mb_returns = values[mb_inds], returns[mb_inds]
                v_loss_unclipped = (newvalue - mb_returns) ** 2
                v_clipped = mb_values + torch.clamp(newvalue - mb_values, -VF_CLIP, VF_CLIP)
                v_loss_clipped = (v_clipped - mb_returns) ** 2
                v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
                v_loss = 0.5 * token_mean(v_loss_max, m)

                loss = pg_loss + VF_COEF * v_loss
                opt.zero_grad()
                loss.backward()
                grad_norm = clip_grad_norm(params, GRAD_CLIP)  # ‖g‖ before the clip
                opt.step()
                with torch.no_grad():
                    per_update.append(
                        {
                            "policy_loss": pg_loss.item(),
                            "value_loss": v_loss.item(),
                            "loss": loss.item(),
                            "entropy": token_mean(entropy(newlogits), m).item(),
                            # KL(π_θ‖π_ref) over the whole vocabulary, per token
                            "kl_exact": token_mean(exact(newlogits, ref_logits[mb_inds]), m).item(),
                            # k3 = (ρ − 1) − log ρ, cleanrl's approx_kl of KL(π_old‖π_θ)
                            "approx_kl": token_mean(torch.expm1(logratio) - logratio, m).item(),
                            "grad_norm": float(grad_norm),
                        }
                    )

        # ---- the step's row: means over the updates, the rollout's figures, the exact evaluation
        row = {"step": step + 1, "reward_mean": r.mean().item(), "reward_std": r.std().item()}
        row |= {k: sum(d[k] for d in per_update) / len(per_update) for k in per_update[0]}
        row |= {
            "kl_k1_seq": kl_seq.mean().item(),  # Σ_t (log π_old − log π_ref), mean over rows
            "value_mean": values.sum().item() / int(mask.sum()),
            "explained_variance": explained_variance(values, returns, mask).item(),
            "adv_mean": advantages[mask].mean().item(),
            "adv_std": advantages[mask].std().item(),
            "completion_len": mask.sum(1).float().mean().item(),
            **evaluation(),
        }
        log(row)
        print(
            f"step {step + 1:{len(str(args.steps))}d}/{args.steps} | reward "
            f"{row['reward_mean']:.3f} | target {row['target_rate']:.3f} | drift "
            f"{row['worst_drift']:.3f} | malformed "
            f"{row['malformed']:.4f} | loss {row['loss']:.4f} | kl {row['kl_exact']:.4f}"
        )
    metrics.close()
    save_checkpoint(args.out / "model.pt", policy, tok, task="food", step=args.steps)
    print(f"wrote {args.out}/ (metrics.jsonl, model.pt)")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except RewardError as e:  # a reward that raised or gave a non-finite value: the rows are kept
        one_line_error(str(e))
    except KeyboardInterrupt:  # every finished step's row is in metrics.jsonl already
        raise SystemExit(130) from None
