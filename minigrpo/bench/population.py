"""bench's population section: P default GRPO runs as one lockstep population
(population/lockstep.py) against P, on the run's device: run-steps per second, memory per member,
where the time goes, the torch calls and kernels per step.
PPO's lockstep (its separate critic, and its exact one) at the largest P.

    python -m minigrpo.bench --only population                 # CPU: P = 1, 4, 16
    python -m minigrpo.bench --only population --device cuda   # GPU: P = 1, 32, 128, 512

Each population runs `python -m minigrpo.grpo --reward pizza` with seeds 0..P−1 for a fixed number
of steps (the stop rule off), from the bench's pretrained model. Beside it: the same run alone, as
the pool runs it; and the largest P shared out over every core's worker process
(population/engine.run_populations, as compare runs it). Then where the lockstep loop spends its
time (sampled every 2 ms; on a GPU a phase that waits for the device holds the time of the kernels
queued before it), and its torch calls and kernels (the operators that compute, backward included:
about one launch each on a GPU) per step at P = 1 and at a larger P: one made once for all members
costs the same at any P.
"""

from __future__ import annotations

import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from minigrpo.bench.common import table
from minigrpo.bench.opcount import TorchCalls, TorchKernels
from minigrpo.bench.stack_sampler import ThreadSampler
from minigrpo.compare import COMMANDS, run_one
from minigrpo.lm import sampling
from minigrpo.population.engine import run_population, run_populations
from minigrpo.tools.pool import gpu_note
from minigrpo.util.runtime import cores

ROOTS = ("minigrpo/population/lockstep.py:_step", "minigrpo/population/lockstep.py:train_lockstep")
# compare's list, less PPO's
PRESETS = ("default", "grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce")
# a population the last rate says would take longer is not run (a lent GPU's minutes are few)
LIMIT_S = 150


def _items(
    out: Path,
    init: Path,
    device: str,
    seeds: range,
    steps: int,
    trainer: str = "minigrpo.grpo",
    extra: tuple = (),
) -> list:
    items = []
    for seed in seeds:
        folder = out / f"s{seed}"
        cmd = [
            sys.executable,
            "-m",
            trainer,
            "--reward",
            "pizza",
            "--seed",
            str(seed),
            "--steps",
            str(steps),
            "--goal",
            "0",
            "--plateau",
            "0",
            "--device",
            device,
            "--threads",
            "1",
            "--quiet",
            "--no-plot",
            "--init",
            str(init),
            *extra,
            "--out",
            str(folder),
        ]
        items.append((trainer.rsplit(".", 1)[1], seed, cmd, folder))
    return items


def _rate(P: int, steps: int, walls: list[float]) -> str:
    """Run-steps per second of tries taking `walls` seconds: the median, with (min–max) over 2+."""
    rates = sorted(P * steps / w for w in walls)
    median = statistics.median(rates)
    return f"{median:.1f}" + (f" ({rates[0]:.1f}–{rates[-1]:.1f})" if len(rates) > 1 else "")


def _row(what: str, P: int, steps: int, walls: list[float], memory: str, failed: list) -> list:
    return [
        what,
        _rate(P, steps, walls),
        f"{1e3 * statistics.median(walls) / (P * steps):.1f}",
        memory,
        "ok" if not failed else failed[0],
    ]


def _memory(gpu: bool, P: int) -> str:
    if gpu:  # PyTorch's tensors at their peak, and the whole device in use after
        free, total = torch.cuda.mem_get_info()
        return (
            f"{torch.cuda.max_memory_allocated() / P / 2**20:.0f}; {(total - free) / P / 2**20:.0f}"
        )
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / P:.0f}"


def _timed(gpu: bool, P: int, run) -> tuple[float, list]:
    failed = []
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    run(lambda item, err: failed.append(err) if err else None)
    return time.perf_counter() - start, failed


