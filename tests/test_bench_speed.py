"""bench's prefix section on a tiny model: both tables, figures present and finite; no timed asserts."""

import re

from minigrpo.bench_speed import bench_prefix


def test_prefix_section_reports_nodes_agreement_and_both_runs(tmp_path, tiny_pretrained):
    init, _, _ = tiny_pretrained
    text = bench_prefix(tmp_path, init, steps=2, repeat=1)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("| rows")}
    for name in ("anchor (tree)", "first rollout (16 x 4)", "exact evaluation (8 people x 12 foods)"):
        shape, real, nodes, plain, shared, _, delta = rows[name]
        assert 0 < int(nodes) <= int(real), (name, rows[name])  # never more nodes than real input slots
        assert float(plain) > 0 and float(shared) > 0 and float(delta) < 1e-4, (name, rows[name])
    assert re.match(r"\d+(\.\d+)?", rows["plain"][0]) and rows["shared prefixes"][2] in ("0", "1", "2"), rows
