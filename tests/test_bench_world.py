"""bench's world section (minigrpo/bench/world.py): its writer on fabricated run folders (no
training), the block's place in docs/worlds.md, and `bench --task sums` choosing it with --seeds."""

import json

import pytest
from conftest import one_line_error

from minigrpo.bench import pages, suite
from minigrpo.bench.world import read_run, world_block
from toy_tasks.sums_exact import BAR

FIGURES = ("exact_think_rate", "exact_accuracy")


def evaluation(step, think, accuracy, malformed, held=0.0):
    row = {"step": step, "target_rate": accuracy, "malformed": malformed}
    for h, shift in (("", 0.0), ("_heldout", held)):
        row |= {f"exact_think_rate{h}": think + shift, f"exact_accuracy{h}": accuracy + shift}
    return row


def fabricated_run(folder, steps, peak=0.015, end=(0.9, 0.96), wall=70.0, held=-0.02):
    """A finished run of `steps` evaluations from think rate 0.2, accuracy 0.45 to `end`."""
    folder.mkdir(parents=True)
    rows = [evaluation(0, 0.2, 0.45, 0.005, held)]
    rows += [evaluation(s, 0.5, 0.7, peak, held) for s in range(1, steps)]
    rows += [evaluation(steps, *end, 0.008, held)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stop = {"step": steps, "stop_reason": "goal reached (exact target >= 0.95)"}
    (folder / "summary.json").write_text(json.dumps(stop))
    (folder / "wall_seconds.txt").write_text(f"{wall:.2f}\n")
    return folder


@pytest.fixture
def world(tmp_path):
    pre = tmp_path / "pretrain-sums"
    pre.mkdir()
    row = {"got": {k: 0.1 for k in BAR}, "declared": {k: 0.1 for k in BAR}}
    report = {"rows": {"prompts n=2": row}, "ok": True}
    summary = {"val_over_floor": 0.01, "train_seconds": 279.0, "report": report}
    (pre / "summary.json").write_text(json.dumps(summary))
    runs = tmp_path / "world-sums"
    folders = [
        fabricated_run(runs / "s0", 40),
        fabricated_run(runs / "s1", 30, peak=0.03, end=(0.8, 0.9), wall=50.0),  # over the bar
        fabricated_run(runs / "s2", 20, end=(0.95, 0.97), wall=60.0, held=-0.2),  # held-out < 0.8
        runs / "s3",  # did not finish
    ]
    return pre, folders


def test_a_run_is_read_start_to_end_with_its_peak_and_bars(world):
    _, folders = world
    r = read_run(folders[1])
    assert r["figures"] == [*FIGURES, *(f"{k}_heldout" for k in FIGURES)]
    assert r["start"]["exact_think_rate"] == 0.2 and r["end"]["exact_accuracy"] == 0.9
    assert r["peak_malformed"] == 0.03 and r["steps"] == 30 and r["stop"] == "goal"
    assert any("peak malformed 0.0300 > 0.02" in m for m in r["missed"]), r["missed"]
    assert any("final target 0.9000 < 0.95" in m for m in r["missed"]), r["missed"]
    assert read_run(folders[0])["missed"] == [] and read_run(folders[3]) is None


def test_the_block_is_question_setup_table_conclusion_with_medians_over_the_seeds(world):
    pre, folders = world
    text = world_block("sums", pre, folders)
    for part in ("**Question.**", "**Setup.**", "**Conclusion.**", "Not finished: s3"):
        assert part in text, part
    assert "+1.0 % over the floor, 279 s of training" in text and "```" in text
    assert "`python -m minigrpo.grpo --task sums --seed S` for S = 0..3" in text
    assert "3/4 runs finished" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| seed | think rate start → end | accuracy start → end |")
    assert "| think rate, held-out start → end |" in rows[0]
    assert rows[1].startswith("| 0 | 0.200 → 0.900 | 0.450 → 0.960 | 0.180 → 0.880 |"), rows[1]
    assert rows[1].endswith("| 0.0150 | yes | 40 (goal) | 70 |"), rows[1]
    assert "peak malformed 0.0300 > 0.02" in rows[2]
    # medians (min–max) over the three finished seeds
    assert rows[-1].startswith(
        "| median (min–max) | 0.200 (0.200–0.200) → 0.900 (0.800–0.950) | "
        "0.450 (0.450–0.450) → 0.960 (0.900–0.970) |"
    ), rows[-1]
    assert rows[-1].endswith("| 0.0150 (0.0150–0.0300) | 2/3 | 30 (20–40) | 60 (50–70) |")
    assert "think rate +0.700 (+0.600–+0.750)" in text
    # s0 meets item 3; s1 misses a bar; s2's held-out think rate ends at 0.75
    assert "2/3 runs within every bar" in text and "met by 1/3 runs" in text


def test_the_block_goes_to_worlds_md_and_keeps_its_prose(world, tmp_path):
    pre, folders = world
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "worlds.md").write_text("# The worlds\n\nprose kept\n")
    assert pages.page_of("world-sums") == "worlds.md"
    pages.write_blocks(docs, {"world-sums": world_block("sums", pre, folders)}, pages.HEADER)
    page = (docs / "worlds.md").read_text()
    assert page.startswith("# The worlds\n\nprose kept\n") and "<!-- bench:world-sums -->" in page
    assert "<!-- /bench:world-sums -->" in page and "**Conclusion.**" in page


def test_bench_task_sums_is_the_world_section_with_its_seeds(tmp_path, monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(
        suite, "bench_world", lambda out, task, seeds, jobs: asked.append((task, seeds)) or "T"
    )
    monkeypatch.setattr(suite, "bench_thinking", lambda out: asked.append("thinking") or "U")
    docs = tmp_path / "docs"
    suite.main(
        ["--task", "sums", "--seeds", "3", "--out", str(tmp_path / "b"), "--docs", str(docs)]
    )
    assert asked == [("sums", 3), "thinking"]
    assert "<!-- bench:thinking-sums -->" in (docs / "experiments.md").read_text()
    assert "<!-- bench:world-sums -->" in (docs / "worlds.md").read_text()
    err = one_line_error(suite.main, ["--only", "world", "--out", str(tmp_path / "c")], capsys)
    assert "another task's own world" in err
    err = one_line_error(
        suite.main,
        ["--task", "arithmetic", "--only", "thinking", "--out", str(tmp_path / "d")],
        capsys,
    )
    assert "the sums world's" in err
