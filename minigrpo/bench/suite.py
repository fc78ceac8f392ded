"""Measure speed and quality, print them as tables and, when asked, write them into the results
pages. Speed goals are checked here, never in tests.

    python -m minigrpo.bench --write-docs    # every section, written into docs/
    python -m minigrpo.bench --quick         # sampling and threads only, printed
    python -m minigrpo.bench --only grpo,presets                # printed
    python -m minigrpo.bench --only grpo,presets --write-docs   # and written into docs/results.md

Sections: machine; the speed sections of speed.py (sampling: KV cache vs the slow path; threads;
scale, only on request: a 6 x 384 model, where a GPU wins; prefix: the shared-prefix forward against
the plain one); pretrain (pretraining.py: the default command over --seeds, with its exact quality
report, beside the minibatch recipe it replaced); then the RL sections of rl_sections.py (grpo,
presets, targets, rarest, custom) and common.py (optimum), each a median (min–max) over --seeds and
checked against the bars of minigrpo/tools/bars.py; grpo adds the spill-over figure and the per-step
time of a 4-layer model; models (models.py): default GRPO and PPO from each of the pretrain
section's models; step (step.py, in process): that GRPO step against TRL's GRPOTrainer, paired, when
trl is importable (otherwise through a plain/TRL ratio recorded on this machine); population
(population.py): P default GRPO runs as one lockstep population against P, with where the time goes;
sweep (sweep.py): compare's default list over 5 seeds (128 on a GPU) as one timed command;
comparing (comparing.py, only on request: 90 runs): compare's default list over 10 seeds, its IQMs,
intervals and differences written into docs/experiments.md's "Comparing algorithms"; world
(world.py, a task other than food, the default with its --task): its pretraining report and its
default GRPO command over --seeds, written into docs/worlds.md's block world-<task>; thinking
(thinking.py, the sums world's with `--task sums`: 50 runs): four experiments on thinking, length,
pass@k and entropy, written into docs/experiments.md's block thinking-sums.
Subprocess runs write under --out (default runs/bench), --jobs at a time. The tables are printed;
the tracked pages are left alone unless asked: with --write-docs (or a --docs folder named) each
section's tables replace its own block in --docs (default docs/: performance.md for the speed
sections, results.md for the others; pages.py), the rest of each page kept.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minigrpo.bench import pages
from minigrpo.bench.common import bench_optimum, pretrain_name
from minigrpo.bench.comparing import bench_comparing
from minigrpo.bench.entropy import bench_entropy
from minigrpo.bench.mismatch import bench_mismatch
from minigrpo.bench.models import bench_models
from minigrpo.bench.population import bench_population
from minigrpo.bench.pretraining import bench_pretrain, ensure_pretrained, task_init
from minigrpo.bench.rl_sections import bench_grpo, bench_presets, bench_rarest, bench_targets
from minigrpo.bench.speed import bench_prefix, bench_sampling, bench_scale, bench_threads
from minigrpo.bench.step import bench_step
from minigrpo.bench.sweep import bench_sweep
from minigrpo.bench.thinking import bench_thinking
from minigrpo.bench.world import bench_world
from minigrpo.util.cli import UsageError, main_guard, meta, parse_config
from minigrpo.util.outputs import prepare_out
from minigrpo.util.runtime import cores, setup_runtime
from toy_tasks import get_task

SECTIONS = [
    "sampling",
    "threads",
    "scale",
    "prefix",
    "pretrain",
    "grpo",
    "presets",
    "targets",
    "rarest",
    "custom",
    "optimum",
    "models",
    "entropy",
    "mismatch",
    "step",
    "population",
    "sweep",
    "comparing",
    "world",
    "thinking",
]
ON_REQUEST = ("scale", "comparing", "world", "thinking")


@dataclass
class BenchConfig:
    quick: bool = field(
        default=False, metadata={"help": "only the fast sections (sampling, threads)"}
    )
    task: str = field(
        default="food",
        metadata=meta(
            "toy task for the pretrain, grpo, presets and world sections; another than food "
            "without --only: the world section alone"
        ),
    )
    only: str | None = field(
        default=None, metadata={"help": f"comma-separated sections of {', '.join(SECTIONS)}"}
    )
    out: str = field(
        default="runs/bench", metadata={"help": "folder for the runs the bench starts"}
    )
    seeds: int = field(
        default=5,
        metadata=meta(
            "seeds per configuration in the pretrain, grpo, presets, rarest, custom, models and "
            "world sections (models: as many pretrained models, each with that many RL seeds; "
            "world: that many default GRPO runs from one model)"
        ),
    )
    jobs: int = field(
        default=0, metadata={"help": "runs at a time in the RL sections (0 = the number of cores)"}
    )
    threads: int = field(
        default=1, metadata={"help": "torch CPU threads for the in-process sections"}
    )
    device: str = field(
        default="cpu", metadata={"help": "auto, cpu or cuda", "choices": ["auto", "cpu", "cuda"]}
    )
    write_docs: bool = field(
        default=False,
        metadata={
            "help": "write each section's tables into the results pages in --docs (default: "
            "printed only, the tracked pages left alone)"
        },
    )
    docs: str = field(
        default="docs",
        metadata=meta(
            "folder of the results pages the sections rewrite with --write-docs (results.md, "
            "performance.md); naming it asks for the writing too"
        ),
    )


def block_names(
    section: str, task: str, result: str | dict[str, str], device: str = "cpu"
) -> dict[str, str]:
    """{block name in the pages: markdown} of one section's result; a task other than food names its
    own blocks (grpo-arithmetic), and so does a GPU (population-cuda), so neither overwrites food's
    on the CPU."""
    parts = result if isinstance(result, dict) else {section: result}
    gpu = "-cuda" if device.startswith("cuda") else ""
    return {
        (name if task == "food" else f"{name}-{task}") + gpu: text for name, text in parts.items()
    }


@main_guard
def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg, _ = parse_config(BenchConfig, argv, description=__doc__.split("\n\n")[0])
    # the tracked pages are rewritten only when asked: --write-docs, or a --docs folder named
    write_docs = cfg.write_docs or any(a == "--docs" or a.startswith("--docs=") for a in argv)
    sections = SECTIONS[:2] if cfg.quick else [s for s in SECTIONS if s not in ON_REQUEST]
    if cfg.task != "food" and not cfg.quick:  # another task's bench: its own world
        sections = ["world", "thinking"] if cfg.task == "sums" else ["world"]
    # an empty --only is a mistake, not "everything" (a whole bench takes long)
    if cfg.only is not None:
        sections = [s.strip() for s in cfg.only.split(",")]
        bad = [s or "''" for s in sections if s not in SECTIONS]
        if bad:
            raise UsageError(
                f"unknown --only section(s) {', '.join(bad)} (available: {', '.join(SECTIONS)})"
            )
    try:
        get_task(cfg.task)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if cfg.seeds < 1 or cfg.jobs < 0:
        raise UsageError(f"--seeds must be >= 1 and --jobs >= 0, got {cfg.seeds} and {cfg.jobs}")
    if cfg.task != "food" and any(
        s in sections
        for s in (
            "targets",
            "rarest",
            "custom",
            "optimum",
            "models",
            "entropy",
            "mismatch",
            "prefix",
        )
    ):
        raise UsageError(
            "the targets, rarest, custom, optimum, models, entropy, mismatch and prefix sections "
            "are food's (people and foods): use --task food"
        )
    if cfg.task != "sums" and "thinking" in sections:
        raise UsageError("the thinking section is the sums world's: use --task sums")
    if cfg.task == "food" and "world" in sections:
        raise UsageError(
            "the world section is another task's own world (e.g. --task sums); food's tables are "
            "the other sections'"
        )
    jobs = cfg.jobs or cores()
    device = setup_runtime(cfg.threads, cfg.device)
    # one line for an impossible or read-only folder; one bench per folder
    out = prepare_out(cfg.out, runs_inside="bench")
    print(
        f"machine: {platform.machine()} {cores()} cores | torch {torch.__version__} | device "
        f"{device} | threads {torch.get_num_threads()} | python {platform.python_version()}",
        flush=True,
    )
    runners = {
        "sampling": lambda: bench_sampling(device),
        "threads": lambda: bench_threads(device),
        "scale": lambda: bench_scale(device),
        "prefix": lambda: bench_prefix(out, task_init(out, "food")),
        "pretrain": lambda: bench_pretrain(out, cfg.task, cfg.seeds),
        "grpo": lambda: bench_grpo(out, cfg.task, cfg.seeds, jobs),
        "presets": lambda: bench_presets(out, cfg.task, cfg.seeds, jobs),
        "targets": lambda: bench_targets(out, jobs),
        "rarest": lambda: bench_rarest(out, cfg.seeds, jobs),
        "custom": lambda: bench_rarest(out, cfg.seeds, jobs, custom=True),
        "optimum": lambda: bench_optimum(out, task_init(out, "food"), cfg.seeds, jobs),
        "models": lambda: bench_models(
            out,
            [
                ensure_pretrained(out, pretrain_name("pretrain", "defaults", k), ["--seed", str(k)])
                for k in range(cfg.seeds)
            ],
            cfg.seeds,
            jobs,
        ),
        "entropy": lambda: bench_entropy(out, task_init(out, "food"), cfg.seeds),
        "mismatch": lambda: bench_mismatch(out, task_init(out, "food"), cfg.seeds, jobs),
        "step": lambda: bench_step(),
        "population": lambda: bench_population(out, task_init(out, "food"), str(device)),
        "sweep": lambda: bench_sweep(out, task_init(out, "food"), str(device)),
        "comparing": lambda: bench_comparing(out, task_init(out, "food")),
        "world": lambda: bench_world(out, cfg.task, cfg.seeds, jobs),
        "thinking": lambda: bench_thinking(out),
    }
    docs = Path(cfg.docs) if write_docs else None
    if docs is not None and docs.exists() and not docs.is_dir():
        raise UsageError(f"--docs {cfg.docs} is a file, not a folder of results pages")
    line = pages.header(pages.machine(), sections) if docs is not None else ""
    for s in sections:
        blocks = block_names(s, cfg.task, runners[s](), str(device))
        print("\n".join(blocks.values()), flush=True)
        if docs is not None:
            try:
                written = pages.write_blocks(docs, blocks, line)
            except ValueError as e:
                raise UsageError(str(e)) from None
            print(f"wrote {', '.join(map(str, written))}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
