"""Sample completions from a checkpoint.

    python -m minigrpo.sample --checkpoint runs/pretrain/model.pt --prompt "ravin likes " --num 20
    python -m minigrpo.sample --checkpoint runs/grpo-pizza/model.pt --prompt "ravin likes " --num
    1000 --json

Without --json: each completion, then a table of distinct completions with counts and shares
("…" marks a completion cut off by --max-new-tokens before its end token). With --json: one object
per line, {"completion": text after the prompt without the end marker, "finished": bool}.
Completions are generated BATCH_SIZE at a time and printed as they come, so a large --num needs no
more memory.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from dataclasses import dataclass, field

import torch

from minigrpo.lm.checkpoint import CheckpointError, load_checkpoint
from minigrpo.lm.sampling import encode_prompts, generate, read_completions
from minigrpo.util.cli import (
    UsageError,
    check_positive,
    exit_now,
    main_guard,
    parse_config,
    require,
)
from minigrpo.util.runtime import setup_runtime


@dataclass
class SampleConfig:
    checkpoint: str = field(
        default="runs/pretrain/model.pt", metadata={"help": "model.pt to sample from"}
    )
    prompt: str = field(
        default="ravin likes ", metadata={"help": "text to complete (BOS is added)"}
    )
    num: int = field(default=20, metadata={"help": "number of completions"})
    temperature: float = field(default=1.0, metadata={"help": "softmax temperature (>= 0.001)"})
    top_k: int | None = field(default=None, metadata={"help": "keep only the k most likely tokens"})
    top_p: float | None = field(
        default=None, metadata={"help": "nucleus sampling: smallest set with mass >= p"}
    )
    max_new_tokens: int | None = field(
        default=None,
        metadata={
            "help": "longest completion (default: all that the model's block leaves after the "
            "prompt)"
        },
    )
    seed: int = field(default=0, metadata={"help": "sampling seed"})
    json: bool = field(default=False, metadata={"help": "one JSON object per line instead of text"})
    threads: int = field(default=1, metadata={"help": "torch CPU threads"})
    device: str = field(
        default="auto", metadata={"help": "auto, cpu or cuda", "choices": ["auto", "cpu", "cuda"]}
    )


BATCH_SIZE = 1024  # most completions generated at once: memory stays flat whatever --num is
# rows x n_layer x block_size x n_embd per batch (default model: 1024 rows, ~100 MB)
BATCH_BUDGET = 2**25
MIN_TEMPERATURE = 1e-3  # below this, logits / T overflow float32 and sampling breaks


def check_config(cfg: SampleConfig) -> None:
    """One-line UsageErrors for flag values that need no model to be judged."""
    check_positive(cfg, "num")
    require(cfg, "max_new_tokens", cfg.max_new_tokens is None or cfg.max_new_tokens >= 1, "> 0")
    require(
        cfg,
        "temperature",
        math.isfinite(cfg.temperature) and cfg.temperature >= MIN_TEMPERATURE,
        f"a finite number >= {MIN_TEMPERATURE:g}",
    )
    require(cfg, "top_k", cfg.top_k is None or cfg.top_k >= 1, ">= 1")
    require(cfg, "top_p", cfg.top_p is None or 0 < cfg.top_p <= 1, "in (0, 1]")


def fit_to_block(cfg: SampleConfig, tok, block_size: int) -> int:
    """The number of new tokens the model's block leaves after BOS + prompt. A prompt that leaves
    none is a UsageError; a larger --max-new-tokens is cut, with one note on stderr (none when it
    was not given)."""
    try:
        tok.check(cfg.prompt)
    except ValueError as e:
        raise UsageError(f"--prompt {cfg.prompt!r}: {e}") from None
    room = block_size - len(tok.encode(cfg.prompt, bos=True))
    if room < 1:
        raise UsageError(
            f"--prompt is {len(cfg.prompt)} characters long; this model's block size {block_size} "
            f"allows at most {block_size - 2} (BOS and one new token take the rest)"
        )
    if cfg.max_new_tokens is None:
        return room
    if cfg.max_new_tokens > room:
        print(
            f"note: --max-new-tokens {cfg.max_new_tokens} is cut to {room} (block size "
            f"{block_size} minus the prompt's {block_size - room} tokens)",
            file=sys.stderr,
        )
    return min(cfg.max_new_tokens, room)


def rows_per_batch(model) -> int:
    """BATCH_SIZE, or fewer for a model whose activations per row are larger than the default's."""
    c = model.cfg
    return max(1, min(BATCH_SIZE, BATCH_BUDGET // (c.n_layer * c.block_size * c.n_embd)))


def sample_batches(cfg: SampleConfig):
    """Yield lists of (completion text, finished), `rows_per_batch` at a time, --num in all."""
    check_config(cfg)
    device = setup_runtime(cfg.threads, cfg.device)
    try:
        model, tok, _ = load_checkpoint(cfg.checkpoint, device)
    except CheckpointError as e:
        raise UsageError(str(e)) from None
    max_new = fit_to_block(cfg, tok, model.cfg.block_size)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    rows = rows_per_batch(model)
    for start in range(0, cfg.num, rows):
        ids, mask = encode_prompts(tok, [cfg.prompt] * min(rows, cfg.num - start), device)
        out = generate(
            model, ids, mask, max_new, cfg.temperature, cfg.top_k, cfg.top_p, generator=gen
        )
        yield list(zip(*read_completions(tok, [out])[0]))


@main_guard
def main(argv=None):
    cfg, _ = parse_config(SampleConfig, argv, description=__doc__.split("\n\n")[0])
    counts, total = Counter(), 0
    for batch in sample_batches(cfg):  # print as we go; keep only the counts
        for text, finished in batch:
            if cfg.json:
                print(json.dumps({"completion": text, "finished": finished}))
            else:
                print(f"{cfg.prompt}{text}" + ("" if finished else "…"))
                counts[text + ("" if finished else "…")] += 1
        total += len(batch)
    if cfg.json:
        return
    print(f"\n{'completion':<24} {'count':>6} {'share':>7}")
    for text, n in counts.most_common():
        print(f"{text!r:<24} {n:>6} {n / total:>7.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_now()  # the files are closed: skip the interpreter's teardown (cli.exit_now)
