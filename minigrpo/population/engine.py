"""compare's population engine: the runs of one configuration (lockstep.unsupported) as one lockstep
population, the others (DPO, a sampled anchor) alone, each population or lone run a task of
tools/pool.run_pool's worker processes.

    run_populations(items, jobs, done, commands)  # items: the pool's (algo, seed, command, folder)
    run_population(items, done, commands)         # the same in this process (bench)

done(item, error) is called in the calling process as each run ends. Ctrl-C: every member ends its
step with its checkpoint (lockstep.train_lockstep), then KeyboardInterrupt.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable
from dataclasses import dataclass

from minigrpo.population import lockstep
from minigrpo.rl.report import INTERRUPTED
from minigrpo.tools.pool import end_folder, run_pool, start_folder
from minigrpo.util.cli import UsageError

# flags, each with a value, in which a lockstep population's members may differ (lockstep.OWN)
PER_MEMBER = tuple("--" + k.replace("_", "-") for k in lockstep.OWN)


@dataclass(frozen=True)
class Commands:
    """What the engine runs, from its caller (compare, a layer above): the trainer modules by module
    name, a lone run (item -> its error, or None: tools/pool.run_one), and the pool workers' task,
    the caller's module-level function calling run_task(task, these Commands) (pickled by name)."""

    trainers: dict
    run_one: Callable
    task: Callable


def lockstep_key(item, commands: Commands, mixed: bool = True) -> tuple | None:
    """What a run must share with the others of a lockstep population: its trainer and every setting
    but lockstep.OWN (and RECIPES with `mixed`) -> None where lockstep cannot run it."""
    cmd = item[2]  # [python, "-m", module, flags...]
    trainer = commands.trainers.get(cmd[2])
    if trainer is None or lockstep.trainer_name(trainer) not in lockstep.KINDS:  # what it runs
        return None
    flags, skip = [], False
    for arg in cmd[3:]:
        if not skip and arg not in PER_MEMBER:
            flags.append(arg)
        skip = not skip and arg in PER_MEMBER
    setting = _setting(trainer, tuple(flags), mixed)
    return None if setting is None else (cmd[2], setting)


@functools.lru_cache(maxsize=None)
def _setting(trainer, flags: tuple, mixed: bool) -> str | None:
    """lockstep_key's part for these flags, parsed once per configuration (not once per seed)."""
    try:
        cfg = trainer.parse(list(flags))
    except UsageError:
        return None
    if lockstep.unsupported(trainer, [cfg]) is not None:
        return None
    return repr(list(lockstep.shared(trainer, cfg, mixed).items()))


def run_lockstep(items: list, done, commands: Commands) -> bool:
    """The items as one lockstep population, done(item, error) for each at the end -> False (nothing
    run) where they cannot go in lockstep."""
    key = lockstep_key(items[0], commands)
    if key is None or any(lockstep_key(item, commands) != key for item in items):
        return False
    trainer = commands.trainers[key[0]]
    try:
        cfgs = [trainer.parse(item[2][3:]) for item in items]
    # a bad value of a member's own (its --lr, say): each run says it, alone
    except UsageError:
        return False
    if lockstep.unsupported(trainer, cfgs) is not None:
        return False
    started = []
    for item, cfg in zip(items, cfgs):
        try:  # a folder that cannot be made afresh fails its run only
            start_folder(item, lockstep=True)
            started.append((item, cfg))
        except OSError as e:
            done(item, f"{type(e).__name__}: {e}")
    items, cfgs = [item for item, _ in started], [cfg for _, cfg in started]
    try:
        results = lockstep.train_lockstep(trainer, cfgs, [lambda *a: None] * len(items))
    except Exception as e:  # noqa: BLE001
        # the population's own failure, e.g. the GPU's memory: each run says it
        results = [f"{type(e).__name__}: {e}"] * len(items)
    for item, result in zip(items, results):
        done(item, end_folder(item, result if isinstance(result, str) else None))
    if any(isinstance(r, str) and r.startswith(INTERRUPTED) for r in results):
        raise KeyboardInterrupt
    return True


