"""The pages a person reads: every relative link in README.md and docs/*.md reaches a file, and
every #anchor a heading of it (GitHub's rule: lower case, punctuation dropped, each space a hyphen,
a repeated heading -1, -2, …); the README stays one sitting; the top level holds only what the brief
fixes (what git tracks; in a copy without git, what is there less environments and caches)."""

import collections
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(path: Path) -> str:
    # code blocks hold no links
    return re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)


def heading_anchors(markdown: str) -> set[str]:
    """The #anchors GitHub gives the headings of a page."""
    anchors, seen = set(), collections.Counter()
    for line in markdown.splitlines():
        if m := re.match(r"#{1,6}\s+(.*?)\s*$", line):
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)).replace("`", "")
            slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
            anchors.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    return anchors


def test_heading_anchors_follow_githubs_rule():
    page = "# Sampler ≠ trainer: what it costs\n## The `k3` KL\n## Runs\n## Runs\n"
    assert heading_anchors(page) == {
        "sampler--trainer-what-it-costs",
        "the-k3-kl",
        "runs",
        "runs-1",
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_reaches_a_file_and_its_heading(page):
    broken = []
    for link in LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target) if target else page
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in heading_anchors(_prose(path)):
            broken.append(f"{link}: no such heading in {path.name}")
    assert not broken, f"{page.name}: {broken}"


def test_the_readme_is_read_in_one_sitting():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 300


FIXED = {"README.md", "pyproject.toml", "minigrpo", "toy_tasks", "tests", "runs", "docs"}
# what an install, a test run or an editor leaves beside the tracked files (and hidden files)
CACHES = {
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".ruff_cache",
    ".benchmarks",
    "build",
    "dist",
}
VENVS = {".venv", "venv", "env"}


def top_level(root: Path) -> set[str]:
    """The names at the top of `root` that count: in a git work tree, those of the files git tracks
    (`git ls-files`); elsewhere (a copy without .git, or no git), what is there less virtual
    environments (.venv, venv, env, any folder holding pyvenv.cfg), caches, *.egg-info and hidden
    files."""
    if (root / ".git").exists():
        try:
            done = subprocess.run(
                ["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True
            )
            return {line.split("/")[0] for line in done.stdout.splitlines()} - {""}
        except (OSError, subprocess.CalledProcessError):
            pass  # no git at hand: judge what is there
    return {
        p.name
        for p in root.iterdir()
        if not p.name.startswith(".")
        and p.name not in VENVS | CACHES
        and not p.name.endswith(".egg-info")
        and not (p / "pyvenv.cfg").exists()
    }


def test_the_top_level_holds_only_the_fixed_layout():
    names = {n for n in top_level(ROOT) if not n.startswith(".")}  # .ci, .gitignore
    assert names <= FIXED, f"not in the brief's layout: {sorted(names - FIXED)}"


def test_a_copy_without_git_holding_a_venv_and_caches_holds_the_fixed_layout(tmp_path):
    for name in FIXED - {"README.md", "pyproject.toml"}:
        (tmp_path / name).mkdir()
    for name in ("README.md", "pyproject.toml", ".gitignore"):
        (tmp_path / name).write_text("")
    for name in (".venv", "myenv", "__pycache__", ".pytest_cache", "minigrpo.egg-info", "build"):
        (tmp_path / name).mkdir()
    for venv in (".venv", "myenv"):
        (tmp_path / venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert top_level(tmp_path) == FIXED
    (tmp_path / "notes.txt").write_text("")  # anything else there counts
    (tmp_path / "scratch").mkdir()
    assert top_level(tmp_path) == FIXED | {"notes.txt", "scratch"}


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_in_a_git_work_tree_only_the_tracked_files_count(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "minigrpo").mkdir()
    for name in ("README.md", "minigrpo/__init__.py", ".gitignore", "run.log"):
        (tmp_path / name).write_text("")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "pyvenv.cfg").write_text("")
    git("add", "README.md", "minigrpo", ".gitignore")
    assert top_level(tmp_path) == {"README.md", "minigrpo", ".gitignore"}  # not run.log nor .venv
