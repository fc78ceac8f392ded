"""The results pages `python -m minigrpo.bench --write-docs` writes (docs/results.md,
docs/performance.md by default), and the blocks it keeps in pages written by hand
(docs/experiments.md: EXPERIMENT_BLOCKS; docs/worlds.md: each task's world-<task>).

Each table a section prints lives in its page between two HTML comments, invisible on the rendered
page:

    <!-- bench:grpo -->
    ...the table...
    <!-- /bench:grpo -->

A run replaces the blocks of the sections it ran, in place, and leaves the rest of the page (prose,
other sections' blocks) as it was; a block the page does not hold yet is appended at its end. The
page's first line says when, where and on what code it was last written (`header`): date, platform,
CPUs, GPU, torch, commit; a page written by hand gets no such line (its blocks say theirs).
"""

from __future__ import annotations

import datetime
import platform
import re
import subprocess
from pathlib import Path

from minigrpo.util.runtime import cores

PERFORMANCE, RESULTS, EXPERIMENTS = "performance.md", "results.md", "experiments.md"
WORLDS = "worlds.md"  # written by hand around each task's world-<task> block (bench/world.py)
TITLES = {PERFORMANCE: "Performance", RESULTS: "Measured results"}
# blocks whose page is performance.md; every other block (the quality sections) goes to results.md
SPEED_BLOCKS = {
    "sampling",
    "threads",
    "scale",
    "prefix",
    "step",
    "grpo-step-time",
    "population",
    "sweep",
}
# blocks whose page is experiments.md, written by hand around them
EXPERIMENT_BLOCKS = {"comparing", "thinking-sums"}
# how a page's header line starts (and is found again)
HEADER = "> **Written by `python -m minigrpo.bench`**"


def page_of(block: str) -> str:
    name = block.removesuffix("-cuda")
    if name.startswith("world-"):
        return WORLDS
    if name in EXPERIMENT_BLOCKS:
        return EXPERIMENTS
    return PERFORMANCE if name in SPEED_BLOCKS else RESULTS


def git_commit(folder) -> str:
    """The short hash of the checkout holding `folder` (with ", uncommitted changes" when its
    tracked files differ from it); 'unknown' outside a git checkout or without git."""

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30
        )

    try:
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + (", uncommitted changes" if dirty else "")


def machine(code_folder=None) -> dict[str, str]:
    """The header's fields: date, platform, CPUs (those this process may use), GPU, torch, commit
    (of the checkout holding `code_folder`, default this package's)."""
    import torch

    cpus = cores()
    return {
        "date": datetime.date.today().isoformat(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpus": f"{cpus} CPUs",
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
        "torch": f"torch {torch.__version__}",
        "commit": f"commit {git_commit(code_folder or Path(__file__).resolve().parent)}",
    }


def header(fields: dict[str, str], sections: list[str]) -> str:
    """One line: the run's date, machine, torch and commit, and the sections this write came
    from."""
    return (
        f"{HEADER} on {fields['date']}: {fields['platform']}, {fields['cpus']}, {fields['gpu']}, "
        f"{fields['torch']}, {fields['commit']}; sections {', '.join(sections)}."
    )


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def replace_block(page: str, name: str, body: str) -> str:
    """`page` with block `name`'s content replaced by `body` (appended at the end when the page has
    none). ValueError for a block opened and not closed (or closed twice): the page is left to be
    mended by hand."""
    start, end = _markers(name)
    text = body.strip("\n")
    inside = f"{start}\n\n{text}\n\n{end}"
    opens = [m.start() for m in re.finditer(re.escape(start), page)]
    closes = [m.start() for m in re.finditer(re.escape(end), page)]
    if not opens and not closes:
        return page.rstrip("\n") + f"\n\n{inside}\n"
    if len(opens) != 1 or len(closes) != 1 or closes[0] < opens[0]:
        raise ValueError(
            f"the page's {start} … {end} markers are unbalanced "
            f"({len(opens)} opening, {len(closes)} closing): mend them by hand"
        )
    return page[: opens[0]] + inside + page[closes[0] + len(end) :]


def set_header(page: str, line: str) -> str:
    """`page` with its first line the header `line` (an earlier header replaced, else inserted)."""
    first, _, rest = page.partition("\n")
    if first.startswith(HEADER):
        return f"{line}\n{rest}"
    return f"{line}\n\n{page}"


def measured(line: str) -> str:
    """The line each block starts with: when, where and on what code IT was measured (the page's
    header names only the last run, which may have rewritten some of its blocks), from the header
    `line`."""
    when = line[len(HEADER) :].strip().removeprefix("on ").split("; sections")[0]
    return f"*Measured on {when}.*"


def write_blocks(folder, blocks: dict[str, str], line: str) -> list[Path]:
    """Put each {block name: markdown} into its page under `folder` (created with a title when
    missing), each block headed by when and where it was measured, and the header `line` at the top
    of every page bench writes whole (not experiments.md); -> the pages written."""
    from minigrpo.util.outputs import write_atomic

    folder = Path(folder)
    written = []
    for page_name in dict.fromkeys(page_of(b) for b in blocks):
        path = folder / page_name
        title = TITLES.get(page_name, "Experiments")
        page = path.read_text(encoding="utf-8") if path.exists() else f"# {title}\n"
        for name, body in blocks.items():
            if page_of(name) == page_name:
                page = replace_block(page, name, f"{measured(line)}\n\n{body.strip(chr(10))}")
        folder.mkdir(parents=True, exist_ok=True)
        if page_name in TITLES:
            page = set_header(page, line)
        write_atomic(path, page.encode("utf-8"), what="page")
        written.append(path)
    return written
