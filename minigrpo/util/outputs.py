"""The output folder of a run and the files in it, written so that nothing already written is lost.

`prepare_out(out, overwrite=..., resume=...)` claims the output folder: it refuses to mix a new run
into an old one, locks the folder against a second writer, and sweeps temp files a killed process
left. `write_json` and `write_atomic` never leave half a file, and a full disk keeps the previous
version.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import typing
from pathlib import Path

from minigrpo.util.cli import UsageError
from minigrpo.util.jsonl import strict_json

# any of these: a run lives here
RUN_FILES = ("model.pt", "metrics.jsonl", "summary.json", "config.json")
# what a run writes: all --overwrite removes
RUN_OUTPUTS = (*RUN_FILES, "metrics.png", "loss.png", "samples.txt")
MARK = (
    "minigrpo run folder: this file is its lock and its mark (--overwrite replaces only runs "
    "of ours)\n"
)
# the mark of a folder of run folders (compare's, bench's: runs_inside): no run's own files go in it
RUNS_MARK = "minigrpo folder of runs ({}): this file is its lock and its mark\n"
# write_atomic's (and older) temp names
STALE_TEMP_GLOBS = (".*.pt.tmp[0-9]*", ".*.json.tmp[0-9]*", "*.json.tmp")
# folder -> its open, flock-ed .lock file, held for the life of the process
_LOCKS: dict[str, typing.IO] = {}


def prepare_out(
    out: str, overwrite: bool = False, resume: bool = False, runs_inside: str | None = None
) -> Path:
    """Claim the output folder `out` for this process and return it as a Path.

    Creates it; refuses '' and paths that cannot be folders; takes an exclusive lock on
    `<out>/.lock` (held until the process ends, so a killed process never leaves it stuck); refuses
    a folder that already holds a run unless `overwrite` (the files a run writes, RUN_OUTPUTS, are
    then removed first, and only in a folder a run of ours wrote: `ours`) or `resume` (kept);
    deletes temp files a killed write left behind; marks the folder as ours (in its .lock). A
    command whose --out holds run folders, not a run (`runs_inside`: its name, compare or bench),
    refuses a folder that holds a run's own files whatever its flags: no flag of it replaces one;
    a run refuses such a command's folder (its mark, RUNS_MARK). Every refusal is a one-line
    UsageError."""
    out = str(out)
    if not out.strip():
        raise UsageError("--out is empty; give a folder path such as runs/my-run")
    path = Path(out)
    try:
        if path.exists() and not path.is_dir():
            raise UsageError(f"--out {out!r} is an existing file; give a folder path")
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            f"--out {out!r} cannot be created: {e.strerror or e}; give a writable folder"
        ) from None
    lock_out(path)
    old, holder = [name for name in RUN_FILES if (path / name).exists()], folder_of_runs(path)
    if holder and not runs_inside:
        release_out(path)
        raise UsageError(
            f"--out {out!r} is a folder of {holder}'s runs; a run writes a folder of its own: give "
            f"another --out, such as {str(path / 'my-run')!r} (nothing there was touched)"
        )
    if old and runs_inside:
        release_out(path)
        raise UsageError(
            f"--out {out!r} holds a run's own files ({', '.join(old)}); {runs_inside} writes a "
            "folder of run folders and replaces no run: give another --out (nothing there was "
            "touched)"
        )
    if old and not (overwrite or resume):
        release_out(path)
        raise UsageError(
            f"--out {out!r} already holds a run ({', '.join(old)}); pass --overwrite to replace it "
            f"(or --resume to continue it, in the RL commands), or another --out"
        )
    if old and overwrite and not resume and not ours(path):
        release_out(path)
        raise UsageError(
            f"--out {out!r} holds {', '.join(old)} that no minigrpo run wrote; --overwrite "
            "replaces only runs of ours: give another --out (nothing there was touched)"
        )
    remove_matching(path, STALE_TEMP_GLOBS)  # we hold the lock: no live writer owns these
    if old and overwrite and not resume:
        remove_matching(path, RUN_OUTPUTS)
    lock = path / ".lock"
    # a run's folder keeps its mark; a folder of runs is marked by the command that claims it
    if lock.stat().st_size == 0 or (runs_inside and holder != runs_inside):
        lock.write_text(RUNS_MARK.format(runs_inside) if runs_inside else MARK)
    return path


def lock_text(path: Path) -> str:
    """The text of the folder's .lock: its mark ('' without one)."""
    lock = path / ".lock"
    return lock.read_text(errors="replace") if lock.is_file() else ""


def folder_of_runs(path: Path) -> str | None:
    """The command whose folder of runs `path` is (its .lock's RUNS_MARK), else None."""
    text, head = lock_text(path), RUNS_MARK.split("{")[0]
    return text[len(head) :].split(")")[0] if text.startswith(head) else None


def ours(path: Path) -> bool:
    """Did a run of ours write this folder? Its .lock holds our mark, or (a run of a minigrpo from
    before the mark) its config.json is a settings object with a task and a metrics.jsonl lies
    beside it."""
    if lock_text(path).startswith(MARK.split(":")[0]):
        return True
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "task" in config and (path / "metrics.jsonl").is_file()


def lock_out(path: Path) -> None:
    """flock `<path>/.lock` (non-blocking); another live process holding it is a UsageError."""
    key = os.path.realpath(path)
    lock_path = path / ".lock"
    held = _LOCKS.get(key)
    if held is not None:  # this process already writes here (a library caller running twice)
        if lock_path.exists() and os.path.samestat(os.fstat(held.fileno()), lock_path.stat()):
            return
        release_out(path)  # the folder was deleted and made again: lock the new file
    try:
        f = open(lock_path, "a")
    except OSError as e:
        raise UsageError(
            f"--out {str(path)!r} is not writable: {e.strerror or e}; give a writable folder"
        ) from None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise UsageError(
            f"another process is writing to {path}; wait for it, stop it, or give another --out"
        ) from None
    _LOCKS[key] = f


def release_out(path) -> None:
    """Give up this process's lock on the folder `path` (it is also released when the process
    ends)."""
    f = _LOCKS.pop(os.path.realpath(path), None)
    if f is not None:
        f.close()


def remove_matching(folder: Path, patterns) -> None:
    for pattern in patterns:
        for p in folder.glob(pattern):
            if p.is_file() or p.is_symlink():
                p.unlink()


def write_atomic(path, data: bytes, what: str = "file") -> None:
    """Write `data` to a temp file beside `path`, fsync it, and rename it over `path` (atomic on
    POSIX).

    An OSError (a full disk, a read-only folder) becomes a one-line UsageError; the temp file is
    removed and the previous `path`, if any, is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        kept = f"; the previous {what} is kept" if path.exists() else ""
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UsageError(f"the disk is full while writing {path}{kept}") from None
        raise UsageError(f"cannot write {path}: {e.strerror or e}{kept}") from None
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json(path: Path, obj) -> None:
    """Write JSON atomically (temp file + rename), so a crash never leaves half a file; strict JSON:
    non-finite numbers as null."""
    write_atomic(
        path,
        (json.dumps(strict_json(obj), indent=2, default=str, allow_nan=False) + "\n").encode(),
        what="file",
    )
