"""Checkpoints: one file holding plain data only (tensors, numbers, strings), written atomically.

    save_checkpoint(path, model, tokenizer, "food", 600, opt.state_dict(), extra={...})
    model, tokenizer, meta = load_checkpoint(path)

The file is a dict {"format": "minigrpo-checkpoint", "version", "model" (state_dict), "config"
(GPTConfig as a dict), "tokenizer" (its chars), "task", "step", optional "optimizer" and "extra"}.
It is written to a temporary file and renamed over the target, so an interrupted save never damages
the last complete checkpoint, and a full disk is a one-line UsageError that keeps the previous one.
Loading uses `torch.load(weights_only=True)`: no pickled code runs. A missing, truncated or foreign
file raises CheckpointError with one line naming the file and what it is instead (text, a pickle
that would run code, random bytes ...); PyTorch's own multi-line messages and warnings never reach
the user.
"""

from __future__ import annotations

import codecs
import dataclasses
import io
import pickletools
import warnings
from pathlib import Path

import torch

from minigrpo.lm.model import GPT, GPTConfig
from minigrpo.lm.tokenizer import CharTokenizer
from minigrpo.util.outputs import write_atomic

FORMAT = "minigrpo-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    pass


def host_state(model: GPT) -> dict:
    """The model's state_dict copied to the host (what a checkpoint holds of its weights)."""
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def to_host(tree):
    """Every tensor of nested dicts and lists copied to the host (a host tensor is itself), the rest
    as it is (a module's state_dict stays an OrderedDict with its _metadata): what a checkpoint
    holds, so that a file written on a GPU holds no device tensors."""
    if isinstance(tree, dict):
        out = type(tree)((k, to_host(v)) for k, v in tree.items())
        if hasattr(tree, "_metadata"):
            out._metadata = tree._metadata
        return out
    if isinstance(tree, list):
        return [to_host(v) for v in tree]
    return tree.detach().cpu() if isinstance(tree, torch.Tensor) else tree


def save_checkpoint(
    path,
    model: GPT,
    tokenizer: CharTokenizer,
    task: str,
    step: int,
    optimizer_state: dict | None = None,
    extra: dict | None = None,
    weights: dict | None = None,
) -> None:
    """`optimizer_state`: the optimiser's state_dict (saved as "optimizer"); `weights`: the model's
    state_dict already on the host (else copied here)."""
    state = {
        "format": FORMAT,
        "version": VERSION,
        "model": weights if weights is not None else host_state(model),
        "config": dataclasses.asdict(model.cfg),
        "tokenizer": tokenizer.to_dict(),
        "task": task,
        "step": step,
    }
    if optimizer_state is not None:
        state["optimizer"] = optimizer_state
    if extra is not None:
        state["extra"] = extra
    buf = io.BytesIO()  # written whole, then renamed over `path` (outputs.write_atomic)
    torch.save(state, buf)
    write_atomic(path, buf.getbuffer(), what="checkpoint")


def read_checkpoint(path) -> dict:
    """The checkpoint dict, validated; one-line CheckpointError if missing, truncated, foreign."""
    path = Path(path)
    name = f"checkpoint {str(path)!r}"
    if not path.exists():
        raise CheckpointError(f"{name} does not exist")
    if path.is_dir():
        raise CheckpointError(f"{name} is a folder, not a checkpoint file")
    try:
        # e.g. "Detected pickle protocol 4": several lines, no use to anyone
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as e:
        raise CheckpointError(f"{name} cannot be read: {e.strerror or e}") from None
    except Exception as e:  # truncated zip, random bytes, pickled code ... (messages of many lines)
        raise CheckpointError(f"{name} {what_it_is(path, str(e))}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{name} is not a minigrpo checkpoint")
    if state.get("version") != VERSION:
        raise CheckpointError(
            f"{name} has version {state.get('version')}, this minigrpo reads version {VERSION}"
        )
    return state


ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since PyTorch 1.6
CODE_OPCODES = {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "BUILD"}


def what_it_is(path: Path, error: str) -> str:
    """Why torch.load(weights_only=True) refused `path`: the end of a sentence about the file."""
    # torch's weights-only unpickler met a class or function to import and call
    if "GLOBAL" in error:
        return "is not a weights-only checkpoint (it would run code); refused"
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if not head:
        return "is an empty file, not a checkpoint"
    if head.startswith(ZIP_MAGIC):
        return (
            "is unreadable: a torch file that is truncated or damaged (was its writing "
            "interrupted?)"
        )
    # a pickle that is not torch's: see whether loading it would call code
    if head.startswith(b"\x80"):
        if pickle_calls_code(path):
            return "is not a weights-only checkpoint (it would run code); refused"
        return "is unreadable: a plain Python pickle, not a torch checkpoint"
    try:  # text: valid UTF-8 without NUL bytes (the last character may be cut at the end of `head`)
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        text = b"\0" not in head
    except UnicodeDecodeError:
        text = False
    if text:
        return "is unreadable: a text file, not a checkpoint"
    return "is unreadable: not a torch checkpoint (unrecognised binary data)"


def pickle_calls_code(path: Path) -> bool:
    """Whether a pickle would import or call anything when loaded (read by opcode, never run)."""
    try:
        with open(path, "rb") as f:
            return any(op.name in CODE_OPCODES for op, _, _ in pickletools.genops(f))
    except Exception:  # damaged part-way: whatever came before decides
        return False


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
