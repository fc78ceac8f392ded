"""The results pages bench writes (minigrpo/bench/pages.py): the header line, blocks replaced in
place, the rest of a page kept, new blocks appended. No training run."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from minigrpo.bench import pages
from minigrpo.bench.suite import block_names

PAGE = """# Measured results

Prose the bench never touches.

<!-- bench:grpo -->

| old | grpo |
|---|---|

<!-- /bench:grpo -->

More prose, kept.

<!-- bench:presets -->

| old | presets |

<!-- /bench:presets -->

## Elsewhere
"""


def test_the_header_names_the_date_machine_torch_and_commit():
    import torch

    fields = pages.machine()
    line = pages.header(fields, ["sampling", "threads"])
    assert line.startswith(pages.HEADER) and "\n" not in line
    assert re.search(r"\b\d{4}-\d{2}-\d{2}\b", line), line
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert f", {cpus} CPUs," in line, line
    assert (
        f"torch {torch.__version__}" in line and ("no GPU" in line) != torch.cuda.is_available()
    ), line
    assert fields["platform"] and fields["platform"] in line and "sampling, threads" in line, line
    commit = fields["commit"].removeprefix("commit ")
    root = Path(pages.__file__).resolve().parents[2]
    inside = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if inside.returncode == 0:  # a checkout: its short hash
        assert commit.split(",")[0] == inside.stdout.strip(), commit
    else:
        assert commit == "unknown"


def test_outside_a_git_checkout_the_commit_is_unknown(tmp_path):
    assert pages.git_commit(tmp_path) == "unknown"
    assert pages.machine(tmp_path)["commit"] == "commit unknown"


def test_a_block_is_replaced_in_place_and_the_rest_of_the_page_is_kept():
    page = pages.replace_block(PAGE, "grpo", "\n### grpo: new\n| new | grpo |\n|---|---|")
    assert "| old | grpo |" not in page and "### grpo: new\n| new | grpo |" in page
    assert page.count("<!-- bench:grpo -->") == 1 and page.count("<!-- /bench:grpo -->") == 1
    assert (
        page.index("Prose the bench")
        < page.index("| new | grpo |")
        < page.index("More prose, kept.")
    )
    before, after = PAGE.split("<!-- bench:grpo -->")[0], PAGE.split("<!-- /bench:grpo -->")[1]
    assert page.startswith(before) and page.endswith(after), (
        "everything outside the block is kept byte for byte"
    )
    assert "| old | presets |" in page, "another section's block is kept"
    # idempotent
    assert pages.replace_block(page, "grpo", "### grpo: new\n| new | grpo |\n|---|---|") == page


def test_a_block_the_page_lacks_is_appended_at_the_end():
    page = pages.replace_block(PAGE, "optimum", "### optimum\n| a |")
    assert page.startswith(PAGE.rstrip("\n")) and page.endswith(
        "<!-- bench:optimum -->\n\n### optimum\n| a |\n\n<!-- /bench:optimum -->\n"
    )


@pytest.mark.parametrize(
    "broken",
    [
        "<!-- bench:grpo -->\n| x |\n",
        "| x |\n<!-- /bench:grpo -->\n",
        "<!-- /bench:grpo -->\n<!-- bench:grpo -->\n",
    ],
)
def test_unbalanced_markers_are_refused_not_guessed(broken):
    with pytest.raises(ValueError, match="unbalanced"):
        pages.replace_block("# p\n" + broken, "grpo", "new")


def test_write_blocks_puts_each_block_on_its_page_with_one_header_line(tmp_path):
    (tmp_path / "results.md").write_text(PAGE)
    line = pages.header(
        {
            "date": "2000-01-02",
            "platform": "Linux x86_64",
            "cpus": "2 CPUs",
            "gpu": "no GPU",
            "torch": "torch 9",
            "commit": "commit abc1234",
        },
        ["grpo", "sampling"],
    )
    written = pages.write_blocks(tmp_path, {"grpo": "| g |", "sampling": "| s |"}, line)
    assert sorted(p.name for p in written) == ["performance.md", "results.md"]
    results, perf = (tmp_path / "results.md").read_text(), (tmp_path / "performance.md").read_text()
    assert (
        results.startswith(line + "\n\n# Measured results\n")
        and "| g |" in results
        and "| s |" not in results
    )
    assert "| old | presets |" in results and "More prose, kept." in results
    stamp = "*Measured on 2000-01-02: Linux x86_64, 2 CPUs, no GPU, torch 9, commit abc1234.*"
    assert (
        perf.startswith(line + "\n\n# Performance\n")
        and f"<!-- bench:sampling -->\n\n{stamp}\n\n| s |" in perf
    )
    assert f"{stamp}\n\n| g |" in results, "each block says when and where it was measured"
    later = line.replace("2000-01-02", "2000-01-03")
    pages.write_blocks(tmp_path, {"presets": "| p |"}, later)  # a later, partial run
    results = (tmp_path / "results.md").read_text()
    assert (
        results.startswith(later + "\n\n# Measured results\n") and results.count(pages.HEADER) == 1
    )
    assert "| g |" in results and "| p |" in results and "| old | presets |" not in results
    assert (
        f"{stamp}\n\n| g |" in results and stamp.replace("01-02", "01-03") + "\n\n| p |" in results
    )
    assert (tmp_path / "performance.md").read_text() == perf, (
        "a page none of the run's blocks belong to is left alone"
    )
    (tmp_path / "experiments.md").write_text("# Experiments\n\nProse.\n")
    pages.write_blocks(tmp_path, {"comparing": "| c |"}, later)
    experiments = (tmp_path / "experiments.md").read_text()
    assert (
        experiments.startswith("# Experiments\n\nProse.\n") and pages.HEADER not in experiments
    ), "a page written by hand gets its block, and no header claiming the page"
    assert "<!-- bench:comparing -->" in experiments and "| c |" in experiments


def test_a_section_result_becomes_named_blocks_and_another_task_never_overwrites_food():
    assert block_names("sampling", "food", "| s |") == {"sampling": "| s |"}
    parts = {"grpo": "a", "spillover": "b", "grpo-step-time": "c"}
    assert block_names("grpo", "food", parts) == parts
    assert block_names("grpo", "arithmetic", "t") == {"grpo-arithmetic": "t"}
    # never the CPU's block
    assert block_names("population", "food", "t", "cuda") == {"population-cuda": "t"}
    assert block_names("grpo", "arithmetic", "t", "cuda:0") == {"grpo-arithmetic-cuda": "t"}
    assert (
        pages.page_of("population-cuda") == "performance.md"
        and pages.page_of("grpo-cuda") == "results.md"
    )
    assert {
        pages.page_of(b) for b in ("sampling", "threads", "prefix", "step", "grpo-step-time")
    } == {"performance.md"}
    assert {
        pages.page_of(b) for b in ("grpo", "presets", "spillover", "pretrain", "grpo-arithmetic")
    } == {"results.md"}


def test_the_repository_pages_hold_balanced_markers_for_the_sections_they_show():
    docs = Path(__file__).resolve().parents[1] / "docs"
    for name, blocks in {
        "results.md": ("grpo", "rarest", "targets", "presets", "spillover", "pretrain"),
        "performance.md": ("sampling", "prefix", "threads"),
        "experiments.md": ("comparing",),
    }.items():
        text = (docs / name).read_text()
        for block in blocks:
            assert pages.page_of(block) == name
            assert (
                text.count(f"<!-- bench:{block} -->") == 1
                and text.count(f"<!-- /bench:{block} -->") == 1
            ), block
            pages.replace_block(text, block, "x")  # balanced: no ValueError


def test_bench_prints_its_sections_and_writes_them_into_docs_only_when_asked(
    tmp_path, monkeypatch, capsys
):
    """Issue 52: a bench run leaves the tracked pages alone unless asked (--write-docs, or a --docs
    folder named); asked, into the docs/ of the current folder."""
    from minigrpo.bench import suite

    # no timing run
    monkeypatch.setattr(suite, "bench_sampling", lambda device: "\n### sampling\n| s |")
    monkeypatch.setattr(suite, "bench_threads", lambda device: "\n### threads\n| t |")
    monkeypatch.chdir(tmp_path)
    for argv in (["--quick"], ["--only", "sampling,threads"], ["--quick", "--no-write-docs"]):
        suite.main([*argv, "--out", "runs/a"])  # printed, no page written
        assert "| s |" in capsys.readouterr().out and not (tmp_path / "docs").exists(), argv
    suite.main(["--only", "sampling,threads", "--write-docs", "--out", "runs/b"])
    page = (tmp_path / "docs" / "performance.md").read_text()
    assert page.startswith(pages.HEADER) and "sampling, threads" in page.splitlines()[0]
    stamp = pages.measured(page.splitlines()[0])
    assert (
        f"<!-- bench:sampling -->\n\n{stamp}\n\n### sampling\n| s |\n\n<!-- /bench:sampling -->"
        in page
    )
    assert "| t |" in page
    assert not (tmp_path / "docs" / "results.md").exists(), (
        "the quick sections are speed: performance.md only"
    )
    suite.main(["--only", "threads", "--out", "runs/c", "--docs", "elsewhere"])
    assert "| t |" in (tmp_path / "elsewhere" / "performance.md").read_text()
    assert (tmp_path / "docs" / "performance.md").read_text() == page
