"""bench's population section: P default GRPO runs as one population (minigrpo/population) against P, on the
run's device: run-steps per second, memory per member, and where the time goes.

    python -m minigrpo.bench --only population                 # CPU: P = 1, 4, 16
    python -m minigrpo.bench --only population --device cuda   # GPU: P = 1, 16, 64, 256, 1024

Each population runs `python -m minigrpo.grpo --reward pizza` with seeds 0..P−1 for a fixed number of steps (the
stop rule off), from the bench's pretrained model. The time is split as the batcher served it (it waits for the
GPU after each batch here): sampling, the update (forward with gradient, backward), the evaluation and π_ref
(forward without), and the members' own work between batches (rewards, losses, statistics, files: Python,
member after member). The pool's figure beside it: the same run alone, one process. Last, the largest P shared out
over every core's worker process (population/engine.run_populations, as compare runs it): its wall time only.
"""

from __future__ import annotations

import resource
import shutil
import sys
import time
from pathlib import Path

import torch

from minigrpo.bench.common import table
from minigrpo.population.engine import run_population, run_populations
from minigrpo.population.member import Batcher
from minigrpo.tools.pool import run_one
from minigrpo.util.opcount import TorchCalls
from minigrpo.util.runtime import cores
from minigrpo.util.sampler import ThreadSampler


ROOTS = ("minigrpo/rl/loop.py:run", "minigrpo/population/member.py:_serve", "minigrpo/rl/loop.py:__init__")
LIMIT_S = 150  # a population the last rate says would take longer is not run (a lent GPU's minutes are few)


def _items(out: Path, init: Path, device: str, seeds: range, steps: int) -> list:
    items = []
    for seed in seeds:
        folder = out / f"s{seed}"
        cmd = [sys.executable, "-m", "minigrpo.grpo", "--reward", "pizza", "--seed", str(seed), "--steps", str(steps),
               "--goal", "0", "--plateau", "0", "--device", device, "--threads", "1", "--quiet", "--no-plot",
               "--init", str(init), "--out", str(folder)]
        items.append(("default", seed, cmd, folder))
    return items


def bench_population(out: Path, init: Path, device: str, sizes: list[int] | None = None, steps: int = 10) -> str:
    gpu = device.startswith("cuda")
    sizes = sizes or ([1, 16, 64, 256, 1024] if gpu else [1, 4, 16])
    alone_dir = out / "population" / "alone"
    shutil.rmtree(alone_dir, ignore_errors=True)
    start = time.perf_counter()
    error = run_one(_items(alone_dir, init, device, range(1), steps)[0])
    alone = time.perf_counter() - start
    rows = [["1 (alone, as the pool runs it)", f"{steps / alone:.1f}", f"{1e3 * alone / steps:.1f}", "", "", "", "",
             "", "ok" if error is None else error]]
    measured, wall = 1, alone
    for P in sizes:
        guess = wall * P / measured  # a population's step ran as fast per run at every P measured so far
        if guess > LIMIT_S:
            rows.append([str(P), "", "", "", "", "", "", "", f"not run: about {guess:.0f} s at the last rate "
                                                              f"(this section's limit per population: {LIMIT_S} s)"])
            continue
        folder = out / "population" / f"P{P}"
        shutil.rmtree(folder, ignore_errors=True)
        batcher, failed = Batcher(), []
        batcher.sync = True
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        run_population(_items(folder, init, device, range(P), steps), lambda item, err: failed.append(err) if err
                       else None, batcher)
        wall = time.perf_counter() - start
        spent = {k: v[0] for k, v in batcher.spent.items()}
        share = lambda *keys: f"{100 * sum(spent.get(k, 0.0) for k in keys) / wall:.0f} %"  # noqa: E731
        if gpu:  # PyTorch's tensors at their peak, and the whole device in use after (cuBLAS's handles and the like)
            free, total = torch.cuda.mem_get_info()
            memory = f"{torch.cuda.max_memory_allocated() / P / 2**20:.0f}; {(total - free) / P / 2**20:.0f}"
        else:
            memory = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / P:.0f}"
        rows.append([str(P), f"{P * steps / wall:.1f}", f"{1e3 * wall / (P * steps):.1f}", memory,
                     share(("generate", False)), share(("hidden", True), ("linear", True), ("backward", True)),
                     share(("hidden", False), ("linear", False)),
                     f"{100 * (1 - sum(spent.values()) / wall):.0f} %", "ok" if not failed else failed[0]])
        print(f"population: P={P} {P * steps / wall:.1f} run-steps/s", file=sys.stderr, flush=True)  # progress
        measured = P
    jobs = cores()
    if jobs > 1:  # the largest P over every core's process: what does not batch runs on all of them
        P, failed = measured, []
        folder = out / "population" / f"P{P}-{jobs}"
        shutil.rmtree(folder, ignore_errors=True)
        start = time.perf_counter()
        run_populations(_items(folder, init, device, range(P), steps), jobs,
                        lambda item, err: failed.append(err) if err else None)
        wall = time.perf_counter() - start
        rows.append([f"{P} in {jobs} processes", f"{P * steps / wall:.1f}", f"{1e3 * wall / (P * steps):.1f}", "", "",
                     "", "", "", "ok" if not failed else failed[0]])
    memory_title = "GPU MiB per member: tensors (peak); device in use" if gpu else "process peak RSS / P, MiB"
    return table(f"population: P default GRPO runs (pizza, {steps} fixed steps) as one population on {device}",
                 ["P", "run-steps/s", "ms per run-step", memory_title, "sampling", "update",
                  "evaluation and π_ref", "members' own", "runs"], rows) + \
        _profile(out, init, device, measured, steps) + _calls(out, init, device, steps)


