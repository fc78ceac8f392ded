"""What every command line shares: a dataclass config turned into argparse flags, checks of its
values, and one-line errors (the output folder and its files: outputs.py; threads and the device:
runtime.py).

A config is a dataclass whose fields carry `help` (and optionally `choices`) in their metadata:

    @dataclass
    class Config:
        steps: int = field(default=600, metadata={"help": "optimiser steps"})

`parse_config(Config, argv)` gives `--steps` (underscores become dashes; bools get --x/--no-x).
Bad input raises `UsageError`; `main_guard` prints it as ONE line and exits with code 2.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import errno
import functools
import math
import os
import signal
import sys
import types
import typing
from pathlib import Path


def meta(help_text: str, **extra) -> dict:
    """A config field's metadata: its --help line (and e.g. choices=[...])."""
    return {"help": help_text, **extra}


def flag(default, help_text: str, **extra):
    """A config field: its default and its --help line, `field(default=..., metadata=meta(...))`."""
    return dataclasses.field(default=default, metadata=meta(help_text, **extra))


class UsageError(ValueError):
    """Bad input from the user: printed as one line, exit code 2, no traceback."""


def _base_type(tp):
    """int | None -> int; plain types unchanged."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def _accepts_none(tp) -> bool:
    """True for `X | None` (and Optional[X])."""
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(
        None
    ) in typing.get_args(tp)


def _none_or(tp):
    """An argparse `type` for an `int | None` or `float | None` flag: 'none' (any case) -> None,
    else tp(text).

    Without it such a flag could never be set back to None from the command line (`--vf-clip none`
    was refused as an invalid float). The wrapper keeps tp's name, so argparse's error still reads
    "invalid float value: 'x'"."""

    def parse(text: str):
        return None if text.strip().lower() == "none" else tp(text)

    parse.__name__ = tp.__name__
    return parse


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to a flag's help (to its first line), except where the help already
    speaks of its default and where there is no default (None) to show. A help's indented lines (an
    example) are kept as written; the rest is wrapped to the terminal."""

    def _get_help_string(self, action):
        help_ = action.help or ""
        if (
            action.default is None
            or action.default is argparse.SUPPRESS
            or "default" in help_.lower()
        ):
            return help_
        first, newline, rest = help_.partition("\n")
        return f"{first} (default: %(default)s){newline}{rest}"

    def _split_lines(self, text, width):
        lines = []
        for line in text.split("\n"):
            lines += [line] if line.startswith(" ") else super()._split_lines(line, width)
        return lines


def program() -> str | None:
    """'python -m minigrpo.<cli>' when this process is one (argparse would name the file: 'grpo.py',
    '__main__.py')."""
    path = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    package = Path(__file__).resolve().parent.parent  # minigrpo/
    if path is None or path.suffix != ".py" or not path.is_relative_to(package):
        return None
    parts = path.relative_to(package.parent).with_suffix("").parts
    return "python -m " + ".".join(parts[:-1] if parts[-1] == "__main__" else parts)


def flag_groups(cls) -> dict[str, str]:
    """{field name: its --help group}, the groups in --help order: the title of the dataclass that
    declares the field (the first line of its docstring, else its name), the class itself first,
    then its bases in MRO order (GRPO's config is assembled from one dataclass per variant family:
    one group each)."""
    owner = {}
    for klass in cls.__mro__:
        if dataclasses.is_dataclass(klass):
            doc = klass.__dict__.get("__doc__") or ""
            title = (
                klass.__name__
                if doc.startswith(klass.__name__ + "(")
                else doc.strip().splitlines()[0]
            )
            for name in klass.__dict__.get("__annotations__", {}):
                # a subclass that redeclares a field keeps it in its own group
                owner.setdefault(name, title)
    return owner


def build_parser(cls, description: str, defaults: dict | None = None) -> argparse.ArgumentParser:
    hints, owner = typing.get_type_hints(cls), flag_groups(cls)
    grouped = len(set(owner.values())) > 1
    parser = argparse.ArgumentParser(
        prog=program(),
        description=description,
        formatter_class=DefaultsHelpFormatter,
        usage="%(prog)s [--flag VALUE ...]" if grouped else None,
    )
    groups = {
        title: parser.add_argument_group(title) if grouped else parser
        for title in dict.fromkeys(owner.values())
    }
    for f in dataclasses.fields(cls):
        group = groups[owner[f.name]]
        flag = "--" + f.name.replace("_", "-")
        help_ = f.metadata.get("help", "").replace("%", "%%")  # argparse formats help with %
        default = (defaults or {}).get(
            f.name, f.default if f.default is not dataclasses.MISSING else None
        )
        tp = _base_type(hints[f.name])
        if tp is bool:
            group.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=default, help=help_
            )
        else:
            if tp in (int, float) and _accepts_none(hints[f.name]):
                tp = _none_or(tp)  # `--flag none` sets it back to None (e.g. PPO's --vf-clip none)
            choices, metavar = f.metadata.get("choices"), f.metadata.get("metavar")
            # {a,b,...} would overrun a line
            if choices and metavar is None and len(",".join(map(str, choices))) > 40:
                metavar, help_ = f.name.upper(), f"{help_} (one of: {', '.join(map(str, choices))})"
            group.add_argument(
                flag, type=tp, default=default, help=help_, choices=choices, metavar=metavar
            )
    return parser


def _usage_error(message):  # argparse would print usage and exit 2; we want one clear line
    raise UsageError(message)


