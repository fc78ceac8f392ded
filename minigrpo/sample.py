"""Sample completions from a checkpoint.

    python -m minigrpo.sample --checkpoint runs/pretrain/model.pt --prompt "ravin likes " --num 20
    python -m minigrpo.sample --checkpoint runs/grpo-pizza/model.pt --prompt "ravin likes " --num 1000 --json

Without --json: each completion, then a table of distinct completions with counts and shares
("…" marks a completion cut off by --max-new-tokens before its end token). With --json: one object per
line, {"completion": text after the prompt without the end marker, "finished": bool}.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field

import torch

from minigrpo.checkpoint import CheckpointError, load_checkpoint
from minigrpo.cli import UsageError, check_positive, main_guard, parse_config, setup_runtime
from minigrpo.sampling import decode_completions, encode_prompts, generate


@dataclass
class SampleConfig:
    checkpoint: str = field(default="runs/pretrain/model.pt", metadata={"help": "model.pt to sample from"})
    prompt: str = field(default="ravin likes ", metadata={"help": "text to complete (BOS is added)"})
    num: int = field(default=20, metadata={"help": "number of completions"})
    temperature: float = field(default=1.0, metadata={"help": "softmax temperature (> 0)"})
    top_k: int | None = field(default=None, metadata={"help": "keep only the k most likely tokens"})
    top_p: float | None = field(default=None, metadata={"help": "nucleus sampling: smallest set with mass >= p"})
    max_new_tokens: int = field(default=24, metadata={"help": "longest completion"})
    seed: int = field(default=0, metadata={"help": "sampling seed"})
    json: bool = field(default=False, metadata={"help": "one JSON object per line instead of text"})
    threads: int = field(default=1, metadata={"help": "torch CPU threads"})
    device: str = field(default="auto", metadata={"help": "auto, cpu or cuda", "choices": ["auto", "cpu", "cuda"]})


def sample_texts(cfg: SampleConfig) -> list[tuple[str, bool]]:
    check_positive(cfg, "num", "temperature", "max_new_tokens")
    if cfg.top_k is not None and cfg.top_k < 1:
        raise UsageError(f"--top-k must be >= 1, got {cfg.top_k}")
    if cfg.top_p is not None and not 0 < cfg.top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1], got {cfg.top_p}")
    device = setup_runtime(cfg.threads, cfg.device)
    try:
        model, tok, _ = load_checkpoint(cfg.checkpoint, device)
        tok.check(cfg.prompt)
    except (CheckpointError, ValueError) as e:
        raise UsageError(f"--prompt {cfg.prompt!r}: {e}" if not isinstance(e, CheckpointError) else str(e)) from None
    ids, mask = encode_prompts(tok, [cfg.prompt] * cfg.num, device)
    gen = generate(model, ids, mask, cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p,
                   generator=torch.Generator(device=device).manual_seed(cfg.seed))
    return list(zip(decode_completions(tok, gen), gen.finished.tolist()))


@main_guard
def main(argv=None):
    cfg, _ = parse_config(SampleConfig, argv, description=__doc__.split("\n\n")[0])
    results = sample_texts(cfg)
    if cfg.json:
        for text, finished in results:
            print(json.dumps({"completion": text, "finished": finished}))
        return
    for text, finished in results:
        print(f"{cfg.prompt}{text}" + ("" if finished else "…"))
    counts = Counter(text + ("" if finished else "…") for text, finished in results)
    print(f"\n{'completion':<24} {'count':>6} {'share':>7}")
    for text, n in counts.most_common():
        print(f"{text!r:<24} {n:>6} {n / len(results):>7.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
