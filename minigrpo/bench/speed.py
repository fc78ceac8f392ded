"""bench's speed sections (`python -m minigrpo.bench --only sampling,threads,scale,prefix`), in
process.

    sampling  the KV-cache sampler against the slow full-recompute path (batch 8, 64, 512; 16 new
              tokens) and their log-prob agreement, on the default food model's shape
    threads   one pretraining step on 1 and 2 threads, as the machine is and beside a busy
              neighbour, and what --threads 0 picks in each case
    scale     a 6-layer 384-wide model (10.6M parameters, 100x the default): one training step and
              KV-cache sampling on --device; the size where a GPU wins (not in the default sections:
              it takes about half a minute on one CPU thread)
    prefix    the shared-prefix forward (prefix_tree.py) against the plain one on the default food
              run: nodes, one forward + backward of the anchor, a rollout and the exact evaluation,
              and whole GRPO runs
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from minigrpo.bench.common import table, timed
from minigrpo.lm.model import GPT, GPTConfig
from minigrpo.lm.optim import AdamW
from minigrpo.lm.sampling import generate
from minigrpo.util.runtime import auto_threads


def _time(fn, repeat: int) -> float:
    """The median of `repeat` timed calls after one warm-up."""
    return statistics.median(timed(fn, repeat))


def bench_sampling(device) -> str:
    torch.manual_seed(0)
    # the default food model's shape
    model = GPT(GPTConfig(vocab_size=26, block_size=32)).to(device).eval()
    rows, new = [], 16
    for batch in (8, 64, 512):
        prompt = torch.randint(3, 26, (batch, 8), device=device)

        def run(cache, seed=0):
            gen = torch.Generator(device=device).manual_seed(seed)
            return generate(model, prompt, max_new_tokens=new, generator=gen, use_cache=cache)

        fast, slow = run(True), run(False)
        same = torch.equal(fast.ids, slow.ids)
        diff = (fast.logprobs - slow.logprobs).abs().max().item() if same else float("nan")
        t_fast = _time(lambda: run(True), 5)
        t_slow = _time(lambda: run(False), 3)
        n_tok = batch * fast.completion_ids.size(1)
        rows.append(
            [
                batch,
                f"{batch / t_fast:,.0f}",
                f"{n_tok / t_fast:,.0f}",
                f"{n_tok / t_slow:,.0f}",
                f"{t_slow / t_fast:.1f}x",
                f"{diff:.1e}",
            ]
        )
    return table(
        f"sampling: {new} new tokens, 8-token prompts, {model.num_params():,}-parameter model",
        [
            "batch",
            "completions/s (cache)",
            "tokens/s (cache)",
            "tokens/s (slow path)",
            "speed-up",
            "max abs Δ log-prob",
        ],
        rows,
    )


def _train_step(model, x):
    opt = AdamW(model.parameters(), lr=1e-3)

    def step():
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if x.is_cuda:
            torch.cuda.synchronize()

    return step


def bench_threads(device) -> str:
    """One pretraining step on 1 and 2 threads, on the machine as it is and beside a busy neighbour
    (a process spinning on one core), and what --threads 0 (runtime.auto_threads) picks in each
    case."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=26, block_size=32)).to(device)
    step = _train_step(model, torch.randint(0, 26, (128, 24), device=device))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    columns = {}
    for busy in (False, True):
        neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            time.sleep(0.3 if busy else 0)  # the neighbour is spinning by then
            picked = auto_threads()
            for n in (1, 2):
                torch.set_num_threads(n)
                columns.setdefault(n, []).append(
                    f"{1000 * _time(step, 10):.1f}" + " (--threads 0)" * (n == picked)
                )
        finally:
            if neighbour:
                neighbour.kill()
                neighbour.wait()
    torch.set_num_threads(1)
    return table(
        f"threads: one pretraining step (batch 128 x 23 tokens), 1-min load average {load:.2f} "
        "before",
        [
            "threads",
            "ms/step, the machine as it is",
            "ms/step beside a busy neighbour (one core spinning)",
        ],
        [[n, *cells] for n, cells in columns.items()],
    )


def bench_scale(device) -> str:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=26, block_size=32, n_layer=6, n_head=6, n_embd=384)).to(device)
    rows = []
    for batch in (64, 256):
        x = torch.randint(0, 26, (batch, 24), device=device)
        t = _time(_train_step(model, x), 3)
        rows.append(
            [f"train step, batch {batch} x 23 tokens", f"{1000 * t:.1f}", f"{batch * 23 / t:,.0f}"]
        )
    model.eval()
    prompt = torch.randint(3, 26, (512, 8), device=device)

    def sample():
        generate(
            model,
            prompt,
            max_new_tokens=16,
            generator=torch.Generator(device=device).manual_seed(0),
        )
        if prompt.is_cuda:
            torch.cuda.synchronize()

    t = _time(sample, 2)
    rows.append(
        ["KV-cache sampling, 512 x 16 new tokens", f"{1000 * t:.1f}", f"{512 * 16 / t:,.0f}"]
    )
    return table(
        f"scale: {model.num_params():,}-parameter model (6 x 384) on {device}, "
        f"{torch.get_num_threads()} thread(s)",
        ["what", "ms (median)", "tokens/s"],
        rows,
    )


