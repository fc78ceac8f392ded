"""The pages a person reads: every relative link in README.md and docs/*.md reaches a file, and
every #anchor a heading of it (GitHub's rule: lower case, punctuation dropped, each space a hyphen,
a repeated heading -1, -2, …); the README stays one sitting; the top level holds only what the brief
fixes."""

import collections
import re
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


def test_the_top_level_holds_only_the_fixed_layout():
    """What git tracks (in a copy without git: what is there, less the build's egg-info)."""
    fixed = {"README.md", "pyproject.toml", "minigrpo", "toy_tasks", "tests", "runs", "docs"}
    try:
        files = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        names = {line.split("/")[0] for line in files.splitlines()}
    except (OSError, subprocess.CalledProcessError):
        names = {p.name for p in ROOT.iterdir() if not p.name.endswith(".egg-info")}
    names = {n for n in names if not n.startswith(".")}  # .ci, .gitignore
    assert names <= fixed, f"not in the brief's layout: {sorted(names - fixed)}"
