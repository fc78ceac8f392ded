"""Which runs of a sweep are kept: each run folder holds a stamp (compare_command.json) of the
command, the code and the input files that made it. A finished run is reused only while all three
match; a sweep folder holding finished runs of another command is refused rather than mixed or
silently replaced.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import shutil
from pathlib import Path

from minigrpo.util.cli import UsageError
from toy_tasks.rewards import module_file

STAMP = "compare_command.json"


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """What made a run besides its command and the files it names (stamp_of): a hash of the source
    of minigrpo/ and toy_tasks/ (every .py file) and torch's version. After an edit or an upgrade
    compare makes its runs again."""
    import torch

    import minigrpo
    import toy_tasks

    digest = hashlib.sha256(torch.__version__.encode())
    for package in (minigrpo, toy_tasks):
        root = Path(package.__file__).parent
        for f in sorted(root.rglob("*.py")):
            digest.update(
                f"{package.__name__}/{f.relative_to(root)}".encode() + b"\0" + f.read_bytes()
            )
    return digest.hexdigest()[:16]


def named_files(cmd: list[str]) -> dict[str, str]:
    """Every existing file the command line names, an argument itself or the part before a ':' (the
    --init checkpoint, a reward's path/to/file.py:function), the source file of a --reward
    package.module:function, and the modules of the user's own folders that a reward's source
    imports (local_imports) -> its content hash."""
    paths = {p for arg in cmd[3:] for p in (arg, arg.rpartition(":")[0]) if p and Path(p).is_file()}
    rewards = (cmd[i + 1] for i in range(3, len(cmd) - 1) if cmd[i] == "--reward")
    paths |= {f for f in map(module_file, rewards) if f}
    paths |= {str(f) for p in list(paths) if p.endswith(".py") for f in local_imports(Path(p))}
    return {p: hashlib.sha256(Path(p).read_bytes()).hexdigest()[:16] for p in sorted(paths)}


def local_imports(source: Path) -> set[Path]:
    """The .py files beside `source` (in its folder and below) that it imports, and those they
    import in turn, found by reading the imports (nothing is run): `import helpers`, `from helpers
    import w`, `from . import w`, `from pkg.sub import w` -> helpers.py, w.py, pkg/sub.py or
    pkg/sub/w.py, pkg/__init__.py's. Without `source`."""
    seen, todo = set(), [source.resolve()]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        try:
            tree = ast.parse(f.read_text())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level <= 1:
                base = node.module or ""
                names = [base] * bool(base) + [f"{base}.{a.name}".lstrip(".") for a in node.names]
            else:
                continue
            for parts in (name.split(".") for name in names):
                # pkg, pkg.sub
                for stem in (source.parent.joinpath(*parts[:i]) for i in range(1, len(parts) + 1)):
                    todo += [
                        p.resolve()
                        for p in (stem.with_suffix(".py"), stem / "__init__.py")
                        if p.is_file()
                    ]
    return seen - {source.resolve()}


def stamp_of(cmd: list[str], lockstep: bool = False) -> dict:
    """What compare_command.json holds: the run's command line (after the interpreter), the code
    that ran it and the content of the files it names, and whether it ran as a lockstep member. A
    finished run is kept only if all match: a re-pretrained --init checkpoint, an edited reward
    file or reward module makes the run again, and so does the other engine (a lockstep member
    rounds otherwise than its run alone: another experiment)."""
    stamp = {"command": cmd[1:], "code": code_version(), "files": named_files(cmd)}
    return {**stamp, "lockstep": True} if lockstep else stamp


def finished_by(folder: Path, cmd: list[str], lockstep: bool = False) -> bool:
    """Whether `folder` holds a finished, intact run (finished) made by exactly this command, this
    code (code_version) and this engine (`lockstep`)."""
    try:
        stamp = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):  # missing, unreadable, not JSON (UnicodeDecodeError too)
        return False
    return stamp == stamp_of(cmd, lockstep) and finished(folder)


def finished(folder: Path) -> bool:
    """Whether `folder` holds a run that finished and whose record is intact: a summary.json with a
    stop reason, at the step of the last line of its metrics.jsonl (a torn or lost record is a run
    to make again, never a row of a table)."""
    try:
        summary = json.loads((folder / "summary.json").read_text())
        lines = (folder / "metrics.jsonl").read_text().splitlines()
        last = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return False
    return (
        isinstance(summary, dict)
        and summary.get("stop_reason") is not None
        and isinstance(last, dict)
        and last.get("step") == summary.get("step")
    )


def claim_runs(out: Path, command_of, overwrite: bool) -> None:
    """Refuse a sweep folder whose finished runs another command made (other trainer flags, reward,
    budget): one line, nothing touched; with overwrite, remove those runs (folders a stamp marks as
    runs of ours, nothing else). Runs of the same command are kept (finished) or made again
    (unfinished, or made by other code or files: stale). command_of(folder name) -> this
    invocation's command for that run folder (also for runs it does not make now), or None for a
    name it would never use."""
    other = []
    for folder in sorted(p for p in out.iterdir() if (p / STAMP).is_file()):
        try:
            made_by = json.loads((folder / STAMP).read_text())["command"]
        except (ValueError, KeyError, TypeError):
            made_by = None
        expected = command_of(folder.name)
        same = expected is not None and made_by == expected[1:]
        if not same and (folder / "summary.json").exists():
            other.append(folder)
    if other and not overwrite:
        names = ", ".join(f.name for f in other[:3]) + (", …" if len(other) > 3 else "")
        raise UsageError(
            f"--out {str(out)!r} holds {len(other)} finished run(s) of another compare command "
            f"({names}); pass --overwrite to replace them, or another --out"
        )
    for folder in other:
        try:
            shutil.rmtree(folder)
        except OSError as e:  # one line naming it; the runs not yet removed stay as they were
            raise UsageError(
                f"--overwrite could not remove {str(folder)!r} ({e.strerror or e}); remove it "
                "yourself, or pass another --out"
            ) from None
