"""What every command line shares: a dataclass config turned into argparse flags, one-line errors,
thread and device set-up, and the output folder.

A config is a dataclass whose fields carry `help` (and optionally `choices`) in their metadata:

    @dataclass
    class Config:
        steps: int = field(default=600, metadata={"help": "optimiser steps"})

`parse_config(Config, argv)` gives `--steps` (underscores become dashes; bools get --x/--no-x).
Bad input raises `UsageError`; `main_guard` prints it as ONE line and exits with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import types
import typing
from pathlib import Path

import torch


class UsageError(ValueError):
    """Bad input from the user: printed as one line, exit code 2, no traceback."""


def _base_type(tp):
    """int | None -> int; plain types unchanged."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def build_parser(cls, description: str, defaults: dict | None = None) -> argparse.ArgumentParser:
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        help_ = f.metadata.get("help", "")
        default = (defaults or {}).get(f.name, f.default if f.default is not dataclasses.MISSING else None)
        tp = _base_type(hints[f.name])
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_)
        else:
            parser.add_argument(flag, type=tp, default=default, help=help_, choices=f.metadata.get("choices"),
                                metavar=f.metadata.get("metavar"))
    return parser


def parse_config(cls, argv=None, description: str = "", defaults: dict | None = None):
    """Parse argv into an instance of the dataclass `cls`; argparse errors become UsageError."""
    parser = build_parser(cls, description, defaults)

    def error(message):  # argparse would print usage and exit 2; we want one clear line
        raise UsageError(message)

    parser.error = error
    ns = parser.parse_args(argv)
    return cls(**vars(ns)), parser


def check_positive(cfg, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is None or value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {value}")


def main_guard(main):
    """Run `main(argv)`; a UsageError -> one line on stderr and exit code 2; Ctrl-C -> exit code 130."""
    def wrapped(argv=None):
        try:
            return main(argv)
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2)
        except KeyboardInterrupt:  # Ctrl-C outside a training loop (which handles its own)
            print("\ninterrupted", file=sys.stderr)
            raise SystemExit(130)
    return wrapped


def auto_threads() -> int:
    """Threads for --threads 0: the cores nobody else is using (1-minute load average), at least 1.

    On an idle 2-core machine two threads make a pretraining step ~1.6x faster; on a busy one two
    OpenMP threads can make it many times SLOWER (REFERENCE.md §6), so we only take idle cores.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else cores
    return max(1, min(cores, int(cores - busy + 0.5)))


def setup_runtime(threads: int, device: str, seed: int | None = None) -> torch.device:
    """Set torch's thread count (0 = auto, see `auto_threads`) and pick the device ('auto' = cuda if
    available, else cpu). `python -m minigrpo.bench` measures the thread settings."""
    if threads < 0:
        raise UsageError(f"--threads must be >= 0 (0 = auto), got {threads}")
    torch.set_num_threads(threads or auto_threads())
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"--device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for but no CUDA GPU is available (use --device cpu)")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if seed is not None:
        torch.manual_seed(seed)
    return torch.device(device)


def prepare_out(out: str, resume: bool = False) -> Path:
    """Create the output folder; an --out that is an existing file is a UsageError."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {out!r} is an existing file; give a folder path")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: Path, obj) -> None:
    """Write JSON atomically (temp file + rename), so a crash never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)
