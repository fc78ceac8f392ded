"""Checkpoints: one file holding plain data only (tensors, numbers, strings), written atomically.

    save_checkpoint(path, model, tokenizer, task="food", step=600, optimizer=opt, extra={...})
    model, tokenizer, meta = load_checkpoint(path)

The file is a dict {"format": "minigrpo-checkpoint", "version", "model" (state_dict), "config"
(GPTConfig as a dict), "tokenizer" (its chars), "task", "step", optional "optimizer" and "extra"}.
It is written to a temporary file and renamed over the target, so an interrupted save never damages
the last complete checkpoint. Loading uses `torch.load(weights_only=True)`: no pickled code runs.
A missing, truncated or foreign file raises CheckpointError with one line naming the file and problem.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from minigrpo.model import GPT, GPTConfig
from minigrpo.tokenizer import CharTokenizer

FORMAT = "minigrpo-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    pass


def atomic_save(obj, path) -> None:
    """torch.save to a temp file in the same folder, then rename over `path` (atomic on POSIX)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def save_checkpoint(path, model: GPT, tokenizer: CharTokenizer, task: str, step: int,
                    optimizer: torch.optim.Optimizer | None = None, extra: dict | None = None) -> None:
    state = {
        "format": FORMAT, "version": VERSION,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "config": dataclasses.asdict(model.cfg),
        "tokenizer": tokenizer.to_dict(),
        "task": task, "step": step,
    }
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    if extra is not None:
        state["extra"] = extra
    atomic_save(state, path)


def read_checkpoint(path) -> dict:
    """The raw checkpoint dict, validated; CheckpointError (one line) if missing, truncated or foreign."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} is a folder, not a checkpoint file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, random bytes, pickled code ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {str(path)!r} is unreadable (truncated or not a torch file): "
                              f"{first[:160]}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {str(path)!r} is not a minigrpo checkpoint")
    if state.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {str(path)!r} has version {state.get('version')}, "
                              f"this minigrpo reads version {VERSION}")
    return state


def model_from_state(state: dict, device="cpu") -> tuple[GPT, CharTokenizer]:
    model = GPT(GPTConfig(**state["config"]))
    model.load_state_dict(state["model"])
    return model.to(device), CharTokenizer.from_dict(state["tokenizer"])


def load_checkpoint(path, device="cpu") -> tuple[GPT, CharTokenizer, dict]:
    """-> (model in eval mode, tokenizer, meta) where meta holds task, step, optimizer, extra."""
    state = read_checkpoint(path)
    model, tokenizer = model_from_state(state, device)
    meta = {k: v for k, v in state.items() if k not in ("model", "tokenizer")}
    return model.eval(), tokenizer, meta
