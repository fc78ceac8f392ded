"""compare's population engine: runs of one configuration as one lockstep population, the others
alone, every population and lone run a task of the pool's worker processes.

    run_population(items, done, commands)         # the pool's items (tools/pool.py): (algo,
                                                  # seed, command, folder)
    run_populations(items, jobs, done, commands)  # the items' populations and lone runs, shared
                                                  # out over `jobs` worker processes
    # commands: the trainers and runners, from compare (Commands: the engine imports no command)

In lockstep (population/lockstep.py): runs of minigrpo.grpo or minigrpo.ppo that differ only in
their seeds (and folders), learning rates, rewards, β's and people (GRPO's, and in their recipes:
compare's presets of one μ), whose configuration lockstep supports, train as one computation, each
run a slice of every tensor. The others (DPO, a sampled anchor, any flag lockstep does not run) go
alone, each its command's own `main(argv)` in a worker (tools/pool.run_one: the folder made afresh
and stamped, the summary required), as compare's pool runs them. done(item, error) is called in the
calling process as each run ends.

Where it is meant to pay: a GPU, whose batch is nearly free up to thousands of rows while one small
model's step is launch-bound; what does not batch is each member's own work between batches, one
member after another (docs/performance.md). On a CPU of few cores the arithmetic is the same and the
pool is the default (compare --engine).

Ctrl-C: every member finishes its step, writes its checkpoint and ends as interrupted (a run's own
Ctrl-C), then KeyboardInterrupt is raised here; a second Ctrl-C raises it at once.
"""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass

from minigrpo.population.lockstep import (
    KINDS,
    OWN,
    QUIET,
    RECIPES,
    train_lockstep,
    trainer_name,
    unsupported,
)
from minigrpo.rl.report import INTERRUPTED, STOP_ALL
from minigrpo.tools.pool import STOPPING, end_folder, run_pool, start_folder
from minigrpo.util.cli import UsageError

# flags, each with a value, in which a lockstep population's members may differ (lockstep.OWN)
PER_MEMBER = {name: tuple("--" + k.replace("_", "-") for k in own) for name, own in OWN.items()}


@dataclass(frozen=True)
class Commands:
    """What the engine runs, handed down by its caller (compare, a layer above: the engine imports
    no command): the trainer modules by module name, a lone run (item -> its error, or None:
    tools/pool.run_one with the trainers' mains), and the pool workers' task, a module-level
    function of the caller's that calls run_task(task, these Commands) (the workers start with
    'spawn' and get it pickled by its name)."""

    trainers: dict
    run_one: Callable
    task: Callable


def lockstep_key(item, commands: Commands, mixed: bool = True) -> tuple | None:
    """What a run must share with the others of a lockstep population: its trainer and every setting
    but those each member may have of its own (lockstep.OWN: --seed, --out, --lr, --reward, --beta,
    --person; GRPO's recipe, lockstep.RECIPES; mixed=False: its recipe too, but β) (None: its
    trainer has no lockstep, or lockstep does not support its flags, or they are bad)."""
    cmd = item[2]  # [python, "-m", module, flags...]
    trainer = commands.trainers.get(cmd[2])
    if trainer is None or trainer_name(trainer) not in KINDS:  # the trainers lockstep runs
        return None
    name = trainer_name(trainer)
    flags, skip, own = [], False, PER_MEMBER[name]
    for arg in cmd[3:]:
        if not skip and arg not in own:
            flags.append(arg)
        skip = not skip and arg in own
    setting = _setting(trainer, tuple(flags), mixed)
    return None if setting is None else (cmd[2], setting)


@functools.lru_cache(maxsize=None)
def _setting(trainer, flags: tuple, mixed: bool) -> str | None:
    """lockstep_key's part for these flags (read once per configuration, not once per seed): every
    setting but the members' own, or None where lockstep does not run them or they are bad."""
    try:
        cfg = trainer.parse(list(flags))
    except UsageError:
        return None
    if unsupported(trainer, [cfg]) is not None:
        return None
    name = trainer_name(trainer)
    apart = (*OWN[name], *QUIET, *(RECIPES[name] if mixed else ()))
    return repr([(k, v) for k, v in asdict(cfg).items() if k not in apart])


