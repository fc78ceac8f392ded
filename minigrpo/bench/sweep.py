"""bench's sweep section: the population issue's bar command, `python -m minigrpo.compare --seeds S
--reward pizza` (the default list of algorithms), timed as a whole process, its runs checked against
the quality bars, and on a GPU its memory and where its time went.

    python -m minigrpo.bench --only sweep                 # CPU: --seeds 5, the pool (bar: 90 s)
    python -m minigrpo.bench --only sweep --device cuda   # GPU: --seeds 128, populations (bars: 60
                                                          # s, 40 GB)

The command runs from the bench's pretrained model into a fresh folder (compare keeps finished runs
of the same command: an old folder would time nothing). On a GPU, `nvidia-smi` is read every 0.5 s
while it runs: the most memory in use (the device's, every process's), and the phases of the wall
time: before the GPU holds memory beyond what it held at the start (imports, worker processes,
set-up on the CPU), the GPU busy (utilisation >= 80 %: a kernel running most of the time), the GPU
holding memory but less used (set-up on the device, a step's host work, populations ending at
different times, their files), and after it let go (compare's table and figures). On either device,
the longest run's steps: a population's members log its step times, so on a GPU that is the slowest
population's stepping, and the rest of the wall time is outside the steps; and from the files, in
seconds from the start, when compare claimed its folder (its imports and checks done), when the
first and the last run's folder were made (a worker process ready, its population's set-up begun),
when the last run began its steps (config.json: every population set up) and when the last run ended
(summary.json: its checkpoint written).

On a GPU the row says how compare's processes shared it, from compare's first line: in turns, or
through CUDA's Multi-Process Service where the machine runs a daemon of its own (compare starts
none; docs/running.md). (Fewer processes were timed too, GRPO's 896 runs in one or two populations
with --members 1024 or 448: no faster; docs/performance.md.)

Then compare's report of the sweep's runs alone, in this process (`report_seconds`): as if every run
had ended at once (every bootstrap made after the runs), and as compare makes it, every algorithm's
bootstraps but the last one's begun as its last run ended (tools/intervals.ask_early) and made by
the time the last run ends.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from minigrpo.bench.common import run_module, table
from minigrpo.bench.stack_sampler import Periodic
from minigrpo.tools.algorithms import run_of
from minigrpo.tools.bars import within_bars
from minigrpo.tools.stamps import STAMP
from minigrpo.tools.sweep_report import curves
from minigrpo.util.runtime import cores

BUSY = 80  # % utilisation: the GPU computing most of the time
EVERY_S = 0.5


class GpuReadings(Periodic):
    """(seconds since the start, MiB in use, % utilisation) of one GPU, read with nvidia-smi every
    EVERY_S seconds in a thread while `with` runs (stack_sampler.Periodic); none where nvidia-smi
    cannot be run."""

    def __init__(self, index: int = 0):
        super().__init__(EVERY_S)
        self.samples = []
        self.query = [
            "nvidia-smi",
            "--query-gpu=memory.used,utilization.gpu",
            "--format=csv,noheader,nounits",
            "-i",
            str(index),
        ]

    def tick(self) -> bool:
        t = time.perf_counter() - self.start
        try:
            used, busy = subprocess.run(
                self.query, capture_output=True, text=True, timeout=5
            ).stdout.split(",")
        except (OSError, ValueError, subprocess.SubprocessError):
            return False  # no nvidia-smi, or an answer it cannot be read from: no readings
        self.samples.append((t, float(used), float(busy)))
        return True


def phases(
    samples: list[tuple[float, float, float]], wall: float, busy: float = BUSY
) -> tuple[float, ...]:
    """The wall time split by GPU readings (seconds, MiB, % utilisation), in time order -> (before
    the GPU holds more memory than at the first reading, busy (utilisation >= `busy`), holding
    memory but less used, after it let go of it), summing to `wall`; each reading stands for the
    time until the next one (the last: until `wall`)."""
    if not samples:
        return (wall, 0.0, 0.0, 0.0)
    # 64 MiB: more than noise
    held = [i for i, s in enumerate(samples) if s[1] > samples[0][1] + 64]
    if not held:
        return (wall, 0.0, 0.0, 0.0)
    first, last = held[0], held[-1]
    ends = [s[0] for s in samples[1:]] + [wall]
    spans = [end - s[0] for s, end in zip(samples, ends)]
    before = samples[first][0]
    on = sum(d for s, d in zip(samples[first : last + 1], spans[first : last + 1]) if s[2] >= busy)
    during = sum(spans[first : last + 1])
    return (before, on, during - on, wall - before - during)


def bench_sweep(
    out: Path,
    init: Path,
    device: str,
    seeds: int | None = None,
    extra: tuple = (),
    also: list[tuple] | None = None,
) -> str:
    """The table of the sweep's command (module docstring); `seeds` (default 128 on a GPU, 5 on a
    CPU) and `extra` flags of compare: a shorter sweep (the tests'); `also`: the same again with
    each of these flags, a row each (default: none)."""
    gpu = device.startswith("cuda")
    seeds, bar = seeds or (128 if gpu else 5), "60 s, 40 GB of the GPU" if gpu else "90 s"
    header = [
        "command (its runs from the bench's model)",
        "whole process, s",
        "runs within every bar",
        "a run's steps, most: s (its algorithm)",
        "s from the start: folder claimed · runs' folders made, first–last · the last run begun · "
        "ended (its algorithm)",
        "exit",
    ]
    if gpu:
        header[4:4] = [
            "GPU MiB in use, most",
            "s: before the GPU's memory · busy · held, less used · after",
        ]
    rows, folder = [], out / "sweep"
    for more in [(), *(also or [])]:
        name = "sweep" + "".join(more).replace("--", "-")
        row, error, runs = _sweep(folder.with_name(name), init, device, seeds, (*extra, *more))
        rows.append(row)
        said = f"{row[1]} s, {row[2]} runs within every bar" if row[1] else row[-1]
        print(
            f"sweep: {' '.join(more) or 'as it is'}: {said}", file=sys.stderr, flush=True
        )  # progress: a row survives a limit that cuts the section short
        if not more:
            first = (error, runs)
    text = table(
        f"sweep: the default list of algorithms over {seeds} seeds on {device}, one command "
        f"(bar: {bar})",
        header,
        rows,
    )
    if first[0] is not None or not first[1]:
        return text
    cold, warm, last = report_seconds(folder, init, cores())
    return (
        text
        + "\n"
        + table(
            f"sweep: compare's report of its {len(first[1])} runs (table.md, 3 figures) in one "
            f"process, {cores()} threads",
            [
                "every bootstrap made after the runs, s",
                f"all but {last}'s made before its last run ended, s",
            ],
            [[f"{cold:.1f}", f"{warm:.1f}"]],
        )
    )


def _sweep(
    folder: Path, init: Path, device: str, seeds: int, extra: tuple
) -> tuple[list, str | None, list]:
    """compare over `seeds` from `init` into a fresh `folder`, timed -> its table row, its error (or
    None), its runs' curves."""
    gpu = device.startswith("cuda")
    shutil.rmtree(folder, ignore_errors=True)
    args = [
        "minigrpo.compare",
        "--seeds",
        str(seeds),
        "--reward",
        "pizza",
        "--device",
        device,
        "--init",
        str(init),
        *extra,
        "--out",
        str(folder),
    ]
    command = f"`python -m {' '.join(args[:7] + list(extra))}`"
    readings = (
        GpuReadings(int(device.split(":")[1]) if ":" in device else 0)
        if gpu
        else contextlib.nullcontext()
    )
    started = time.time()  # the files' clock
    with readings:
        wall, error, said = run_module(args)
    folders = sorted(folder.glob("*-s*"))
    runs = [curves(f) for f in folders if (f / "summary.json").exists()]
    within = f"{sum(within_bars(r['final']) for r in runs)}/{len(runs)}"
    # a population's members log its steps' time: the longest run's is its slowest population's
    # stepping, the rest
    # of the wall time its start, set-up and files, and compare's report
    longest = max(runs, key=lambda r: r["secs"][-1] if r["secs"] else 0.0, default=None)
    row = [
        command,
        f"{wall:.1f}",
        within,
        f"{longest['secs'][-1]:.1f} ({_algorithm(longest['run'])})"
        if longest and longest["secs"]
        else "",
        timeline(folder, folders, started),
        "ok" if error is None else f"failed, its last line: {error}",
    ]
    if gpu:
        samples = readings.samples
        row[4:4] = [
            f"{max((s[1] for s in samples), default=float('nan')):.0f}",
            " · ".join(f"{p:.0f}" for p in phases(samples, wall)),
        ]
        row[0] += f": {sharing(said)}"
    return row, error, runs


def sharing(stdout: str) -> str:
    """How compare's processes shared the GPU, from its first line: "(...)" after "at a time"."""
    first = stdout.splitlines()[0] if stdout.strip() else ""
    found = re.search(r" at a time \((.*)\) -> ", first)
    return found.group(1) if found else "one process"


def timeline(folder: Path, runs: list[Path], started: float) -> str:
    """In seconds after `started` (time.time()): compare's folder claimed (its .lock: its checks
    done, its worker processes not yet started), the first and the last of the runs' folders made
    (the stamp: pool.start_folder, as a population begins its set-up), the last run begun
    (config.json: rl/loop.Run.begin) and ended (summary.json), as "claimed · made first–last · begun
    · ended (the algorithm of the run that ended last)"."""
    claimed = (folder / ".lock").stat().st_mtime - started if (folder / ".lock").exists() else None
    first = min(
        ((f / STAMP).stat().st_mtime - started for f in runs if (f / STAMP).exists()), default=None
    )
    marks = [
        max(
            (
                ((f / name).stat().st_mtime - started, _algorithm(f.name))
                for f in runs
                if (f / name).exists()
            ),
            default=None,
        )
        for name in (STAMP, "config.json", "summary.json")
    ]
    s = lambda t: "–" if t is None else f"{t:.1f}"
    made = "–" if first is None else f"{s(first)}–{s(marks[0][0])}"
    text = f"{s(claimed)} · {made} · " + " · ".join(s(m and m[0]) for m in marks[1:])
    return text + (f" ({marks[2][1]})" if marks[2] else "")


def _algorithm(run: str) -> str:
    """The algorithm of a sweep's run folder named <algorithm>-s<seed>."""
    return run_of(run)[0]


def report_seconds(folder: Path, init: Path, jobs: int) -> tuple[float, float, str]:
    """compare's report (sweep_report.write_outputs, into a scratch folder) of the sweep's runs in
    `folder` (from `init`), timed with every bootstrap made in it, then with every algorithm's but
    the last to end (its runs' latest summary.json) made before it -> (seconds, seconds, that
    algorithm)."""
    from minigrpo.compare import exact_frontier
    from minigrpo.tools.intervals import Bootstraps, ask_early
    from minigrpo.tools.sweep_report import write_outputs

    done = {}  # algorithm -> (its runs' folders, when its last run ended)
    for f in sorted(
        (f for f in folder.glob("*-s*") if (f / "summary.json").exists()),
        key=lambda f: run_of(f.name)[1],
    ):
        algo = _algorithm(f.name)
        runs, ended = done.get(algo, ([], 0.0))
        done[algo] = (runs + [f], max(ended, (f / "summary.json").stat().st_mtime))
    results = {a: [curves(f) for f in runs] for a, (runs, _) in done.items()}
    last = max(done, key=lambda a: done[a][1])
    curve, scratch, seconds = (
        exact_frontier(["--init", str(init)], "pizza"),
        folder.parent / "sweep-report",
        [],
    )
    for early in ({}, {a: runs for a, runs in results.items() if a != last}):
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        boot = Bootstraps(jobs)
        ask_early(boot, list(results), early)
        for future in boot.asked.values():  # made while the last algorithm's runs went on
            future.result()
        t = time.perf_counter()
        write_outputs(scratch, results, {}, "report", curve, boot)
        seconds.append(time.perf_counter() - t)
    shutil.rmtree(scratch, ignore_errors=True)
    return seconds[0], seconds[1], last