def bench_population(
    out: Path,
    init: Path,
    device: str,
    sizes: list[int] | None = None,
    steps: int = 10,
    grow: int = 4,
    tries: int | None = None,
) -> str:
    """The section's tables. The run alone and the largest population are timed `tries` times in
    turn (5 on a CPU, 1 on a GPU), so the machine's drift falls on both alike; their rows give the
    median and (min–max), and a last row the ratio of each try's rates."""
    gpu = device.startswith("cuda")
    sizes = sizes or ([1, 32, 128, 512] if gpu else [1, 4, 16])
    tries = tries or (1 if gpu else 5)
    folder = lambda name: (
        shutil.rmtree(out / "population" / name, ignore_errors=True),
        out / "population" / name,
    )[1]
    items = lambda name, P: _items(folder(name), init, device, range(P), steps)
    alone = lambda: _timed(gpu, 1, lambda done: done(None, run_one(items("alone", 1)[0])))
    population = lambda P: _timed(
        gpu, P, lambda done: run_population(items(f"P{P}", P), done, COMMANDS)
    )
    walls, failed = {}, {}  # by P (0: the run alone): each try's seconds, the failed runs' errors

    def timed(P: int) -> None:
        wall, errors = alone() if P == 0 else population(P)
        walls.setdefault(P, []).append(wall)
        failed.setdefault(P, []).extend(errors)

    timed(0)
    measured, memory, skipped = (1, walls[0][0]), {}, []
    for P in sizes:
        # a population's step ran as fast per run at every P measured so far
        guess = measured[1] * P / measured[0]
        if guess > LIMIT_S:
            limit = f"this section's limit per population: {LIMIT_S} s"
            skipped.append(
                [str(P), "", "", "", f"not run: about {guess:.0f} s at the last rate ({limit})"]
            )
            continue
        timed(P)
        memory[P], measured = _memory(gpu, P), (P, walls[P][0])
        # progress
        print(f"population: P={P} {P * steps / walls[P][0]:.1f} run-steps/s", file=sys.stderr)
    P = measured[0]
    for _ in range(tries - 1):  # the run alone and the largest P again, in turn
        timed(0)
        timed(P)
    ratios = sorted(P * a / b for a, b in zip(walls[0], walls[P]))
    rows = [
        _row("1 alone, as the pool runs it", 1, steps, walls[0], "", failed[0]),
        *(_row(str(n), n, steps, walls[n], memory[n], failed[n]) for n in memory),
        *skipped,
        [
            f"{P} over a run alone, try by try",
            f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}–{ratios[-1]:.2f})",
            "",
            "",
            f"{len(ratios)} tries",
        ],
    ]
    # PPO's lockstep at the largest P
    for name, extra in (("ppo", ()), ("ppo_oracle", ("--critic", "oracle"))):
        P = measured[0]
        ppo = _items(folder(f"{name}{P}"), init, device, range(P), steps, "minigrpo.ppo", extra)
        wall, failed = _timed(gpu, P, lambda done: run_population(ppo, done, COMMANDS))
        rows.append(_row(f"{P} of {name}", P, steps, [wall], _memory(gpu, P), failed))
    P, jobs = measured[0], cores()
    # the largest P over every core's process, as compare runs it (on a GPU: in turns, or through
    # a CUDA MPS the machine runs)
    if jobs > 1 and P > 1:
        wall, failed = _timed(
            gpu,
            P,
            lambda done: run_populations(
                items(f"P{P}-{jobs}", P), jobs, done, COMMANDS, -(-P // jobs)
            ),
        )
        note = gpu_note(min(jobs, P), gpu)
        rows.append(_row(f"{P} in {min(jobs, P)} processes{note}", P, steps, [wall], "", failed))
    memory_title = (
        "GPU MiB per member: tensors (peak); device in use" if gpu else "process peak RSS / P, MiB"
    )
    return (
        table(
            f"population: P default GRPO runs (pizza, {steps} fixed steps) in lockstep on "
            f"{device}; then PPO's",
            ["P", "run-steps/s", "ms per run-step", memory_title, "runs"],
            rows,
        )
        + _recipes(folder, init, device, 16 if gpu else 2, steps, grow)
        + _profile(items, measured[0], steps)
        + _calls(items, min(measured[0], 16), steps)
    )


def _recipes(folder, init: Path, device: str, seeds: int, steps: int, grow: int) -> str:
    """compare's GRPO presets of μ = 2, `seeds` each, as one lockstep population (each preset a
    recipe: population/grpo_update.py) against one population each, one after another: run-steps/s,
    and kernels a step; then the kernels of one population of `grow` × the seeds (what each member
    adds; none: grow 0 or 1)."""
    gpu, P = device.startswith("cuda"), seeds * len(PRESETS)
    runs = lambda tag, name, n, k=seeds: _items(
        folder(f"{tag}-{name}"),
        init,
        device,
        range(k),
        n,
        "minigrpo.grpo",
        () if name == "default" else ("--preset", name),
    )
    one = lambda done, tag="one", n=steps, k=seeds: run_population(
        [item for name in PRESETS for item in runs(tag, name, n, k)], done, COMMANDS
    )
    ways = {
        "one population": one,
        "one each, in turn": lambda done, tag="each", n=steps: [
            run_population(runs(tag, name, n), done, COMMANDS) for name in PRESETS
        ],
    }
    rows = []
    for how, run in ways.items():
        wall, failed = _timed(gpu, P, run)
        kernels, failed_too = _kernels(run, how[:3], device)
        rows.append(
            [how, f"{P * steps / wall:.1f}", f"{kernels:.0f}", (failed + failed_too or ["ok"])[0]]
        )
    if grow > 1:
        kernels, failed = _kernels(
            lambda done, tag, n: one(done, tag, n, grow * seeds), "more", device
        )
        rows.append(
            [
                f"one population of {grow * P} ({grow} × the seeds)",
                "",
                f"{kernels:.0f}",
                (failed or ["ok"])[0],
            ]
        )
    return "\n" + table(
        f"recipes: compare's {len(PRESETS)} GRPO presets of μ = 2 ({', '.join(PRESETS)}), {seeds} "
        f"seeds each ({steps} fixed steps; kernels: over 3 steps, each population's added up, the "
        f"sampler's noise drawn as on a GPU, the checkpoints left out)",
        ["how", "run-steps/s", "kernels a step", "runs"],
        rows,
    )


def _kernels(run, tag: str, device: str) -> tuple[float, list]:
    """The kernels a step of `run` (3 steps), the sampler's noise drawn as a GPU draws it
    (lm/sampling.NOISE_AHEAD: on a CPU too, for the count), the members' own ends of a step left out
    (Run.end_step: their checkpoints, copies on the host on a GPU) -> (kernels a step, the failed
    runs' errors)."""
    ahead, failed = sampling.NOISE_AHEAD, []
    sampling.NOISE_AHEAD = (*ahead, torch.device(device).type)
    try:
        with TorchKernels(root=ROOTS[0]) as kernels:
            run(lambda item, err: failed.append(err) if err else None, f"{tag}-kernels", 3)
    finally:
        sampling.NOISE_AHEAD = ahead
    return sum(
        n for k, n in kernels.counts.items() if k[0] not in ("(outside it)", "end_step")
    ) / 3, failed


def _profile(items, P: int, steps: int, shown: int = 14) -> str:
    """Where the lockstep loop of P members works (stack_sampler.py): what its step was calling,
    and the functions with the most own time, as shares of the working samples."""
    with ThreadSampler(roots=ROOTS) as sampler:
        run_population(items("profile", P), lambda item, err: None, COMMANDS)
    share = lambda n: f"{100 * n / max(sampler.working(), 1):.0f} %"
    rows = [
        [phase, share(n)]
        for phase, n in sampler.phases.most_common(shown)
        if not phase.startswith("(")
    ]
    rows += [[f"own time: {name}", f"{100 * s:.0f} %"] for s, name in sampler.top(6, own=True)]
    return "\n" + table(
        f"where a lockstep population of P = {P} works ({steps} steps, its set-up included), "
        f"sampled every 2 ms: {sampler.working()} working samples",
        ["what its loop was doing", "share"],
        rows,
    )


def _calls(items, P: int, steps: int) -> str:
    """The torch calls and kernels of a lockstep step (bench/opcount.py) at P = 1 and at P, by what
    the step was calling."""
    counts, kernels = {}, {}
    for n in sorted({1, P}):
        # the model's forward (lm/model.py), over the stacked weights (population/stacked.py)
        counts[n] = TorchCalls(
            root=ROOTS[0], inside=("minigrpo/lm/model.py", "minigrpo/population/stacked.py")
        )
        kernels[n] = TorchKernels(root=ROOTS[0])
        with counts[n], kernels[n]:
            run_population(items(f"calls{n}", n), lambda item, err: None, COMMANDS)
    total = lambda c, k: sum(v for key, v in c.counts.items() if key[0] == k)
    reads = lambda c, k: sum(v for key, v in c.syncs.items() if key[0] == k)
    largest = max(counts)
    phases = sorted(
        {k[0] for c in counts.values() for k in c.counts if k[0] != "(outside it)"},
        key=lambda k: -total(counts[largest], k),
    )
    phases.append("all")
    for c in [*counts.values(), *kernels.values()]:
        c.counts[("all", "own")] = sum(n for k, n in c.counts.items() if k[0] != "(outside it)")
        if isinstance(c, TorchCalls):
            c.syncs[("all", "own")] = sum(n for k, n in c.syncs.items() if k[0] != "(outside it)")
    rows = [
        [
            k,
            *(f"{total(c[n], k) / steps:.0f}" for c in (counts, kernels) for n in counts),
            f"{reads(counts[largest], k) / steps:.0f}",
        ]
        for k in phases
    ]
    return "\n" + table(
        "torch calls and kernels per step of a lockstep population, by what its step was calling",
        [
            "calling",
            *(f"{what}, P = {n}" for what in ("calls", "kernels") for n in counts),
            f"reading a value, P = {largest}",
        ],
        rows,
    )
