"""Pretrain a tiny character-level GPT on a toy task's corpus.

    python -m minigrpo.pretrain                      # food task -> runs/pretrain/
    python -m minigrpo.pretrain --task arithmetic --out runs/pretrain-arithmetic

Each line is one sequence BOS + text + EOS (right-padded); the loss is the token-mean cross-entropy
of every predicted token, so it is directly comparable with the task's `entropy_floor()`. AdamW with
a short linear warm-up and a cosine decay to zero: the decay matters, since the corpus matches the
declared distribution exactly and only an annealed model settles onto it (a constant rate keeps the
exact TV swinging).

Full-batch steps (`--batch-size 0`, food's default): the food corpus is 8,000 lines but only 96
distinct ones, so each step takes every distinct line once, weighted by its count: the token-mean
loss of the whole corpus and its exact gradient, with no minibatch noise: closer to the declared
truth in less time than minibatches (`python -m minigrpo.bench --only pretrain`; docs/results.md). A
corpus with many distinct lines (arithmetic: 6,516) keeps minibatches.

Writes to --out: model.pt (every --ckpt-every steps and at the end, atomically), config.json,
metrics.jsonl (the initial model at step 0, steps 1, 2, 4, 8, ... below --eval-every where the loss
falls fastest, then every --eval-every steps; the train loss of step s is its batch's before the
update), loss.png, and prints the task's exact quality report at the end. An --out that already
holds a run is refused unless --overwrite (which removes the old run's files first).
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from minigrpo.lm.checkpoint import CheckpointError, read_checkpoint, save_checkpoint
from minigrpo.lm.model import GPT, GPTConfig
from minigrpo.lm.optim import AdamW
from minigrpo.lm.tokenizer import CharTokenizer
from minigrpo.util.cli import (
    UsageError,
    check_positive,
    exit_now,
    finish_unread,
    main_guard,
    parse_config,
    require,
)
from minigrpo.util.jsonl import JsonlLogger, read_jsonl
from minigrpo.util.outputs import prepare_out, write_json
from minigrpo.util.plotting import plot_panels
from minigrpo.util.runtime import setup_runtime
from toy_tasks import get_task, task_defaults


@dataclass
class PretrainConfig:
    task: str = field(
        default="food", metadata={"help": "toy task whose corpus to learn (food, arithmetic, sums)"}
    )
    out: str = field(
        default="runs/pretrain",
        metadata={
            "help": "output folder (default runs/pretrain; runs/pretrain-<task> for other tasks)"
        },
    )
    overwrite: bool = field(
        default=False,
        metadata={"help": "replace a run already in --out (by default it is refused)"},
    )
    steps: int = field(default=500, metadata={"help": "optimiser steps"})
    batch_size: int = field(
        default=0,
        metadata={
            "help": "lines per step (0 = every distinct line, weighted by its "
            "count: the exact corpus gradient; see the docstring)"
        },
    )
    lr: float = field(default=2e-2, metadata={"help": "peak learning rate (AdamW)"})
    warmup: int = field(
        default=50, metadata={"help": "linear warm-up steps, then cosine decay to 0"}
    )
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    n_lines: int = field(
        default=8000,
        metadata={"help": "corpus lines (food: a multiple of 800 matches PREFERENCES exactly)"},
    )
    n_layer: int = field(default=2, metadata={"help": "transformer blocks"})
    n_head: int = field(default=4, metadata={"help": "attention heads"})
    n_embd: int = field(default=64, metadata={"help": "embedding width"})
    seed: int = field(default=0, metadata={"help": "random seed (corpus order, init, batches)"})
    threads: int = field(
        default=1,
        metadata={
            "help": "torch CPU threads (0 = auto: the idle cores; results then depend on the "
            "load, see bench)"
        },
    )
    device: str = field(
        default="auto", metadata={"help": "auto, cpu or cuda", "choices": ["auto", "cpu", "cuda"]}
    )
    eval_every: int = field(
        default=100,
        metadata={
            "help": "validation loss and a progress line every N steps (and at steps 0, 1, 2, 4, "
            "... below N)"
        },
    )
    ckpt_every: int = field(
        default=200, metadata={"help": "checkpoint every N steps (and at the end)"}
    )


def encode_lines(tok: CharTokenizer, lines: list[str], width: int) -> torch.Tensor:
    """(N, width) long: BOS + line + EOS, right-padded with PAD."""
    data = torch.full((len(lines), width), tok.pad_id, dtype=torch.long)
    for i, text in enumerate(lines):
        ids = tok.encode(text, bos=True, eos=True)
        data[i, : len(ids)] = torch.tensor(ids)
    return data


def lm_loss(
    model: GPT, batch: torch.Tensor, pad_id: int, counts: torch.Tensor | None = None
) -> torch.Tensor:
    """Token-mean next-token cross-entropy over every non-PAD target of `batch` (B, T); with
    `counts` (B,) row b stands for counts[b] copies of itself: Σ_b counts_b Σ_t ce_bt / Σ_b
    counts_b·len_b."""
    logits = model(batch[:, :-1])  # (B, T-1, V)
    targets = batch[:, 1:]
    if counts is None:
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=pad_id
        )
    ce = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)),
        targets.reshape(-1),
        ignore_index=pad_id,
        reduction="none",
    ).view(targets.shape)  # (B, T-1), 0 at PAD targets
    weight = counts[:, None] * (targets != pad_id)  # (B, T-1)
    return (ce * weight).sum() / weight.sum()


def distinct_lines(lines: list[str]) -> tuple[list[str], list[int]]:
    """The corpus as its distinct lines (sorted) and how often each occurs."""
    counts = Counter(lines)
    return sorted(counts), [counts[line] for line in sorted(counts)]


def epoch_batches(n: int, batch_size: int, gen: torch.Generator, device):
    """Endless row indices: shuffled epochs without replacement, so every stretch of n rows has the
    corpus's exact counts (less gradient noise than sampling with replacement)."""
    order = torch.empty(0, dtype=torch.long)
    while True:
        while len(order) < batch_size:
            order = torch.cat([order, torch.randperm(n, generator=gen)])
        idx, order = order[:batch_size], order[batch_size:]
        yield idx.to(device)