def run_population(items: list, done, commands: Commands) -> None:
    """Every item's run, done(item, error) as each ends: one lockstep population where they can,
    else one after another (commands.run_one)."""
    if not items or run_lockstep(items, done, commands):
        return
    for item in items:
        done(item, commands.run_one(item))


def shares_of(
    items: list, commands: Commands, most: int = 0, mixed: bool = True
) -> tuple[list[list], list]:
    """-> (the lockstep populations `items` make, each of at most `most` runs (0: no limit), in
    nearly equal parts of each lockstep_key's group, in order; the runs that go alone)."""
    groups: dict[tuple, list] = {}
    for item in items:
        groups.setdefault(lockstep_key(item, commands, mixed) or (), []).append(item)
    alone, shares = groups.pop((), []), []
    for group in groups.values():
        n = -(-len(group) // most) if most > 0 else 1
        shares += [group[len(group) * j // n : len(group) * (j + 1) // n] for j in range(n)]
    return shares, alone


def why_alone(item, commands: Commands) -> str:
    """Why lockstep cannot run a run of compare's (its flags parse: compare checked them first)."""
    trainer = commands.trainers[item[2][2]]
    return lockstep.unsupported(trainer, [trainer.parse(item[2][3:])]) or "its flags"


def describe(shares: list, alone: list, commands: Commands) -> str:
    """compare's first line's word on these populations and the runs that go alone, by algorithm
    and why: '1 lockstep population, 4 runs alone (no lockstep: dpo, online_dpo: minigrpo.dpo has
    no lockstep), '."""
    line = f"{len(shares)} lockstep population{'s' * (len(shares) != 1)}, "
    if alone:
        why: dict[str, dict] = {}  # reason -> its algorithms, in order
        for item in alone:
            why.setdefault(why_alone(item, commands), {})[item[0]] = None
        said = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in why.items())
        line += f"{len(alone)} run{'s' * (len(alone) > 1)} alone (no lockstep: {said}), "
    return line


def run_populations(
    items: list, jobs: int, done, commands: Commands, most: int = 0, mixed: bool = True
) -> None:
    """The items' lockstep populations (shares_of) and lone runs, each a task of tools/pool's
    run_pool, `jobs` at a time: each member's own Python between batches is shared out over the
    cores, and a run that kills its process takes no other run with it (_report)."""
    shares, alone = shares_of(items, commands, most, mixed)
    tasks = [("population", share) for share in shares] + [("alone", item) for item in alone]
    report = lambda task, result: _report(task, result, done)
    run_pool(commands.task, tasks, max(1, min(jobs, len(tasks))), report)


def run_task(task: tuple, commands: Commands):
    """A pool worker's task: ("alone", item) -> its error, or None; ("population", items) -> [(item,
    error)], Ctrl-C on for its length (the pool's workers ignore it), as tools/pool.run_in_process
    turns it on for a run."""
    kind, what = task
    if kind == "alone":
        return commands.run_one(what)
    results = []
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run_population(what, lambda item, error: results.append((item, error)), commands)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, previous)
    return results


def _report(task: tuple, results, done) -> list:
    """A task's results, done(item, error) for each run -> the tasks to run again: a population
    whose worker died (a reward's os._exit), each of its runs alone. A run its population never
    reported (cut short) is done with that as its error."""
    kind, what = task
    if kind == "alone":
        done(what, results)
        return []
    if isinstance(results, str):
        return [("alone", item) for item in what]
    for item, error in results:
        done(item, error)
    said = {item[:2] for item, _ in results}  # (algo, seed)
    for item in (item for item in what if item[:2] not in said):
        done(item, "the run did not finish: its population ended without reporting it")
    return []