@functools.lru_cache(maxsize=64)
def _parser(cls, description: str, prog: str | None, defaults: tuple) -> argparse.ArgumentParser:
    """build_parser's parser, made once for each config, description, program and defaults (a
    caller may parse many runs' flags: building the parser is most of a parse's time); parse_args
    leaves it unchanged."""
    parser = build_parser(cls, description, dict(defaults))
    parser.error = _usage_error
    return parser


def parse_config(cls, argv=None, description: str = "", defaults: dict | None = None):
    """Parse argv into an instance of the dataclass `cls`; argparse errors become UsageError."""
    key = tuple(sorted((defaults or {}).items()))
    try:
        parser = _parser(cls, description, program(), key)
    # a default that cannot be a key (a list read from a resumed run's config.json): made anew
    except TypeError:
        parser = _parser.__wrapped__(cls, description, program(), key)
    ns = parser.parse_args(argv)
    return cls(**vars(ns)), parser


def require(cfg, name: str, ok: bool, allowed: str) -> None:
    """The one check of a flag's value: unless ok, a UsageError "--name must be <allowed>, got
    <value>"."""
    if not ok:
        raise UsageError(
            f"--{name.replace('_', '-')} must be {allowed}, got {getattr(cfg, name)!r}"
        )


def check_positive(cfg, *names: str) -> None:
    """Each named field is a number > 0."""
    for name in names:
        value = getattr(cfg, name)
        require(cfg, name, value is not None and value > 0, "> 0")


def check_ranges(cfg, ranges: dict) -> None:
    """{name: (low, high)} inclusive bounds on finite values (None: unbounded); one line for the
    first field out of range, naming the value and what is allowed. None values (optional flags)
    pass."""
    for name, (low, high) in ranges.items():
        value = getattr(cfg, name)
        if value is None:
            continue
        ok = (
            math.isfinite(value)
            and (low is None or value >= low)
            and (high is None or value <= high)
        )
        allowed = " and ".join(
            x
            for x in (
                f">= {low:g}" if low is not None else "",
                f"<= {high:g}" if high is not None else "",
            )
            if x
        )
        require(cfg, name, ok, "a finite number" + (" " + allowed if allowed else ""))


def exit_now() -> None:
    """End a command that has finished: flush stdout and stderr, then leave without the
    interpreter's teardown (os._exit(0)). Every file the command wrote is already closed and the
    functions registered with atexit still run (atexit._run_exitfuncs, as multiprocessing calls it);
    what is skipped is freeing torch's and matplotlib's modules and the tensors one by one, a
    noticeable share of a short command's time (docs/performance.md). Only in a CLI's __main__
    block, after main() returned: never where a caller goes on (tests call main(), compare's workers
    the trainers); under a profiler, tracer, debugger or coverage tool it leaves the exit to
    them."""
    # a profiler, tracer, debugger or coverage tool writes its data at the ordinary exit
    if _observed():
        return
    # what was registered to run at exit still runs (logging's flush, a user's reward file)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # the reader went away: nothing left to say
        pass
    os._exit(0)


def _observed() -> bool:
    """Is a profiler, tracer, debugger or coverage tool watching this process (`python -m cProfile
    -m ...`)?"""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return True
    # Python 3.12+: such tools may use sys.monitoring instead
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and any(monitoring.get_tool(i) is not None for i in range(6))


class _ReaderMayLeave:
    """sys.stdout for a command whose work is its files: when the reader goes away (`| head`), the
    first failed write points file descriptor 1 at /dev/null and the command goes on, silent."""

    def __init__(self, stream):
        self._stream = stream

    def _silence(self) -> None:
        os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._silence()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._silence()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def finish_unread(main):
    """For the commands that train (pretrain, grpo, ppo, dpo, compare): a closed pipe (`| head`)
    stops their printing, not their run; every file is written as without it and the exit code is
    the run's. A command whose work is its output (sample) stops instead, exit code 141, as Unix
    tools do (main_guard)."""

    def wrapped(argv=None):
        stdout, sys.stdout = sys.stdout, _ReaderMayLeave(sys.stdout)
        try:
            return main(argv)
        finally:
            sys.stdout = stdout

    return wrapped


def main_guard(main):
    """Run `main(argv)`; a UsageError or a full disk -> one line on stderr and exit code 2; Ctrl-C
    -> 130.

    Under `python -m minigrpo.<cli>` the package installs a start-up Ctrl-C handler (see
    __init__.py); from here on Ctrl-C is Python's KeyboardInterrupt again, which the training loops
    handle themselves."""

    def wrapped(argv=None):
        from minigrpo import _interrupted_at_startup

        if signal.getsignal(signal.SIGINT) is _interrupted_at_startup:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return main(argv)
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2)
        # the reader of our output went away (`| head`): stop quietly, as Unix tools do
        except BrokenPipeError:
            # no error at interpreter exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(141)  # 128 + SIGPIPE
        except KeyboardInterrupt:  # Ctrl-C outside a training loop (which handles its own)
            # decided: a later Ctrl-C (during the exit's clean-up) no longer turns 130 into a death
            # by SIGINT
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            print("\ninterrupted", file=sys.stderr)
            raise SystemExit(130)
        except OSError as e:  # a full disk under a writer without its own check (metrics, plots)
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            where = f" while writing {e.filename}" if e.filename else ""
            print(
                f"error: the disk is full{where}; files already written are kept", file=sys.stderr
            )
            raise SystemExit(2)

    return wrapped