def lr_at(step: int, cfg: PretrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


# rows one forward of an evaluation holds at once: every default corpus's fits in one (at most
# 8,688 rows), a larger --n-lines is evaluated in parts (its activations grow with the rows)
EVAL_ROWS = 16384


@torch.no_grad()
def eval_loss(
    model: GPT, data: torch.Tensor, pad_id: int, counts: torch.Tensor | None = None
) -> float:
    """The loss on `data` without a gradient (lm_loss); draws no random numbers, so evaluating never
    changes the training. Over EVAL_ROWS rows, in parts of EVAL_ROWS: each part's mean times its
    weight Σ counts_b·len_b, summed, over the whole weight (the same mean, rounded otherwise)."""
    model.eval()
    if len(data) <= EVAL_ROWS:
        loss = lm_loss(model, data, pad_id, counts).item()
    else:
        total = weight = 0.0
        for start in range(0, len(data), EVAL_ROWS):
            part = data[start : start + EVAL_ROWS]
            each = None if counts is None else counts[start : start + EVAL_ROWS]
            w = (part[:, 1:] != pad_id).sum(-1).double()
            w = (w if each is None else w * each.double()).sum().item()
            total += lm_loss(model, part, pad_id, each).item() * w
            weight += w
        loss = total / weight
    model.train()
    return loss


def eval_steps(steps: int, every: int) -> set[int]:
    """The steps whose model is evaluated and logged: 0 (the initial model), 1, 2, 4, 8, ... below
    `every` (where the loss falls fastest), then every `every` steps, and the last."""
    early = {2**k for k in range(steps.bit_length()) if 2**k < every}
    return {0, steps, *early, *range(every, steps + 1, every)}


LOSS_PANELS = [
    ("loss, nats/token", ["train_loss", "val_loss", "floor"]),
    (
        "validation loss over the floor: val / floor − 1 (log scale)",
        ["val_over_floor"],
        [(0.01, "bar: +1% at the end")],
    ),
    ("learning rate", ["lr"]),
]


def check_config(cfg: PretrainConfig) -> None:
    """One-line UsageErrors for values no run can use."""
    check_positive(
        cfg, "steps", "n_lines", "n_layer", "n_head", "n_embd", "eval_every", "ckpt_every"
    )
    require(cfg, "lr", math.isfinite(cfg.lr) and 0 < cfg.lr <= 1, "a number in (0, 1]")
    require(cfg, "batch_size", cfg.batch_size >= 0, ">= 1, or 0 for every distinct line each step")
    require(cfg, "warmup", cfg.warmup >= 0, ">= 0 (0 = no warm-up)")
    require(
        cfg,
        "weight_decay",
        math.isfinite(cfg.weight_decay) and cfg.weight_decay >= 0,
        "a number >= 0",
    )


def last_checkpoint(path) -> str:
    """What is really on disk at `path` now, for the message on the way out."""
    try:
        return f"{path} (step {read_checkpoint(path)['step']})"
    except CheckpointError:
        return "none written yet" if not path.exists() else f"none usable ({path} is damaged)"


def train(cfg: PretrainConfig, log=print) -> dict:
    """Run pretraining; returns a summary (final losses, report, wall time)."""
    check_config(cfg)
    try:
        task = get_task(cfg.task)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if cfg.n_embd % cfg.n_head:
        raise UsageError(f"--n-embd ({cfg.n_embd}) must be divisible by --n-head ({cfg.n_head})")
    device = setup_runtime(cfg.threads, cfg.device, cfg.seed)
    out = prepare_out(cfg.out, overwrite=cfg.overwrite)
    t0 = time.time()

    tok = CharTokenizer(task.ALPHABET)
    width = task.BLOCK_SIZE
    corpus = task.make_corpus(cfg.n_lines, seed=cfg.seed)
    counts = None
    if cfg.batch_size == 0:  # full batch: each distinct line once per step, weighted by its count
        corpus, n = distinct_lines(corpus)
        counts = torch.tensor(n, dtype=torch.float32, device=device)
    train_data = encode_lines(tok, corpus, width).to(device)
    val_data = encode_lines(
        tok, task.make_corpus(max(800, cfg.n_lines // 10), seed=cfg.seed + 1), width
    ).to(device)
    longest = int((train_data != tok.pad_id).sum(1).max())
    train_data, val_data = train_data[:, :longest], val_data[:, :longest]  # drop all-PAD columns
    floor = task.entropy_floor()

    model = GPT(
        GPTConfig(
            vocab_size=tok.vocab_size,
            block_size=width,
            n_layer=cfg.n_layer,
            n_head=cfg.n_head,
            n_embd=cfg.n_embd,
        )
    ).to(device)
    opt = AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99))
    batches = (
        None
        if counts is not None
        else epoch_batches(
            len(train_data), cfg.batch_size, torch.Generator().manual_seed(cfg.seed), device
        )
    )
    write_json(
        out / "config.json",
        {**asdict(cfg), "model": asdict(model.cfg), "params": model.num_params()},
    )
    logger = JsonlLogger(out / "metrics.jsonl")
    ckpt_path = out / "model.pt"
    every = f" ({len(train_data)} distinct, all in every step)" if counts is not None else ""
    log(
        f"pretrain {cfg.task}: {model.num_params():,} parameters, {cfg.n_lines} lines{every}, "
        f"floor {floor:.4f} nats/token, {cfg.steps} steps, device {device}, threads "
        f"{torch.get_num_threads()}"
    )

    tokens_seen, t_train, step, logged = 0, time.time(), 0, eval_steps(cfg.steps, cfg.eval_every)

    def record(step: int, train_loss: float) -> None:
        """Evaluate the model after `step` updates; log the row and a progress line."""
        val = eval_loss(model, val_data, tok.pad_id)
        elapsed = time.time() - t_train
        row = {
            "step": step,
            "train_loss": train_loss,
            "val_loss": val,
            "floor": floor,
            "val_over_floor": val / floor - 1,
            "lr": opt.param_groups[0]["lr"] if step else lr_at(0, cfg),
            "tokens_per_s": tokens_seen / elapsed if step else 0.0,
            "elapsed_s": elapsed,
        }
        logger.log(row)
        eta = f" | ETA {elapsed / step * (cfg.steps - step):.0f}s" if step else ""
        log(
            f"step {step:5d}/{cfg.steps} | train {train_loss:.4f} | val {val:.4f} (floor "
            f"{floor:.4f}, +{100 * (val / floor - 1):.1f}%)"
            + (f" | {row['tokens_per_s']:,.0f} tok/s{eta}" if step else "")
        )

    try:
        # the initial model (whole training set)
        record(0, eval_loss(model, train_data, tok.pad_id, counts))
        for step in range(1, cfg.steps + 1):
            for g in opt.param_groups:
                g["lr"] = lr_at(step - 1, cfg)
            batch = train_data if counts is not None else train_data[next(batches)]
            loss = lm_loss(model, batch, tok.pad_id, counts)
            # before the update: the saved checkpoint stays sound
            if not math.isfinite(loss.item()):
                raise UsageError(
                    f"the training loss became {loss.item()} at step {step} (try a lower --lr); "
                    f"last complete checkpoint: {last_checkpoint(ckpt_path)}"
                )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            tokens_seen += int((batch[:, 1:] != tok.pad_id).sum())
            if step in logged:
                record(step, loss.item())
            if step % cfg.ckpt_every == 0 or step == cfg.steps:
                save_checkpoint(
                    ckpt_path, model, tok, cfg.task, step, extra={"config": asdict(cfg)}
                )
    except KeyboardInterrupt:  # read back what is on disk: a Ctrl-C may land mid-save
        log(f"\ninterrupted at step {step}; last complete checkpoint: {last_checkpoint(ckpt_path)}")
        raise SystemExit(130)
    finally:
        logger.close()
    train_seconds = time.time() - t_train

    model.eval()
    report = task.pretrain_report(model, tok)
    val = eval_loss(model, val_data, tok.pad_id)
    rows = read_jsonl(out / "metrics.jsonl")
    plot_panels(
        rows, LOSS_PANELS, out / "loss.png", log_y=(LOSS_PANELS[1][0],), log_x=True, fit=True
    )
    summary = {
        "val_loss": val,
        "floor": floor,
        "val_over_floor": val / floor - 1,
        "report": report,
        "train_seconds": train_seconds,
        "total_seconds": time.time() - t0,
    }
    write_json(out / "summary.json", summary)
    log(task.format_report(report))
    log(
        f"val loss {val:.4f} vs floor {floor:.4f} (+{100 * (val / floor - 1):.2f}%, bar 1%); "
        f"training {train_seconds:.1f}s; wrote {ckpt_path}, metrics.jsonl, loss.png"
    )
    return summary


@main_guard
@finish_unread
def main(argv=None):
    cfg, _ = parse_config(
        PretrainConfig,
        argv,
        description=__doc__.split("\n\n")[0],
        defaults=task_defaults(argv, "PRETRAIN"),
    )
    train(cfg)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_now()  # the files are closed: skip the interpreter's teardown (cli.exit_now)