def _profile(out: Path, init: Path, device: str, P: int, steps: int, shown: int = 14) -> str:
    """Where the threads of a population of min(P, 16) work (util/sampler.py): what each member's run loop or the
    batch server was calling, and the functions with the most own time, as shares of the working samples."""
    P = min(P, 16)
    folder = out / "population" / f"P{P}-profile"
    shutil.rmtree(folder, ignore_errors=True)
    with ThreadSampler(roots=ROOTS) as sampler:
        run_population(_items(folder, init, device, range(P), steps), lambda item, err: None, Batcher())
    share = lambda n: f"{100 * n / max(sampler.working(), 1):.0f} %"  # noqa: E731
    rows = [[phase, share(n)] for phase, n in sampler.phases.most_common(shown)]
    rows += [[f"own time: {name}", f"{100 * s:.0f} %"] for s, name in sampler.top(6, own=True)]
    return "\n" + table(f"where a population's threads work: P = {P} on {device}, sampled every 2 ms, "
                        f"{sampler.working()} working samples of {sampler.samples} (the rest waited)",
                        ["what a member's run loop, or the batch server, was doing", "share"], rows)


def _calls(out: Path, init: Path, device: str, steps: int) -> str:
    """The torch calls of one run alone per run-step (util/opcount.py), by what its run loop was calling: a
    population batches the model's, and each member makes its own one after another."""
    calls = TorchCalls(root="minigrpo/rl/loop.py:run", inside=("minigrpo/lm/model.py", "minigrpo/lm/sampling.py"))
    with calls:
        run_one(_items(out / "population" / "calls", init, device, range(1), steps)[0])
    phases = sorted({k[0] for k in calls.counts}, key=lambda k: -sum(calls.counts[(k, w)] for w in ("own", "model")))
    per = lambda n: f"{n / steps:.0f}"  # noqa: E731
    rows = [[k, per(calls.counts[(k, "own")]), per(calls.counts[(k, "model")]),
             per(calls.syncs[(k, "own")] + calls.syncs[(k, "model")])] for k in phases]
    own = sum(n for (k, w), n in calls.counts.items() if w == "own")
    rows.append(["all", per(own), per(sum(calls.counts.values()) - own), per(sum(calls.syncs.values()))])
    return "\n" + table(f"torch calls per run-step of one run on {device} ({steps} steps, its set-up included), by "
                        "what its run loop was calling", ["calling", "own calls", "model's calls", "reading a value"],
                        rows)
