"""bench's speed sections (`python -m minigrpo.bench --only sampling,threads,scale`), in process.

    sampling  the KV-cache sampler against the slow full-recompute path (batch 8, 64, 512; 16 new tokens)
              and their log-prob agreement, on the default food model's shape
    threads   one pretraining step on 1 and 2 threads, with the load average beside it
    scale     a 6-layer 384-wide model (10.6M parameters, 100x the default): one training step and
              KV-cache sampling on --device; the size where a GPU wins (not in the default sections:
              it takes about half a minute on one CPU thread)
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.nn.functional as F

from minigrpo.bench_rl import table
from minigrpo.model import GPT, GPTConfig
from minigrpo.optim import AdamW
from minigrpo.sampling import generate


def _time(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_sampling(device) -> str:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=26, block_size=32)).to(device).eval()  # the default food model's shape
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
        rows.append([batch, f"{batch / t_fast:,.0f}", f"{n_tok / t_fast:,.0f}", f"{n_tok / t_slow:,.0f}",
                     f"{t_slow / t_fast:.1f}x", f"{diff:.1e}"])
    return table(f"sampling: {new} new tokens, 8-token prompts, {model.num_params():,}-parameter model",
                 ["batch", "completions/s (cache)", "tokens/s (cache)", "tokens/s (slow path)", "speed-up",
                  "max abs Δ log-prob"], rows)


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
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=26, block_size=32)).to(device)
    step = _train_step(model, torch.randint(0, 26, (128, 24), device=device))
    rows = []
    for n in (1, 2):
        torch.set_num_threads(n)
        rows.append([n, f"{1000 * _time(step, 10):.1f}"])
    torch.set_num_threads(1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return table(f"threads: one pretraining step (batch 128 x 23 tokens), 1-min load average {load:.2f}",
                 ["threads", "ms/step (median of 10)"], rows)


def bench_scale(device) -> str:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=26, block_size=32, n_layer=6, n_head=6, n_embd=384)).to(device)
    rows = []
    for batch in (64, 256):
        x = torch.randint(0, 26, (batch, 24), device=device)
        t = _time(_train_step(model, x), 3)
        rows.append([f"train step, batch {batch} x 23 tokens", f"{1000 * t:.1f}", f"{batch * 23 / t:,.0f}"])
    model.eval()
    prompt = torch.randint(3, 26, (512, 8), device=device)
    def sample():
        generate(model, prompt, max_new_tokens=16, generator=torch.Generator(device=device).manual_seed(0))
        if prompt.is_cuda:
            torch.cuda.synchronize()
    t = _time(sample, 2)
    rows.append(["KV-cache sampling, 512 x 16 new tokens", f"{1000 * t:.1f}", f"{512 * 16 / t:,.0f}"])
    return table(f"scale: {model.num_params():,}-parameter model (6 x 384) on {device}, "
                 f"{torch.get_num_threads()} thread(s)", ["what", "ms (median)", "tokens/s"], rows)
