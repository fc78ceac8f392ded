"""Rewards: functions f(prompt, completion) -> float, picked by a spec string.

The completion is the text after the prompt, without the end marker. A spec is one of
    NAME                      a task reward (food: pizza, food:<food>, graded; arithmetic: correct,
                              format) or a generic one: exact:<text>, regex:<pattern>, length
    NAME=W,NAME=W,...         a weighted sum, e.g. pizza=1,length=0.1 (a bare NAME weighs 1)
    path/to/file.py:function  a user function from a file
    package.module:function   a user function from an importable module

`make_reward(spec, task_rewards)` returns a `Reward` (name + function); `score` calls it on a batch
and turns any exception or non-finite value into one RewardError naming the reward, prompt and
completion.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RewardFn = Callable[[str, str], float]


class RewardError(ValueError):
    pass


@dataclass
class Reward:
    name: str
    fn: RewardFn

    def __call__(self, prompt: str, completion: str) -> float:
        return self.fn(prompt, completion)


def exact_match(text: str) -> RewardFn:
    return lambda prompt, completion: float(completion == text)


def regex_match(pattern: str) -> RewardFn:
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise RewardError(f"bad regex {pattern!r} in reward spec: {e}") from None
    return lambda prompt, completion: float(rx.fullmatch(completion) is not None)


def length(prompt: str, completion: str) -> float:
    return float(len(completion))


GENERIC = {
    "exact:<text>": "1 iff the completion equals <text>",
    "regex:<pattern>": "1 iff the completion fully matches <pattern>",
    "length": "number of characters in the completion",
}


def _generic(name: str) -> RewardFn | None:
    if name.startswith("exact:"):
        return exact_match(name[len("exact:") :])
    if name.startswith("regex:"):
        return regex_match(name[len("regex:") :])
    if name == "length":
        return length
    return None


def load_user_function(spec: str) -> RewardFn:
    """'path/to/file.py:fn' or 'package.module:fn' -> the function; RewardError if missing."""
    target, _, fn_name = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise RewardError(f"reward file {target!r} does not exist")
        module_spec = importlib.util.spec_from_file_location(f"user_reward_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except SystemExit as e:
            raise RewardError(
                f"reward file {target!r} called sys.exit({e.code!r}) while it was imported"
            ) from None
        except Exception as e:
            raise RewardError(
                f"reward file {target!r} failed to import: {type(e).__name__}: {e}"
            ) from None
    else:
        try:
            module = importlib.import_module(target)
        except SystemExit as e:
            raise RewardError(
                f"reward module {target!r} called sys.exit({e.code!r}) while it was imported"
            ) from None
        except ImportError as e:
            raise RewardError(f"reward module {target!r} cannot be imported: {e}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise RewardError(f"reward {spec!r}: {target!r} has no function {fn_name!r}")
    return no_exit(fn, spec)


def no_exit(fn: RewardFn, spec: str) -> RewardFn:
    """The user's function, with a sys.exit inside it turned into a RewardError naming it: a reward
    that exits must not end a run as if it had succeeded (Ctrl-C's KeyboardInterrupt passes through:
    it is the interrupt it is)."""

    def reward(prompt: str, completion: str) -> float:
        try:
            return fn(prompt, completion)
        except SystemExit as e:
            raise RewardError(
                f"reward {spec!r} called sys.exit({e.code!r}) on prompt {prompt!r}, completion "
                f"{completion!r}; a reward returns a number"
            ) from None

    return reward


def module_file(spec: str) -> str | None:
    """The source file `load_user_function` would import for a 'package.module:function' spec, found
    without running the module (importlib.util.find_spec imports its parent packages only); None for
    a file path, a built-in reward such as 'food:pizza', or a module without a .py source. compare
    stamps its runs with it."""
    target, sep, fn_name = spec.rpartition(":")
    if (
        not sep
        or not fn_name.isidentifier()
        or not target
        or target.endswith(".py")
        or "/" in target
        or "," in spec
    ):
        return None
    try:
        found = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        return None
    origin = found.origin if found is not None else None
    return origin if origin and origin.endswith(".py") and Path(origin).is_file() else None


def make_reward(
    spec: str,
    task_rewards: dict[str, Callable[[str], RewardFn | None]] | None = None,
    task_help: dict[str, str] | None = None,
) -> Reward:
    """Build the reward named by `spec` (see module docstring).

    task_rewards maps a name prefix to a factory: factory(full_name) -> RewardFn, or None if the
    name is not its own (e.g. the food task's "food" factory accepts "food:sushi").
    """
    spec = spec.strip()
    if not spec:
        raise RewardError("empty --reward spec")
    if _is_user_function(spec):
        return Reward(spec, load_user_function(spec))
    parts = []
    for term in spec.split(","):
        name, eq, weight = term.partition("=")
        name = name.strip()
        try:
            w = float(weight) if eq else 1.0
        except ValueError:
            raise RewardError(
                f"malformed --reward spec {spec!r}: weight {weight!r} of {name!r} is not a number "
                f"(expected NAME or NAME=W,NAME=W)"
            ) from None
        fn = _lookup(name, task_rewards or {})
        if fn is None and len(parts) == 0 and not eq and "," not in spec and ":" in name:
            # e.g. operator:contains (an undotted module)
            return Reward(spec, load_user_function(spec))
        if fn is None:
            known = sorted({**(task_help or {}), **GENERIC})
            raise RewardError(
                f"unknown reward {name!r} (available: {', '.join(known)}, "
                f"a weighted sum NAME=W,..., or path/to/file.py:function)"
            )
        parts.append((name, w, fn))
    if len(parts) == 1 and parts[0][1] == 1.0:
        return Reward(parts[0][0], parts[0][2])
    return Reward(spec, lambda p, c: sum(w * fn(p, c) for _, w, fn in parts))


def _is_user_function(spec: str) -> bool:
    """'file.py:fn', 'dir/file.py:fn' or 'pkg.module:fn' (not 'regex:a.b' or 'food:ice cream')."""
    target, sep, fn_name = spec.rpartition(":")
    return (
        bool(sep)
        and fn_name.isidentifier()
        and "=" not in spec
        and "," not in spec
        and (target.endswith(".py") or "/" in target or "." in target)
    )


def _lookup(name: str, task_rewards) -> RewardFn | None:
    for factory in task_rewards.values():
        try:
            fn = factory(name)
        # a task's own reward with a bad argument (food:pizzza): the spec's error
        except ValueError as e:
            raise RewardError(str(e)) from None
        if fn is not None:
            return fn
    return _generic(name)


SLOW_SECONDS = 3.0  # a batch of rewards slower than this reports its progress (a sign of life)


def score(
    reward: Reward,
    prompts: list[str],
    completions: list[str],
    finished: list[bool],
    unfinished_reward: float | None = None,
    progress=None,
) -> list[float]:
    """Reward of each completion; unfinished ones get `unfinished_reward` when it is given. A slow
    reward calls `progress(done, total)` every SLOW_SECONDS, so a run never looks dead while it
    scores."""
    out, start = [], time.perf_counter()
    last = start
    for prompt, completion, done in zip(prompts, completions, finished):
        if progress is not None and time.perf_counter() - last >= SLOW_SECONDS:
            last = time.perf_counter()
            progress(len(out), len(prompts))
        if not done and unfinished_reward is not None:
            out.append(float(unfinished_reward))
            continue
        try:
            value = reward(prompt, completion)
        except RewardError:
            raise
        except Exception as e:
            raise RewardError(
                f"reward {reward.name!r} raised on prompt {prompt!r}, completion {completion!r}: "
                f"{type(e).__name__}: {e}"
            ) from None
        # a number (int, float, bool, numpy's, a 0-dim tensor): never a string that reads as one
        try:
            if isinstance(value, (str, bytes)):
                raise TypeError
            r = float(value)
        except (TypeError, ValueError, RuntimeError):
            raise RewardError(
                f"reward {reward.name!r} returned {value!r} ({type(value).__name__}, not a number) "
                f"on prompt {prompt!r}, completion {completion!r}"
            ) from None
        if not math.isfinite(r):
            raise RewardError(
                f"reward {reward.name!r} returned {r} on prompt {prompt!r}, completion "
                f"{completion!r}"
            )
        out.append(r)
    return out
