"""Run several algorithms × seeds side by side and compare them on the task's exact metrics.

    python -m minigrpo.compare --seeds 5 --reward pizza    # the default algorithms (see --help)
    python -m minigrpo.compare --algos j_beta,default --reward pizza   # any preset by name
    python -m minigrpo.compare --algos grpo,dr_grpo --group-size 4     # trainer flags pass through

With --engine pool (the default on a CPU) the runs go to --jobs worker processes (default: the
cores), one thread each, each its command's own main in process (tools/pool.py: the same metrics as
separate processes). With --engine population (the default on a GPU) the seeds of each GRPO or PPO
configuration train as lockstep populations of at most --members runs, one computation each
(population/lockstep.py; on a GPU GRPO's presets of one μ together; the same metrics to float
rounding), in the same workers; a run lockstep cannot map (DPO, the sampled anchor) goes alone, and
the first line names them. compare starts no CUDA MPS (docs/running.md). Under torchrun, --jobs
defaults to the cores shared by the node's ranks. Each run writes to <out>/<algo>-s<seed>/ without
its metrics.png (`python -m minigrpo.metrics` draws it) and, where compare sets its --steps, one
checkpoint, its last. Budgets are fixed by default (--budget fixed: every run the same --steps, the
stop rule off); --budget goal lets each run stop at its goal. A finished run of exactly the same
command, code and input files is kept (tools/stamps.py), so a rerun only runs what is missing and an
edit of the library or the reward makes the runs again; an --out of another command's runs is
refused unless --overwrite; a later invocation for a subset of the algorithms keeps the others' runs
in the table. The arguments are checked before any run starts; a failed run, or one without an
intact summary.json whatever its engine said, is named with its error while the others finish, and
compare then exits with code 1. Writes to <out> (default runs/compare-<reward>):
  curves.png    exact target rate against wall seconds and sampled tokens (mean, min–max band)
  frontier.png  where the runs ended (per algorithm the median and IQR over seeds): food: final
                E[r] against exact KL(π_θ‖π_ref) over the 13 outcomes on the EXACT reward–KL
                frontier (frontier.py), whole and zoomed; and E[r] against the worst drift
  table.md      per algorithm, medians over seeds (with min–max) in two tables of at most 10
                columns (what judges a run; the other figures), the runs outside the bars, then for
                the final target rate, the steps to 0.95 and (food) the regret: the IQM with its
                95 % BCa interval, the difference from the first algorithm (the baseline) with its
                interval and a permutation test, and P(A better than B) for every pair (n, method
                and seed stated: tools/stats.py); below 10 runs no difference is called
  runs.csv      every run's figures, a row each, the world's own too (sums: think rate, held-out...)
  intervals.png those IQMs with their intervals, and the target rate by step (IQM and its band)
and prints the medians that judge a run for a terminal: per algorithm the runs within the bars,
the steps to 0.95, the final target rate, the peak drift and malformed mass and (food) the regret;
then per figure the IQMs and the differences from the baseline with what the runs support.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from minigrpo import dpo, grpo, ppo
from minigrpo.population import engine as population
from minigrpo.rl.config import default_out
from minigrpo.rl.report import INTERRUPTED
from minigrpo.tools import pool
from minigrpo.tools.algorithms import (
    ALGOS,
    OWN_TRAINERS,
    PPO_ALGOS,
    SET_BY_COMPARE,
    base_of,
    run_of,
    trainer_of,
    variant_flags,
)
from minigrpo.tools.compare_config import CompareConfig, trainer_args
from minigrpo.tools.intervals import Bootstraps, ask_early
from minigrpo.tools.pool import brief, gpu_note, run_pool
from minigrpo.tools.shards import join
from minigrpo.tools.stamps import claim_runs, finished, finished_by
from minigrpo.tools.sweep_report import curves, write_outputs
from minigrpo.util.cli import UsageError, finish_unread, main_guard, parse_config, require
from minigrpo.util.outputs import prepare_out
from minigrpo.util.runtime import check_device, cores, on_gpu

# what tests and other modules read from here (some of it defined in tools/)
__all__ = [
    "ALGOS",
    "OWN_TRAINERS",
    "CompareConfig",
    "check_all",
    "command",
    "exact_frontier",
    "main",
    "module_of",
    "on_gpu",
    "run_one",
    "trainer_args",
]

# the trainers by the names tools/algorithms gives them (the tools sit below the commands: they get
# the trainers from here), and what a run's worker calls: {the module of its command line: main}
TRAINERS = {"grpo": grpo, "ppo": ppo, "dpo": dpo}
MAINS = {trainer.__name__: trainer.main for trainer in TRAINERS.values()}

DESCRIPTION = (
    __doc__.split("\n\n")[0]
    + " Every other flag (e.g. --task arithmetic, --group-size 4, --beta 0) "
    "passes through to the trainers (see python -m minigrpo.grpo --help)."
)


def module_of(algo: str) -> str:
    """The module an algorithm's runs are commands of: 'ppo_oracle@lr=1e-3' -> 'minigrpo.ppo'."""
    return TRAINERS[trainer_of(algo)].__name__