def run_lockstep(items: list, done, commands: Commands) -> bool:
    """The items as one lockstep population, done(item, error) for each at the end -> False (nothing
    run) where they cannot go in lockstep: another trainer or configuration, a flag lockstep does
    not support, a bad flag."""
    key = lockstep_key(items[0], commands)
    if key is None or any(lockstep_key(item, commands) != key for item in items):
        return False
    trainer = commands.trainers[key[0]]
    try:
        cfgs = [trainer.parse(item[2][3:]) for item in items]
    # a bad value of a member's own (its --lr, say): each run says it, alone
    except UsageError:
        return False
    if unsupported(trainer, cfgs) is not None:
        return False
    started = []
    for item, cfg in zip(items, cfgs):
        try:  # a folder that cannot be made afresh fails its run only
            start_folder(item, lockstep=True)
            started.append((item, cfg))
        except OSError as e:
            done(item, f"{type(e).__name__}: {e}")
    if not started:
        return True
    items, cfgs = [item for item, _ in started], [cfg for _, cfg in started]
    try:
        results = train_lockstep(trainer, cfgs, [lambda *a: None] * len(items))
    except Exception as e:  # noqa: BLE001
        # the population's own failure, e.g. the GPU's memory: each run says it
        results = [f"{type(e).__name__}: {e}"] * len(items)
    for item, result in zip(items, results):
        done(item, end_folder(item, result if isinstance(result, str) else None))
    if any(isinstance(r, str) and r.startswith(INTERRUPTED) for r in results):
        raise KeyboardInterrupt
    return True


def run_population(items: list, done, commands: Commands) -> None:
    """Every item's run, done(item, error) as each ends: as one lockstep population where they can
    (run_lockstep), else one after another here (commands.run_one, in process)."""
    if not items or run_lockstep(items, done, commands):
        return
    for item in items:
        done(item, commands.run_one(item))


def shares_of(
    items: list, commands: Commands, most: int = 0, mixed: bool = True
) -> tuple[list[list], list]:
    """-> (the lockstep populations `items` make, each of at most `most` runs (0: no limit); the
    runs that go alone). Runs that may go in lockstep (lockstep_key; `mixed`: GRPO's recipes
    together) are grouped by configuration: a group, or its nearly equal parts in order (so
    compare's presets of one GRPO group, over more seeds than `most`, go a preset to a part)."""
    groups: dict[tuple, list] = {}
    for item in items:
        groups.setdefault(lockstep_key(item, commands, mixed) or (), []).append(item)
    alone, shares = groups.pop((), []), []
    for group in groups.values():
        n = -(-len(group) // most) if most > 0 else 1
        shares += [group[len(group) * j // n : len(group) * (j + 1) // n] for j in range(n)]
    return shares, alone


def describe(shares: list, alone: list) -> str:
    """compare's first line's word on these populations and the runs that go alone, by algorithm:
    '2 lockstep populations, 4 runs alone (no lockstep: dpo, online_dpo), '."""
    line = f"{len(shares)} lockstep population{'s' * (len(shares) != 1)}, "
    if alone:
        algos = ", ".join(dict.fromkeys(item[0] for item in alone))
        line += f"{len(alone)} run{'s' * (len(alone) > 1)} alone (no lockstep: {algos}), "
    return line


def run_populations(
    items: list, jobs: int, done, commands: Commands, most: int = 0, mixed: bool = True
) -> None:
    """The items' lockstep populations (shares_of: at most `most` runs each, `mixed` as there) and
    the runs that go alone (another trainer, a flag lockstep does not run), each population or lone
    run a task of tools/pool.run_pool's worker processes, `jobs` at a time. Why processes: what does
    not batch, each member's own Python between batches, runs one member after another in a process
    (one interpreter lock), so it is shared out over the cores; and a run that kills its process
    (os._exit in a reward) takes no other run with it (_report). Why a limit: each member costs GPU
    memory (compare --members). done(item, error) is called here as each run ends."""
    shares, alone = shares_of(items, commands, most, mixed)
    tasks = [("population", share) for share in shares] + [("alone", item) for item in alone]
    report = lambda task, result: _report(task, result, done)
    run_pool(commands.task, tasks, max(1, min(jobs, len(tasks))), report)


def run_task(task: tuple, commands: Commands):
    """A pool worker's task: ("population", items) -> [(item, error)] of its runs
    (population_share); ("alone", item) -> its error, or None (commands.run_one)."""
    kind, what = task
    return population_share(what, commands) if kind == "population" else commands.run_one(what)


def _report(task: tuple, results, done) -> list:
    """A task's results, done(item, error) for each run -> the tasks to run again: where a
    population's worker died (a member's reward called os._exit, say), each of its runs alone, so
    the others finish and the one that kills its process is named by its own death."""
    kind, what = task
    if kind == "alone":
        done(what, results)
        return []
    if isinstance(results, str):
        return [("alone", item) for item in what]
    for item, error in results:
        done(item, error)
    return []


def population_share(items: list, commands: Commands) -> list:
    """A pool worker's share: one population -> [(item, error)] of its runs. Ctrl-C (the terminal
    signals the whole process group; the parent's alone sets the pool's stop event) ends every
    member at the end of its step, as in one process."""
    results = []
    # the pool's workers start with it ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    # a Ctrl-C that reached the parent only (kill -INT <pid>) stops the members too
    for stop in STOPPING:
        threading.Thread(target=lambda: stop.wait() and STOP_ALL.set(), daemon=True).start()
    try:
        run_population(items, lambda item, error: results.append((item, error)), commands)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, previous)
    return results