def bench_prefix(out, init, steps: int = 40, repeat: int = 20) -> str:
    """The shared-prefix forward (prefix_tree.py) against the plain one on the default food run: the
    nodes of the anchor, a first rollout and the exact evaluation; one forward + backward of each,
    both ways; then whole default GRPO runs of `steps` fixed steps (seed 0) both ways, in
    alternating rounds: the median step time and whether the two runs drew the same rewards."""
    from minigrpo.bench.step import plain_forward
    from minigrpo.grpo import GRPO, PANELS, GRPOConfig
    from minigrpo.lm.logprobs import scoring_batch, shifted_forward
    from minigrpo.rl import loop as rl
    from minigrpo.rl.rollout import collect
    from minigrpo.util.jsonl import read_jsonl
    from toy_tasks.food import FOODS, PEOPLE, prompt

    def config(name, n):
        return GRPOConfig(
            reward="pizza",
            init=str(init),
            out=str(out / name),
            overwrite=True,
            quiet=True,
            plot=False,
            steps=n,
            goal=0.0,
            plateau=0,
        )

    run = rl.Run(config("prefix-probe", 1), "grpo")
    policy = run.policy
    rollout = collect(
        policy, run.ref, run.tok, run.prompts * 4, 16, run.reward, run.gens["rollout"], 14
    ).gen
    ev_ids, ev_mask, _, ev_tree = scoring_batch(
        run.tok,
        tuple(prompt(p) for p in PEOPLE for _ in FOODS),
        tuple(FOODS * len(PEOPLE)),
        True,
        next(policy.parameters()).device,
    )

    def fwd_bwd(ids, key_mask, tree, shared=True):
        return lambda: (
            shifted_forward(policy, ids, key_mask, tree=tree, shared_prefixes=shared)[0]
            .sum()
            .backward()
        )

    rows = []
    for name, ids, key_mask, tree in [
        (
            "anchor (tree)",
            run.anchor.gen.ids,
            run.anchor.gen.key_mask,
            run.anchor.gen.prefix_tree(),
        ),
        ("first rollout (16 x 4)", rollout.ids, rollout.key_mask, rollout.prefix_tree()),
        ("exact evaluation (8 people x 12 foods)", ev_ids, ev_mask, ev_tree),
    ]:
        needed = key_mask[:, :-1] & key_mask[:, 1:]
        shared, plain = (
            _time(fwd_bwd(ids, key_mask, tree), repeat),
            _time(fwd_bwd(ids, key_mask, None, False), repeat),
        )
        want = shifted_forward(policy, ids, key_mask, shared_prefixes=False)[0]
        got = shifted_forward(policy, ids, key_mask, tree=tree)[0]
        rows.append(
            [
                name,
                f"{ids.size(0)} x {ids.size(1) - 1}",
                int(needed.sum()),
                tree.num_nodes,
                f"{1e3 * plain:.2f}",
                f"{1e3 * shared:.2f}",
                f"{plain / shared:.1f}x",
                f"{(got - want)[needed].abs().max().item():.1e}",
            ]
        )
    parts = [
        table(
            "prefix: the shared-prefix forward against the plain one, default food run, one "
            f"forward + backward (median of {repeat})",
            [
                "rows",
                "rows x input slots",
                "real tokens",
                "nodes",
                "plain ms",
                "shared ms",
                "speed-up",
                "max abs Δ logit",
            ],
            rows,
        )
    ]
    step_times, rewards = {"shared": [], "plain": []}, {}
    for _ in range(2):  # alternating rounds: load on a shared machine falls on both alike
        for way in ("shared", "plain"):
            if way == "plain":
                with plain_forward():
                    rl.run(config("prefix-plain", steps), GRPO, "grpo", PANELS)
            else:
                rl.run(config("prefix-shared", steps), GRPO, "grpo", PANELS)
            logged = [
                r for r in read_jsonl(out / f"prefix-{way}" / "metrics.jsonl") if "step_time" in r
            ]
            step_times[way] += [r["step_time"] for r in logged]
            rewards[way] = [r["reward_mean"] for r in logged]
    same = sum(a == b for a, b in zip(rewards["shared"], rewards["plain"]))
    ms = {w: 1e3 * statistics.median(t) for w, t in step_times.items()}
    parts.append(
        table(
            f"prefix: whole default GRPO runs on pizza, seed 0, {steps} fixed steps, 2 "
            "alternating rounds "
            f"(step time: rollout, updates and trust region; the exact evaluation not included)",
            [
                "forward",
                "median step ms",
                "speed-up",
                f"steps with the same mean reward (of {steps})",
            ],
            [
                ["plain", f"{ms['plain']:.1f}", "1.0x", "-"],
                [
                    "shared prefixes",
                    f"{ms['shared']:.1f}",
                    f"{ms['plain'] / ms['shared']:.1f}x",
                    same,
                ],
            ],
        )
    )
    return "\n".join(parts)