def command(
    algo: str, seed: int, cfg: CompareConfig, passthrough: list[str], task: str, out: Path
) -> list[str]:
    """One run's whole command line: [python, "-m", its trainer, its flags (trainer_args), "--out",
    <out>/<algo>-s<seed>]."""
    flags = trainer_args(algo, seed, cfg, passthrough, task)
    return [sys.executable, "-m", module_of(algo), *flags, "--out", str(out / f"{algo}-s{seed}")]


def run_one(task) -> str | None:
    """One of compare's runs in a worker of the pool: tools/pool.run_one with the trainers' MAINS. A
    function of this module, because the workers start with 'spawn' and get it pickled by its name
    (a trainer's main, wrapped by util/cli.main_guard, does not pickle)."""
    return pool.run_one(task, MAINS)


def population_task(task):
    """A pool worker's task of the population engine (population/engine.run_task) with compare's
    trainers; a function of this module for the same reason as run_one."""
    return population.run_task(task, COMMANDS)


# what the population engine runs (it sits below the commands: they are handed down from here)
COMMANDS = population.Commands({t.__name__: t for t in TRAINERS.values()}, run_one, population_task)


def check_all(algos: list[str], cfg: CompareConfig, passthrough: list[str], task: str) -> str:
    """Parse every run's flags, build its reward, score it on the task's support and read its --init
    in this process, so a bad flag, task, reward (one that raises or exits too) or checkpoint
    (missing, or of another task) is one line before any run starts, and so is a --device cuda
    without a GPU. -> the --init checkpoint the runs start from."""
    from minigrpo.lm.checkpoint import CheckpointError, read_checkpoint
    from minigrpo.rl.config import check_rl_config
    from toy_tasks import get_task
    from toy_tasks.rewards import RewardError, make_reward
    from toy_tasks.support import reward_table

    for algo in algos:
        trainer = TRAINERS[trainer_of(algo)]  # its run's checks, here
        rc = trainer.parse(trainer_args(algo, 0, cfg, passthrough, task) + ["--out", "unused"])
        check_rl_config(rc)
        trainer.check_config(rc)
    check_device(rc.device)
    try:  # the runs share task, reward and --init: checked once, the task and reward first
        t = get_task(rc.task)
        reward_table(
            make_reward(rc.reward, t.REWARDS, t.REWARD_HELP),
            t.rl_prompts(rc),
            t.support,
            t.OFF_SUPPORT_PROBES,
        )
        if not Path(rc.init).is_file():
            raise UsageError(
                f"--init {rc.init!r} does not exist (run `python -m minigrpo.pretrain"
                f"{'' if rc.task == 'food' else ' --task ' + rc.task}` first)"
            )
        pretrained_on = read_checkpoint(rc.init)["task"]
    except (ValueError, RewardError, CheckpointError) as e:
        raise UsageError(str(e)) from None
    if pretrained_on != rc.task:
        raise UsageError(
            f"--init {rc.init!r} was pretrained on task {pretrained_on!r}, not {rc.task!r}"
        )
    return rc.init


def exact_frontier(passthrough: list[str], reward: str | None):
    """The food task's exact frontier {kl, expected_reward} for the runs' person, reward and --init;
    None for another task or where the reward fails (the runs then say why)."""
    from minigrpo.exact import frontier
    from minigrpo.optimum import OptimumConfig, load_problem

    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name, default in (
        ("--task", "food"),
        ("--person", "ravin"),
        ("--init", "runs/pretrain/model.pt"),
    ):
        pre.add_argument(name, default=default)
    a = pre.parse_known_args(passthrough)[0]
    try:
        p_ref, r, _ = load_problem(
            OptimumConfig(reward=reward or "pizza", person=a.person, init=a.init, task=a.task)
        )
    except UsageError:
        return None
    return frontier.frontier(p_ref, r)


