"""Measure speed and quality, and print them as tables. Speed goals are checked here, never in tests.

    python -m minigrpo.bench            # everything (several minutes on 2 CPU cores)
    python -m minigrpo.bench --quick    # sampling and threads only (seconds)
    python -m minigrpo.bench --only grpo,presets

Sections: machine; sampling (KV cache vs the slow full-recompute path at batch 8/64/512, 16 new
tokens, and their log-prob agreement); threads (one pretraining step at 1 and 2 threads); pretrain
(the default command, timed, with its exact quality report); grpo (the default command and a rare
target as whole processes, timed; the per-step time on a 4-layer 128-wide model); presets (every
--preset: steps and seconds to 0.9, final target rate, exact KL, worst drift, malformed mass).
Subprocess runs write under --out (default runs/bench).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minigrpo.cli import UsageError, main_guard, parse_config, setup_runtime
from minigrpo.model import GPT, GPTConfig
from minigrpo.optim import AdamW
from minigrpo.sampling import generate
from toy_tasks import default_pretrain_dir, get_task

SECTIONS = ["sampling", "threads", "pretrain", "grpo", "presets"]


@dataclass
class BenchConfig:
    quick: bool = field(default=False, metadata={"help": "only the fast sections (sampling, threads)"})
    task: str = field(default="food", metadata={"help": "toy task for the pretrain, grpo and presets sections"})
    only: str | None = field(default=None, metadata={"help": f"comma-separated sections of {','.join(SECTIONS)}"})
    out: str = field(default="runs/bench", metadata={"help": "folder for the runs the bench starts"})
    threads: int = field(default=1, metadata={"help": "torch CPU threads for the in-process sections"})
    device: str = field(default="cpu", metadata={"help": "auto, cpu or cuda", "choices": ["auto", "cpu", "cuda"]})


def table(title: str, header: list[str], rows: list[list]) -> str:
    cells = [header] + [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    fmt = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([f"\n### {title}", fmt(cells[0]), sep] + [fmt(r) for r in cells[1:]])


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
            return generate(model, prompt, max_new_tokens=new, generator=torch.Generator(device=device).manual_seed(seed),
                            use_cache=cache)
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


def bench_threads(device) -> str:
    import torch.nn.functional as F
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=26, block_size=32)).to(device)
    opt = AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 26, (128, 24), device=device)
    def step():
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    rows = []
    for n in (1, 2):
        torch.set_num_threads(n)
        rows.append([n, f"{1000 * _time(step, 10):.1f}"])
    torch.set_num_threads(1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return table(f"threads: one pretraining step (batch 128 x 23 tokens), 1-min load average {load:.2f}",
                 ["threads", "ms/step (median of 10)"], rows)


def _run_cli(args: list[str]) -> tuple[float, str]:
    """Run `python -m minigrpo.<args>` as a whole process; -> (wall seconds, output)."""
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
    return wall, p.stdout


def bench_pretrain(out: Path, task: str) -> str:
    folder = out / default_pretrain_dir(task).split("/")[-1]
    wall, _ = _run_cli(["minigrpo.pretrain", "--task", task, "--out", str(folder)])
    s = json.loads((folder / "summary.json").read_text())
    return table(f"pretrain: `python -m minigrpo.pretrain --task {task}` (defaults, seed 0)",
                 ["whole process s", "training s", "val loss / floor", "quality bar"],
                 [[f"{wall:.1f}", f"{s['train_seconds']:.1f}", f"+{100 * s['val_over_floor']:.2f}%",
                   "PASS" if s["report"]["ok"] else "FAIL"]]) + "\n" + get_task(task).format_report(s["report"])


def _ensure_pretrained(out: Path, name: str, extra: list[str]) -> Path:
    ckpt = out / name / "model.pt"
    if not ckpt.exists():
        _run_cli(["minigrpo.pretrain", "--out", str(out / name), *extra])
    return ckpt


def _task_init(out: Path, task: str) -> Path:
    return _ensure_pretrained(out, default_pretrain_dir(task).split("/")[-1], ["--task", task])


RARE_TARGET = ["--reward", "food:apple pie", "--steps", "80", "--lr", "1.5e-3", "--group-size", "16", "--prompts-per-step", "2"]


def _grpo_row(label, args, out: Path, init: Path, cli: str = "minigrpo.grpo") -> list:
    folder = out / label
    wall, _ = _run_cli([cli, "--init", str(init), "--out", str(folder), "--quiet", *args])
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "target_rate" in r]
    first = next((r for r in evals if r["target_rate"] >= 0.9), None)
    steps_to = first["step"] if first else "-"
    secs_to = f"{sum(r.get('step_time', 0) for r in rows if r['step'] <= first['step']):.2f}" if first else "-"
    last = evals[-1]
    kl = next((r["kl_exact"] for r in reversed(rows) if "kl_exact" in r), float("nan"))
    heldout = f"{last['heldout_rate']:.3f}" if "heldout_rate" in last else "-"
    return [label, f"{wall:.1f}", steps_to, secs_to, f"{last['target_rate']:.3f}", heldout, f"{kl:.4f}",
            f"{last['worst_drift']:.3f}", f"{last['malformed']:.4f}"]


GRPO_HEADER = ["run", "whole process s", "steps to 0.9", "train s to 0.9", "final exact target", "held-out", "exact KL/token",
               "worst drift (bar 0.05)", "malformed (bar 0.01)"]


def bench_grpo(out: Path, task: str) -> str:
    init = _task_init(out, task)
    if task != "food":  # the task's own defaults (RL_DEFAULTS), GRPO and PPO
        rows = [_grpo_row(f"{cli}-{task} (default)", ["--task", task], out, init, f"minigrpo.{cli}") for cli in ("grpo", "ppo")]
        return table(f"grpo and ppo on {task}: whole processes (imports, training, final evaluation)", GRPO_HEADER, rows)
    rows = [_grpo_row("grpo-pizza (default)", ["--reward", "pizza", "--eval-every", "1"], out, init),
            _grpo_row("grpo-apple-pie (rare, p=0.02)", RARE_TARGET + ["--eval-every", "1"], out, init),
            _grpo_row("grpo-pizza --no-preserve", ["--reward", "pizza", "--eval-every", "1", "--no-preserve"], out, init),
            _grpo_row("ppo-pizza (default)", ["--reward", "pizza", "--eval-every", "1"], out, init, "minigrpo.ppo"),
            _grpo_row("ppo-pizza --critic head", ["--reward", "pizza", "--eval-every", "1", "--critic", "head"], out, init,
                      "minigrpo.ppo")]
    text = table("grpo and ppo: whole processes (imports, training, final evaluation)", GRPO_HEADER, rows)
    text += spillover(out / "grpo-pizza (default)", out / "grpo-pizza --no-preserve", out / "spillover.png")
    big = _ensure_pretrained(out, "pretrain-4x128", ["--n-layer", "4", "--n-head", "4", "--n-embd", "128", "--steps", "300"])
    folder = out / "grpo-step-time"
    _run_cli(["minigrpo.grpo", "--init", str(big), "--out", str(folder), "--quiet", "--prompts-per-step", "1",
              "--group-size", "8", "--max-new-tokens", "12", "--updates", "1", "--no-preserve", "--threads", "1",
              "--steps", "40", "--eval-every", "1000"])
    times = [json.loads(line)["step_time"] for line in (folder / "metrics.jsonl").read_text().splitlines()
             if "step_time" in json.loads(line)]
    text += table("grpo per-step time: 4-layer 128-wide model, 1 prompt x 8 completions, 12 new tokens, μ=1, "
                  "--no-preserve, 1 thread", ["steps", "median ms", "p90 ms"],
                  [[len(times), f"{1000 * statistics.median(times[5:]):.1f}",
                    f"{1000 * sorted(times[5:])[int(0.9 * len(times[5:]))]:.1f}"]])
    return text


def spillover(with_preserve: Path, without: Path, png: Path) -> str:
    """Each person's exact pizza share before RL and after it, with and without preservation:
    a table, and the same as a grouped bar chart in `png`."""
    a = json.loads((with_preserve / "summary.json").read_text())
    b = json.loads((without / "summary.json").read_text())
    people = list(a["baseline_pizza_shares"])
    rows = [[p, f"{a['baseline_pizza_shares'][p]:.3f}", f"{a['pizza_shares'][p]:.3f}", f"{b['pizza_shares'][p]:.3f}"]
            for p in people]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3.2))
    x = range(len(people))
    for i, (label, shares) in enumerate([("pretrained", a["baseline_pizza_shares"]), ("GRPO, preservation on", a["pizza_shares"]),
                                         ("GRPO --no-preserve", b["pizza_shares"])]):
        ax.bar([j + (i - 1) * 0.27 for j in x], [shares[p] for p in people], width=0.27, label=label)
    ax.set_xticks(list(x), people)
    ax.set_ylabel("exact P(pizza)")
    ax.set_title("GRPO on 'ravin likes ' only: everyone's pizza share (spill-over when unpreserved)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)
    return table(f"spill-over: exact P(pizza) per person (figure: {png})",
                 ["person", "pretrained", "after GRPO (preservation on)", "after GRPO --no-preserve"], rows)


def bench_presets(out: Path, task: str) -> str:
    from minigrpo.grpo import PRESETS
    init = _task_init(out, task)
    every = ["--eval-every", "1"] if task == "food" else []  # food's exact evaluation is cheap enough for every step
    rows = [_grpo_row(f"{name}-{task}" if task != "food" else name, ["--preset", name, "--task", task, *every],
                      out, init) for name in PRESETS]
    return table(f"presets on {task} (the task's default reward), seed 0", GRPO_HEADER, rows)


@main_guard
def main(argv=None):
    cfg, _ = parse_config(BenchConfig, argv, description=__doc__.split("\n\n")[0])
    sections = SECTIONS[:2] if cfg.quick else SECTIONS
    if cfg.only:
        sections = [s.strip() for s in cfg.only.split(",")]
        bad = [s for s in sections if s not in SECTIONS]
        if bad:
            raise UsageError(f"unknown --only section(s) {', '.join(bad)} (available: {', '.join(SECTIONS)})")
    try:
        get_task(cfg.task)
    except ValueError as e:
        raise UsageError(str(e)) from None
    device = setup_runtime(cfg.threads, cfg.device)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"machine: {platform.machine()} {cores} cores | torch {torch.__version__} | device {device} | "
          f"threads {torch.get_num_threads()} | python {platform.python_version()}", flush=True)
    runners = {"sampling": lambda: bench_sampling(device), "threads": lambda: bench_threads(device),
               "pretrain": lambda: bench_pretrain(out, cfg.task), "grpo": lambda: bench_grpo(out, cfg.task),
               "presets": lambda: bench_presets(out, cfg.task)}
    for s in sections:
        print(runners[s](), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
