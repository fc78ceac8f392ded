"""bench's thinking section: four experiments on the sums world (issue 54), every figure exact.
It runs one compare sweep from the bench's sums model, `python -m minigrpo.compare --task sums
--reward correct --algos <ALGOS> --seeds 10 --budget fixed --steps 30` (compare keeps the finished
runs of the same command and code), then writes into docs/experiments.md's block `thinking`:

  (a) length and thinking   the default run's exact think rate, mean length (right and wrong
                            answers apart) and accuracy over the steps, medians (IQR) over the
                            seeds; the step the think rate passes 0.5; π_ref's and the final
                            policy's think rate and accuracy by number of operands (checkpoints)
  (b) length normalisation  GRPO's per-sequence mean (`seq-mean-token-mean`, the default) against a
                            constant (`seq-mean-token-sum-norm`, Dr. GRPO's): the exact mean length
                            of wrong answers over the steps, and its final IQM, difference and test
  (c) pass@k                π_ref's and the final policies' exact pass@k, k = 1 … 256, per prompt
                            1 − (1 − p(x))^k averaged, and the share of prompts whose pass@64 the
                            training lowered
  (d) entropy               the exact sequence entropy over the steps for the default, Clip-Cov,
                            KL-Cov and an entropy bonus, with the final accuracy each kept

A final figure's IQM, its difference from the default's and their 95 % BCa intervals and
permutation p come from tools/stats.py, as compare's; a difference is called with
tools/intervals.MIN_RUNS runs, an interval that leaves out 0 and p < ALPHA, not Holm-adjusted as
compare's: each test answers its own question, and in (d), three against the default, none is
called, which an adjustment (it only raises p) would not change.

    python -m minigrpo.bench --task sums --only thinking     # 50 runs of 30 steps
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from minigrpo.bench.common import run_module
from minigrpo.bench.pretraining import task_init
from minigrpo.bench.thinking_figure import draw
from minigrpo.lm.checkpoint import load_checkpoint
from minigrpo.tools.intervals import ALPHA, MIN_RUNS
from minigrpo.tools.stamps import finished
from minigrpo.tools.stats import difference_interval, iqm_interval, permutation_p
from minigrpo.util.jsonl import read_jsonl
from toy_tasks.sums_exact import layout, support_probs_many
from toy_tasks.sums_world import OPERANDS, PROMPTS

DEFAULT, CONSTANT = "default", "default@loss_agg=seq-mean-token-sum-norm"
ENTROPY_ALGOS = [DEFAULT, "clip_cov", "kl_cov", "default@entropy_coef=0.01"]
ALGOS = [DEFAULT, CONSTANT, *ENTROPY_ALGOS[1:]]
SEEDS, STEPS = 10, 30
COMMAND = [
    "minigrpo.compare",
    *("--task", "sums", "--reward", "correct", "--algos", ",".join(ALGOS)),
    *("--seeds", str(SEEDS), "--budget", "fixed", "--steps", str(STEPS), "--engine", "pool"),
]
FIGURES = ("exact_len_mean_wrong", "exact_accuracy", "exact_entropy", "exact_think_rate")
SHOWN = (0, 5, 10, 15, 20, 25, 30)  # the steps the tables show
PASS_K = (1, 4, 16, 64, 256)


def bench_thinking(out: Path) -> str:
    """Pretrain the sums model (once, under out), run the sweep, -> the block."""
    init, folder = task_init(out, "sums"), out / "thinking"
    _, error, _ = run_module([*COMMAND, "--init", str(init), "--out", str(folder)])
    if error is not None:
        return f"thinking: `python -m {' '.join(COMMAND)}` failed: {error}"
    return thinking_block(folder, init)


def read_runs(folder: Path, seeds: int = SEEDS) -> dict[str, list[Path]]:
    """{algorithm: its finished runs' folders}, in ALGOS order."""
    return {a: [f for s in range(seeds) if finished(f := folder / f"{a}-s{s}")] for a in ALGOS}


def series(run: Path, key: str) -> dict[int, float]:
    """{step: the run's exact `key`} over its evaluations."""
    return {r["step"]: r[key] for r in read_jsonl(run / "metrics.jsonl") if key in r}


def finals(runs: dict[str, list[Path]], algo: str, key: str) -> list[float]:
    """Each of algo's runs' `key` at its last step (STEPS)."""
    return [series(r, key)[STEPS] for r in runs[algo]]


def spread(values) -> str:
    """'median (q25–q75)' of the finite values, '–' without any."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if v.size == 0:
        return "–"
    q = np.percentile(v, [50, 25, 75])
    digits = 2 if np.abs(q).max() >= 1 else 3
    return f"{q[0]:.{digits}f} ({q[1]:.{digits}f}–{q[2]:.{digits}f})"


def over_steps(runs: dict[str, list[Path]], columns: list[tuple[str, str, str]]) -> list[str]:
    """A markdown table: a row per shown step, a column per (header, algorithm, key): medians
    (IQR) over the algorithm's runs."""
    data = {(a, k): [series(r, k) for r in runs[a]] for _, a, k in columns}
    lines = ["| step | " + " | ".join(h for h, _, _ in columns) + " |"]
    lines.append("|---:|" + "---|" * len(columns))
    for s in SHOWN:
        cells = [spread([d.get(s) for d in data[(a, k)]]) for _, a, k in columns]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines


def final_test(runs: dict[str, list[Path]], key: str, algo: str, base: str = DEFAULT) -> dict:
    """The final `key` of algo against base: IQMs with intervals, difference, p, the call."""
    a, b = finals(runs, algo, key), finals(runs, base, key)
    k = _key(key, algo)
    d, p = difference_interval(a, b, key=k), permutation_p(a, b, key=k)
    called = min(len(a), len(b)) >= MIN_RUNS and d.excludes(0) and p < ALPHA
    return {
        "iqm": iqm_interval(a, k),
        "d": d,
        "p": p,
        "called": called,
        "n": len(a),
    }


def _key(key: str, algo: str) -> tuple[int, int]:
    """A bootstrap's key (tools/stats: integers): the figure's place and the algorithm's."""
    return (FIGURES.index(key), ALGOS.index(algo))


def _est(e, digits: int = 3) -> str:
    return f"{e.value:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"


def _p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"= {p:.3f}"


def _said(t: dict) -> str:
    if t["n"] < MIN_RUNS:
        return f"not called (n = {t['n']} < {MIN_RUNS})"
    return ("higher" if t["d"].value > 0 else "lower") if t["called"] else "no difference shown"


def policies(runs: list[Path], init: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact per-prompt accuracy and think rate on the RL prompts of π_ref (row 0) and of each
    run's final policy (rows 1 …): two (1 + len(runs), len(PROMPTS)) float64 tensors."""
    models, tok = [], None
    for path in [init, *(r / "model.pt" for r in runs)]:
        model, tok, _ = load_checkpoint(path)
        models.append(model.eval())
    with torch.no_grad():
        probs = support_probs_many(models, tok, PROMPTS)
    lay = layout(tuple(PROMPTS))
    return (probs * lay.correct).sum(-1), (probs * lay.worked).sum(-1)


def by_operands(accuracy: torch.Tensor, think: torch.Tensor) -> tuple[list[str], dict]:
    """π_ref's and the final policies' (median (min–max)) think rate and accuracy per operands;
    -> the table and {operands: the final policies' median think rate}."""
    lines = ["| operands | prompts | π_ref think | final think | π_ref accuracy | final accuracy |"]
    lines.append("|---:|---:|---:|---:|---:|---:|")
    final = {}
    for n in OPERANDS:
        mine = torch.tensor([len(p) == 2 * n for p in PROMPTS])
        t, a = think[:, mine].mean(1), accuracy[:, mine].mean(1)
        final[n] = t[1:].median().item()
        lines.append(
            f"| {n} | {int(mine.sum())} | {t[0]:.3f} | {_mm(t[1:])} | {a[0]:.3f} | {_mm(a[1:])} |"
        )
    return lines, final


def _mm(x: torch.Tensor) -> str:
    """'median (min–max)' of a 1-D tensor."""
    return f"{x.median():.3f} ({x.min():.3f}–{x.max():.3f})"


def pass_at(accuracy: torch.Tensor) -> tuple[list[str], dict]:
    """The pass@k table: π_ref's, the final policies' (median (min–max) over the runs), and the
    share of prompts whose pass@k a run lowered; -> the table and {k: the most any run lowered
    a prompt's pass@k (0 if none)}."""
    lines = [
        "| k | π_ref | final policies | final − π_ref | prompts lowered (%) |",
        "|---:|---:|---:|---:|---:|",
    ]
    worst = {}
    for k in PASS_K:
        each = 1 - (1 - accuracy.clamp(0, 1)) ** k  # (1 + runs, prompts)
        at, change = each.mean(1), each[1:] - each[:1]
        lowered = 100 * (change < -1e-9).double().mean(1)
        worst[k] = max(0.0, -change.min().item())
        lines.append(
            f"| {k} | {at[0]:.4f} | {_mm(at[1:])} | {_mm(at[1:] - at[0])} | {_mm(lowered)} |"
        )
    return lines, worst


def crossing(run: Path, key: str = "exact_think_rate", level: float = 0.5) -> float:
    """The first step whose `key` is >= level (NaN if none)."""
    return next((s for s, v in sorted(series(run, key).items()) if v >= level), float("nan"))


def thinking_block(folder: Path, init: Path) -> str:
    """The section's markdown from the runs in `folder` and π_ref `init` (module docstring)."""
    runs = read_runs(folder)
    if not runs[DEFAULT]:
        return f"thinking: no finished default runs in {folder}"
    n = {a: len(r) for a, r in runs.items()}
    accuracy, think = policies(runs[DEFAULT], init)
    cross = np.array([crossing(r) for r in runs[DEFAULT]], dtype=float)
    operand_table, thinks = by_operands(accuracy, think)
    length = [[series(r, "exact_len_mean")[s] for r in runs[DEFAULT]] for s in (0, STEPS)]
    most, least = max(thinks, key=thinks.get), min(thinks, key=thinks.get)
    lines = [
        f"Runs: `python -m {' '.join(COMMAND)}` from the bench's sums model (runs per algorithm: "
        + ", ".join(f"{a} {k}" for a, k in n.items())
        + "). Every figure is exact under the policy at that step (docs/worlds.md, the sums "
        "world); medians (25th–75th percentile) over the seeds unless named otherwise; final "
        "IQMs with 95 % BCa intervals (tools/stats.py).",
        "",
        "### (a) Does length grow with a correctness reward alone, and when does thinking "
        "take over?",
        "",
        "Setup: the default GRPO run, reward `correct` (1 for the right sum, nothing for length), "
        f"{n[DEFAULT]} seeds, {STEPS} steps.",
        "",
        *over_steps(
            runs,
            [
                ("think rate", DEFAULT, "exact_think_rate"),
                ("length", DEFAULT, "exact_len_mean"),
                ("length right", DEFAULT, "exact_len_mean_correct"),
                ("length wrong", DEFAULT, "exact_len_mean_wrong"),
                ("accuracy", DEFAULT, "exact_accuracy"),
                ("held-out think", DEFAULT, "exact_think_rate_heldout"),
            ],
        ),
        "",
        "By number of operands, π_ref and the final policies (median (min–max) over the seeds):",
        "",
        *operand_table,
        "",
        f"Conclusion: the think rate passes 0.5 at step {np.nanmedian(cross):.0f} (seeds "
        f"{np.nanmin(cross):.0f}–{np.nanmax(cross):.0f}; NaN: never), and the mean length goes "
        f"from {np.median(length[0]):.1f} to {np.median(length[1]):.1f} tokens (medians) with it, "
        "though the reward says nothing of length: a worked answer is longer and more often "
        f"right. At the end the policies think most on {most} operands ({thinks[most]:.3f}) and "
        f"least on {least} ({thinks[least]:.3f}), where a direct answer was right most often "
        "under π_ref (the table above).",
        "",
    ]
    lines += _normalisation(runs, n)
    lines += _pass_at(accuracy, n)
    lines += _entropy(runs, n)
    draw(panels(runs), folder / "thinking.png")
    lines += [
        "Figure: `thinking.png` in the sweep's folder (`runs/bench/thinking/` by default): medians "
        "with the 25th–75th percentile band over the seeds.",
        "",
    ]
    return "\n".join(lines)


def panels(runs: dict[str, list[Path]]) -> dict[str, dict[str, tuple]]:
    """The figure's panels: {title: {label: (steps, one row of values per run)}}."""

    def curve(algo: str, key: str) -> tuple:
        rows = [series(r, key) for r in runs[algo]]
        steps = sorted(set.intersection(*(set(r) for r in rows)))
        return steps, [[r[s] for s in steps] for r in rows]

    return {
        "(a) exact think rate, default": {DEFAULT: curve(DEFAULT, "exact_think_rate")},
        "(a) exact mean length (tokens)": {DEFAULT: curve(DEFAULT, "exact_len_mean")},
        "(b) length of wrong answers": {
            "per-sequence (default)": curve(DEFAULT, "exact_len_mean_wrong"),
            "constant": curve(CONSTANT, "exact_len_mean_wrong"),
        },
        "(d) exact entropy (nats)": {a: curve(a, "exact_entropy") for a in ENTROPY_ALGOS},
    }


def _normalisation(runs: dict, n: dict) -> list[str]:
    t = final_test(runs, "exact_len_mean_wrong", CONSTANT)
    wrong = finals(runs, DEFAULT, "exact_len_mean_wrong")
    base = iqm_interval(wrong, _key("exact_len_mean_wrong", DEFAULT))
    acc = final_test(runs, "exact_accuracy", CONSTANT)
    think = final_test(runs, "exact_think_rate", CONSTANT)
    thinks = iqm_interval(
        finals(runs, DEFAULT, "exact_think_rate"),
        _key("exact_think_rate", DEFAULT),
    )
    return [
        "### (b) Does GRPO's per-sequence normalisation lengthen wrong answers?",
        "",
        "Setup: the default (`--loss-agg seq-mean-token-mean`: each sequence's token mean, the "
        "sequences' mean; Dr. GRPO, arXiv 2503.20783, argues that dividing by |o_i| favours long "
        "wrong answers) against a constant normaliser (`seq-mean-token-sum-norm`: token sums over "
        f"B·T_max, Dr. GRPO's), all else the default; {n[DEFAULT]} and {n[CONSTANT]} seeds.",
        "",
        *over_steps(
            runs,
            [
                ("length wrong, per-sequence", DEFAULT, "exact_len_mean_wrong"),
                ("length wrong, constant", CONSTANT, "exact_len_mean_wrong"),
                ("length, per-sequence", DEFAULT, "exact_len_mean"),
                ("length, constant", CONSTANT, "exact_len_mean"),
            ],
        ),
        "",
        f"Final mean length of wrong answers, IQM: per-sequence {_est(base, 2)}, constant "
        f"{_est(t['iqm'], 2)}; constant − per-sequence {_est(t['d'], 2)}, permutation p "
        f"{_p(t['p'])}: {_said(t)}. Final accuracy, constant − per-sequence {_est(acc['d'])}, p "
        f"{_p(acc['p'])}: {_said(acc)}. A wrong answer is 3 tokens at once and 10 to 28 worked, so "
        "the wrong answers' length follows the think rate too: final think rate IQM per-sequence "
        f"{_est(thinks)}, constant {_est(think['iqm'])} (difference {_est(think['d'])}, p "
        f"{_p(think['p'])}: {_said(think)}).",
        "",
    ]


def _pass_at(accuracy: torch.Tensor, n: dict) -> list[str]:
    table, worst = pass_at(accuracy)
    lowest = accuracy.min(1).values
    return [
        "### (c) Does RL narrow what the model can reach (pass@1 against pass@k)?",
        "",
        f"Setup: π_ref and the default runs' final policies ({n[DEFAULT]} seeds), each prompt's "
        "exact accuracy p(x) over its declared support; pass@k = mean over the RL prompts of "
        "1 − (1 − p(x))^k (Yue et al., arXiv 2504.13837, sample it).",
        "",
        *table,
        "",
        f"Conclusion: the lowest per-prompt accuracy is {lowest[0]:.3f} under π_ref and "
        f"{_mm(lowest[1:])} under the final policies. The most any run lowered a prompt's pass@k: "
        + ", ".join(f"{worst[k]:.2g} at k = {k}" for k in PASS_K)
        + ". Where π_ref already reaches every prompt with some mass on its right answer, pass@k "
        "at large k is 1 before and after, and narrowing can show only as a lowered per-prompt "
        "pass@k at small k (the last column).",
        "",
    ]


def _entropy(runs: dict, n: dict) -> list[str]:
    columns = [(f"entropy, {a}", a, "exact_entropy") for a in ENTROPY_ALGOS]
    start, end = ([series(r, "exact_entropy")[s] for r in runs[DEFAULT]] for s in (0, STEPS))
    rows = [
        "| algorithm | runs | final entropy IQM | − default | p | final accuracy IQM | "
        "final think rate IQM |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    said, diffs = {}, []
    for a in ENTROPY_ALGOS:
        final = {k: finals(runs, a, k) for k in FIGURES}
        acc = iqm_interval(final["exact_accuracy"], _key("exact_accuracy", a))
        think = iqm_interval(final["exact_think_rate"], _key("exact_think_rate", a))
        if a == DEFAULT:
            ent = iqm_interval(final["exact_entropy"], _key("exact_entropy", a))
            diff = "–"
        else:
            t = final_test(runs, "exact_entropy", a)
            ent, diff = t["iqm"], f"{_est(t['d'])} ({_said(t)}) | {t['p']:.3f}"
            said[a], diffs = _said(t), [*diffs, t["d"].value]
        diff = diff if a != DEFAULT else "– | –"
        rows.append(f"| {a} | {n[a]} | {_est(ent)} | {diff} | {_est(acc)} | {_est(think)} |")
    return [
        "### (d) Does the entropy collapse, and do its controls hold it?",
        "",
        "Setup: the default against Clip-Cov and KL-Cov (Cui et al., arXiv 2505.22617, presets "
        "`clip_cov`, `kl_cov`) and an entropy bonus (`--entropy-coef 0.01`); the entropy is "
        "−Σ π log π over each prompt's declared support, nats per completion.",
        "",
        *over_steps(runs, columns),
        "",
        *rows,
        "",
        f"Conclusion: the default's entropy goes from {np.median(start):.3f} to "
        f"{np.median(end):.3f} nats (medians) in {STEPS} steps as the policy settles on its "
        f"answers and on working the steps. The controls' final entropy lies {min(diffs):+.3f} to "
        f"{max(diffs):+.3f} nats from the default's (IQMs): "
        + "; ".join(f"{a} {w}" for a, w in said.items())
        + ". A control that keeps the entropy must move it by more than the seeds' spread to show.",
        "",
    ]
