"""Learn by implementing: write each piece of GRPO yourself; the library's own tests grade it; your
pieces train.

    python -m minigrpo.learn                  # the path: numbered exercises and their status
    python -m minigrpo.learn start 3          # writes exercise 3's stub into your workspace
                                              # (runs/learn/)
    python -m minigrpo.learn check 3          # grades it with the library's property tests
    python -m minigrpo.learn hint 3           # one hint at a time (hint 3 2: the second again; hint
                                              # 3 --all)
    python -m minigrpo.learn check --all      # the whole path, then the capstone's training run

N is an exercise's number or its function's name (e.g. group_advantages). Your function lives at
<dir>/<module>.py with the library's own signature; nothing under minigrpo/ is ever changed. `check`
exits 0 when the exercise passes and 1 when it does not.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path

from minigrpo.learn import child, grade, workspace
from minigrpo.learn.path import CAPSTONE, PATH, find
from minigrpo.util.cli import UsageError, main_guard


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print its usage and exit 2; we want one clear line
        raise UsageError(message)


def parse(argv):
    parser = _Parser(prog="python -m minigrpo.learn", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dir", default=workspace.DEFAULT_DIR, help="your workspace (default: runs/learn)"
    )
    # --dir after the command too; SUPPRESS keeps the default above
    common = _Parser(add_help=False)
    common.add_argument(
        "--dir", default=argparse.SUPPRESS, help="your workspace (default: runs/learn)"
    )
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    for name, help_text in (
        ("list", "the path and each exercise's status"),
        ("start", "write an exercise's stub"),
        ("check", "grade an exercise (or --all)"),
        ("hint", "the next hint of an exercise (hint N K: hint K again; --all: every hint)"),
    ):
        p = sub.add_parser(name, help=help_text, parents=[common])
        if name != "list":
            p.add_argument(
                "exercise", nargs="?", help="its number (1-%d) or its function's name" % len(PATH)
            )
        if name == "check":
            p.add_argument(
                "--all",
                action="store_true",
                help="every exercise in order, then the capstone's run",
            )
        if name == "hint":
            p.add_argument("k", nargs="?", type=int, help="show hint K (again)")
            p.add_argument("--all", action="store_true", help="every hint of the exercise")
    args = parser.parse_args(argv)
    args.command = args.command or "list"
    if not args.dir.strip():  # '' would be the current folder, and start writes stubs there
        raise UsageError(f"--dir {args.dir!r} names no folder: give one (default runs/learn)")
    if Path(args.dir).resolve().is_relative_to(Path(grade.__file__).resolve().parent.parent):
        raise UsageError(
            f"--dir {args.dir} is inside the package: choose a folder of yours (default runs/learn)"
        )
    check_workspace(args.dir, writes=args.command != "list")
    if args.command in ("start", "hint") or (args.command == "check" and not args.all):
        if not args.exercise:
            raise UsageError(
                f"{args.command} needs an exercise: a number 1-{len(PATH)} or a function's name"
            )
        try:
            args.exercise = find(args.exercise)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if (
        args.command == "hint"
        and args.k is not None
        and not 1 <= args.k <= len(args.exercise.hints)
    ):
        raise UsageError(
            f"exercise {args.exercise.number} has {len(args.exercise.hints)} hints: give K from 1 "
            f"to {len(args.exercise.hints)}"
        )
    return args


def check_workspace(folder: str, writes: bool) -> None:
    """A UsageError naming --dir when it cannot be the workspace: a file, under a file, or (when the
    command writes there) a folder this user cannot write in."""
    path = Path(folder).absolute()
    # the folder itself, or where it would go
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(
            f"--dir {folder} is a file, not a folder: choose a folder for your workspace"
            if existing == path
            else f"--dir {folder} cannot be a folder: {existing} is a file"
        )
    if writes and not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(
            f"--dir {folder} is not writable"
            + (
                ""
                if existing == path
                else f" (it would be created in {existing}, which this user cannot write in)"
            )
        )


def show_list(folder) -> None:
    print(f"the path (workspace {folder}):")
    for ex in PATH:
        print(
            f"  {ex.number:2d}  {ex.name:<26} {grade.graded_status(ex, folder):<21} "
            f"~{ex.minutes:2d} min  {ex.lesson}"
        )
    step = grade.next_step(folder)
    fresh = all(workspace.read(ex, folder)[0] == "not started" for ex in PATH)
    print(grade.the_end(folder) if step is None else f"{'start with' if fresh else 'next'}: {step}")


def start(ex, folder) -> None:
    path, written = workspace.write_stub(ex, folder)
    if not written:
        print(f"exercise {ex.number} {ex.name} is already in {path} (left as it is)")
        return
    print(
        f"wrote the stub of exercise {ex.number} {ex.name} into {path}: replace its `raise "
        "NotImplementedError`"
    )
    print(f"  what it teaches: {ex.lesson}")
    print(
        f"  what the check grades: its docstring, and what the first hint adds "
        f"({workspace.command(f'hint {ex.number} 1', folder)})"
    )
    print(
        f"  then: {workspace.command(f'check {ex.number}', folder)}    "
        f"(stuck? {workspace.command(f'hint {ex.number}', folder)})"
    )


def hint(ex, folder, k: int | None = None, every: bool = False) -> None:
    """The next hint (after the last one shown), hint k again, or every hint."""
    progress = grade.load_progress(folder)
    shown = progress.get(ex.name, {}).get("hints", 0)
    numbers = range(1, len(ex.hints) + 1) if every else [k or min(shown + 1, len(ex.hints))]
    for i in numbers:
        print(f"hint {i} of {len(ex.hints)} for exercise {ex.number} {ex.name}: {ex.hints[i - 1]}")
    progress[ex.name] = {**progress.get(ex.name, {}), "hints": max(shown, *numbers)}
    grade.save_progress(folder, progress)


def ensure_pretrained(root: Path) -> None:
    """Pretrain the capstone's model if the repository has none; a failed pretraining says why in
    one line (the capstone then says "pretrain first")."""
    if not grade.pretrained_model(root).exists():
        print(
            "the capstone needs the pretrained model: python -m minigrpo.pretrain (about 15 s) ...",
            flush=True,
        )
        code, out, err = child.run([sys.executable, "-m", "minigrpo.pretrain"], cwd=root)
        if code != 0:
            lines = (err or out).strip().splitlines()
            print(f"the pretraining failed: {lines[-1] if lines else f'exit code {code}'}")


def check(args) -> bool:
    folder = args.dir
    todo = PATH if args.all else (args.exercise,)
    results = {}
    for ex in todo:
        if args.all and workspace.status(ex, folder) == "not started":
            print(f"exercise {ex.number} {ex.name}: not started")
            results[ex.name] = False
            continue
        results[ex.name] = grade.check(ex, folder, say_next=not args.all)
    if CAPSTONE in todo and workspace.status(CAPSTONE, folder) == "written":
        ensure_pretrained(grade.repo_root())
        results["capstone run"] = grade.capstone(folder)[0]
    if args.all:
        print(f"the path: {sum(results.values())} of {len(results)} passing")
        step = grade.next_step(folder)
        if step:
            print(f"next: {step}")
    return all(results.values())


@main_guard
def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        grade.repo_root()
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    if args.command == "list":
        show_list(args.dir)
    elif args.command in ("start", "hint"):
        try:
            if args.command == "start":
                start(args.exercise, args.dir)
            else:
                hint(args.exercise, args.dir, args.k, args.all)
        # what check_workspace could not foresee (a read-only file system, a file in the way)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise  # main_guard's "the disk is full"
            raise UsageError(
                f"--dir {args.dir}: cannot write {e.filename or 'in it'}: {e.strerror or e}"
            ) from None
    elif not check(args):
        sys.exit(1)


if __name__ == "__main__":
    main()
