"""bench's prefix and threads sections: tables present, figures finite; no timed asserts."""

import re

import pytest

from minigrpo.bench.speed import bench_prefix


@pytest.mark.slow
def test_prefix_section_reports_nodes_agreement_and_both_runs(tmp_path, tiny_pretrained):
    init, _, _ = tiny_pretrained
    text = bench_prefix(tmp_path, init, steps=2, repeat=1)
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| rows")
    }
    for name in (
        "anchor (tree)",
        "first rollout (16 x 4)",
        "exact evaluation (8 people x 12 foods)",
    ):
        shape, real, nodes, plain, shared, _, delta = rows[name]
        # never more nodes than real input slots
        assert 0 < int(nodes) <= int(real), (name, rows[name])
        assert float(plain) > 0 and float(shared) > 0 and float(delta) < 1e-4, (name, rows[name])
    assert re.match(r"\d+(\.\d+)?", rows["plain"][0]) and rows["shared prefixes"][2] in (
        "0",
        "1",
        "2",
    ), rows


@pytest.mark.slow
def test_threads_section_measures_both_cases_and_marks_what_threads_0_picks(monkeypatch):
    from minigrpo.bench.speed import bench_threads
    from minigrpo.util import runtime

    # as on 2 cores
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    rows = [
        [c.strip() for c in line.split("|")[1:-1]]
        for line in bench_threads("cpu").splitlines()
        if line.startswith("| ") and not line.startswith("| threads")
    ]
    assert [r[0] for r in rows] == ["1", "2"]
    for column in (1, 2):  # the machine as it is; beside a process spinning on one core
        cells = [r[column] for r in rows]
        assert sum(c.endswith("(--threads 0)") for c in cells) == 1, cells
        assert all(float(c.split()[0]) > 0 for c in cells), cells
    assert rows[0][2].endswith("(--threads 0)"), (
        "beside a busy neighbour --threads 0 must take one thread on 2 cores"
    )