@main_guard
@finish_unread
def main(argv=None):
    # our own flags here; every other flag (e.g. --task arithmetic) passes through to the trainers
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in "algos seeds reward out jobs budget steps engine members".split():
        pre.add_argument(f"--{name}")
    pre.add_argument("--overwrite", action="store_true", default=None)
    ours, passthrough = pre.parse_known_args(list(argv or []))
    # the passed-through flags compare reads
    trainers = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    trainers.add_argument("--task", default="food")
    trainers.add_argument("--device", default="auto")
    if "-h" in passthrough or "--help" in passthrough:
        parse_config(CompareConfig, ["--help"], DESCRIPTION)
    own = [
        x
        for k, v in vars(ours).items()
        if v is not None
        for x in ((f"--{k}",) if v is True else (f"--{k}", v))
    ]
    cfg, _ = parse_config(CompareConfig, own, DESCRIPTION)
    algos = [a.strip() for a in cfg.algos.split(",") if a.strip()]
    if not algos:
        raise UsageError(f"--algos names no algorithm (available: {', '.join(ALGOS)})")
    for a in algos:
        variant_flags(a)  # a bad name or variant: one line
    twice = sorted({a for a in algos if algos.count(a) > 1})
    if twice:
        raise UsageError(
            f"--algos names {', '.join(twice)} more than once (each algorithm's runs share one "
            "folder)"
        )
    require(cfg, "seeds", cfg.seeds >= 1, ">= 1")
    require(cfg, "steps", cfg.steps is None or cfg.steps >= 1, ">= 1")
    if cfg.out is not None and not cfg.out.strip():
        raise UsageError("--out is empty; give a folder path such as runs/my-sweep")
    require(cfg, "jobs", cfg.jobs >= 0, ">= 0 (0 = the number of cores)")
    require(cfg, "members", cfg.members >= 0, ">= 0 (0 = no limit)")
    if any(p.startswith("--") and p[2:] in SET_BY_COMPARE for p in passthrough):
        raise UsageError(
            "--seed, --out, --preset, --resume, --goal and --plateau are set by compare itself; "
            "use --seeds, --out, --algos and --budget"
        )
    if "--online" in passthrough or (
        "--critic" in passthrough and "ppo_oracle" in map(base_of, algos)
    ):
        raise UsageError(
            "--online is compare's online_dpo (--algos online_dpo), and --critic would relabel "
            "ppo_oracle's runs: pass --critic only with --algos ppo"
        )
    task, device = vars(trainers.parse_known_args(passthrough)[0]).values()
    init = check_all(algos, cfg, passthrough, task)
    # named on every command line, so the runs' stamps hold its content (pool.py)
    if "--init" not in passthrough:
        passthrough = [*passthrough, "--init", init]
    default = (
        default_out(argparse.Namespace(reward=cfg.reward, preset=None), "compare")
        if cfg.reward
        else f"runs/compare-{task}"
    )
    out = Path(cfg.out if cfg.out is not None else default)
    # torchrun's ranks share the node
    jobs = cfg.jobs or max(1, cores() // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))

    # this invocation's command for a run folder's name
    def command_of(folder_name: str) -> list[str] | None:
        run = run_of(folder_name)
        try:
            return command(*run, cfg, passthrough, task, out) if run else None
        except UsageError:  # not a run folder of ours
            return None

    shard = join()  # under torchrun: this process's share of the runs (tools/shards.py)
    refused = None
    if shard.rank == 0:  # one process claims the folder; the others learn whether it was refused
        try:
            claim_runs(prepare_out(out, runs_inside="compare"), command_of, cfg.overwrite)
        except UsageError as e:
            refused = str(e)
    refused = shard.share(refused)
    if refused:
        raise UsageError(refused)
    tasks = [
        (a, s, command(a, s, cfg, passthrough, task, out), out / f"{a}-s{s}")
        for a in algos
        for s in range(cfg.seeds)
    ]
    gpu = on_gpu(device)
    engine = cfg.engine if cfg.engine != "auto" else "population" if gpu else "pool"
    # a run's engine is part of what it is: a lockstep member rounds otherwise than its run alone
    stepped = lambda t: (
        engine == "population" and population.lockstep_key(t, COMMANDS, gpu) is not None
    )
    intact = lambda t: finished_by(t[3], t[2], stepped(t))
    # a run finished by the same command is kept; PPO's runs (four updates a step: about twice
    # GRPO's) go first, so the sweep ends on short runs, not on one core idle beside a long one
    todo = sorted(
        (t for t in tasks if not intact(t)),
        key=lambda t: base_of(t[0]) not in PPO_ALGOS,
    )
    shard.barrier()  # every rank has read the same finished runs before any starts one
    # by (algo, seed): this rank's failed runs' errors, the curves read as runs ended; runs done()
    mine, read, seen, reported = {}, {}, dict.fromkeys(algos, 0), set()
    # the table's bootstraps, in --jobs threads: an algorithm's begun as its last run ends
    boot = Bootstraps(jobs)

    # an interrupted run (Ctrl-C) is not a failure: it says where its checkpoint is
    def done(run, err):
        reported.add(run[:2])
        # a run counts only finished and intact, whatever its engine said (a population cut short)
        if err is None and not finished(run[3]):
            err = "the run did not finish: no intact summary.json and metrics.jsonl"
        said = (
            "ok"
            if err is None
            else brief(err)
            if err.startswith(INTERRUPTED)
            else "FAILED: " + brief(err)
        )
        print(f"  {run[0]} seed {run[1]}: {said}", flush=True)
        if err is not None:
            mine[run[:2]] = err
        elif shard.rank == 0:  # the table's (rank 0 writes it), read while the other runs go on
            read[run[:2]] = curves(run[3])
            seen[run[0]] += 1
            # its algorithm's last run: its bootstraps begin
            if seen[run[0]] == cfg.seeds:
                ask_early(
                    boot,
                    algos,
                    {
                        a: [read[a, s] for s in range(cfg.seeds)]
                        for a in algos
                        if all((a, s) in read for s in range(cfg.seeds))
                    },
                )

    lockstep = engine == "population"
    shares, alone = (
        population.shares_of(shard.mine(todo), COMMANDS, cfg.members, gpu) if lockstep else ([], [])
    )
    processes = min(jobs, len(shares) + len(alone) if lockstep else len(shard.mine(todo)))
    at_once = population.describe(shares, alone, COMMANDS) if lockstep else ""
    at_once += f"{processes} at a time{gpu_note(processes, gpu)}"  # gpu: a CUDA context each
    ranks = f" over {shard.size} processes" if shard.size > 1 else ""
    if shard.rank == 0:
        print(
            f"compare: {len(algos)} algorithms x {cfg.seeds} seeds ({len(todo)} to "
            f"run{ranks}), {at_once} -> {out}",
            flush=True,
        )
    # rank 0 reads the runs kept
    running = {t[:2] for t in todo}
    for kept in (t for t in tasks if t[:2] not in running and shard.rank == 0):
        done(kept, None)
    try:
        if engine == "population":
            population.run_populations(shard.mine(todo), jobs, done, COMMANDS, cfg.members, gpu)
        else:
            run_pool(run_one, shard.mine(todo), max(1, jobs), done)
    except KeyboardInterrupt:
        boot.cancel()
        raise
    for t in (t for t in shard.mine(todo) if t[:2] not in reported):  # never reported: intact?
        done(t, None)
    everyone = shard.gather(mine)
    shard.leave()
    if everyone is None:  # not rank 0: rank 0 writes the table
        return
    failed = {k: v for errs in everyone for k, v in errs.items()}
    errors = {}
    for (algo, seed), err in sorted(failed.items()):
        errors.setdefault(algo, []).append((seed, err))
    results = {
        a: [
            read.get((a, s)) or curves(out / f"{a}-s{s}")
            for s in range(cfg.seeds)
            if (a, s) not in failed
        ]
        for a in algos
    }
    # finished runs of the SAME flags stay in the table
    for algo in [a for a in ALGOS if a not in algos]:
        same = [out / f"{algo}-s{s}" for s in range(cfg.seeds)]
        runs = [
            (algo, s, command(algo, s, cfg, passthrough, task, out), f) for s, f in enumerate(same)
        ]
        if all(map(intact, runs)):
            results[algo] = [curves(f) for f in same]
    budget = f"{cfg.budget} budget" + (f", {cfg.steps} steps" if cfg.steps else "")
    title = f"{', '.join(results)} x {cfg.seeds} seeds, reward {cfg.reward or task}, {budget}"
    curve = exact_frontier(passthrough, cfg.reward)
    print(write_outputs(out, results, errors, title, curve, boot))
    for (algo, seed), err in sorted(failed.items()):
        print(f"failed: {algo} seed {seed}: {brief(err)}")
    print(
        f"wrote {out / 'curves.png'}, {out / 'frontier.png'}, {out / 'intervals.png'}, "
        f"{out / 'table.md'} (ranges, more figures, intervals, P(A better than B)), runs.csv"
    )
    if errors:
        raise SystemExit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
