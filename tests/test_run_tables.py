"""compare's tables of a sweep's runs (minigrpo/tools/run_tables.py): at most 10 columns with unique
plain headers, and every run's figures in runs.csv."""

import csv

import pytest

from minigrpo.tools.run_tables import FINAL_KEYS, main_table, more_table, write_runs_csv


def run(name, target, regret=0.0004, reached=12):
    final = {k: 0.001 for k in FINAL_KEYS} | {"target_rate": target, "steps": 60}
    final |= {"regret": regret, "implied_beta": float("inf"), "kl_to_optimum": None}
    steps = list(range(61))
    return {
        "run": name,
        "steps": steps,
        "secs": [0.5 * s for s in steps],
        "tokens": [100.0 * s for s in steps],
        "target": [0.1 if s < reached else target for s in steps],
        "final": final,
        "peak_at": {},
    }


RESULTS = {
    "default": [run("default-s0", 0.99), run("default-s1", 0.98)],
    "grpo": [run("grpo-s0", 0.9, reached=61)],
}


def header(table):
    return [c.strip() for c in table[0].split("|")[1:-1]]


@pytest.mark.parametrize("regret", [True, False])
def test_each_table_has_at_most_ten_columns_each_header_unique_and_plain(regret):
    for table in (
        main_table(RESULTS, {"grpo": [(1, "boom")]}, regret),
        more_table(RESULTS, regret),
    ):
        names = header(table)
        assert len(names) <= 10 and len(set(names)) == len(names), names
        assert all(len(row.split("|")) == len(table[0].split("|")) for row in table), table
    main = main_table(RESULTS, {"grpo": [(1, "boom")]}, regret)
    assert header(main)[:4] == ["algorithm", "runs", "within bars", "steps to 0.95"]
    assert ("regret" in header(main)) == regret
    assert main[3].startswith("| grpo | 1 ok, 1 failed | 0/1 | never | never | 0.9 |"), main
    assert main[2].startswith(
        "| default | 2 ok | 2/2 | 12 (12–12) | 6 (6–6) | 0.985 (0.98–0.99) |"
    ), main


def test_runs_csv_holds_every_run_and_every_figure(tmp_path):
    write_runs_csv(tmp_path / "runs.csv", RESULTS)
    with open(tmp_path / "runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == ["default-s0", "default-s1", "grpo-s0"]
    assert set(FINAL_KEYS) < set(rows[0]) and rows[0]["algorithm"] == "default"
    assert rows[1]["within bars"] == "True" and rows[1]["missed"] == ""
    assert rows[2]["within bars"] == "False" and rows[2]["missed"] == "final target 0.9000 < 0.95"
    assert rows[2]["steps to 0.95"] == "" and rows[2]["target_rate"] == "0.9"
    assert rows[0]["steps to 0.95"] == "12" and rows[0]["seconds to 0.95"] == "6.0"
    assert rows[0]["implied_beta"] == "inf" and rows[0]["kl_to_optimum"] == ""


def test_a_worlds_own_figures_reach_runs_csv_and_a_table_of_their_own(tmp_path):
    """curves() reads the world's figures from a run's metrics.jsonl (the step-0 evaluation's keys
    that compare's columns do not carry: last values, and a malformed figure's every-step maximum),
    and runs.csv and world_table carry them; food's runs (none) get no such table."""
    import json

    from minigrpo.tools.run_tables import short_world_table, world_keys, world_table
    from minigrpo.tools.sweep_report import curves

    first = {"step": 0, "target_rate": 0.4, "best_reward": 1.0, "off_support": 0.01}
    first |= {"drift_ravin": 0.0, "peak_malformed": 0.01, "malformed": 0.01}
    first |= {"exact_think_rate": 0.2, "exact_think_rate_heldout": 0.19, "malformed_heldout": 0.02}
    assert world_keys(first) == [
        "exact_think_rate",
        "exact_think_rate_heldout",
        "malformed_heldout",
        "peak_malformed_heldout",
    ]
    runs = {}
    for name, (mid, end) in {"default-s0": (0.5, 0.9), "default-s1": (0.6, 0.7)}.items():
        folder = tmp_path / name
        folder.mkdir()
        rows = [
            first,
            {**first, "step": 1, "exact_think_rate": mid, "malformed_heldout": 0.05, "loss": 1.0},
            {**first, "step": 2, "exact_think_rate": end, "malformed_heldout": 0.03, "loss": 1.0},
        ]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs[name] = curves(folder)
    world = runs["default-s0"]["world"]
    assert world["exact_think_rate"] == 0.9 and world["malformed_heldout"] == 0.03
    assert world["peak_malformed_heldout"] == 0.05 and "loss" not in world
    results = {"default": list(runs.values()), "grpo": [run("grpo-s0", 0.9)]}
    write_runs_csv(tmp_path / "runs.csv", results)
    with open(tmp_path / "runs.csv", newline="") as f:
        got = list(csv.DictReader(f))
    assert [r["exact_think_rate"] for r in got] == ["0.9", "0.7", ""], got
    assert got[0]["peak_malformed_heldout"] == "0.05"
    table = world_table(results)
    assert header(table) == ["figure", "default", "grpo"], table
    assert "| exact_think_rate | 0.8 (0.7–0.9) | - |" in table, table
    assert not any("heldout" in line for line in world_table(results, held_out=False))
    assert short_world_table(results).splitlines()[1].split() == ["exact_think_rate", "0.8", "-"]
    assert world_table(RESULTS) == [] and short_world_table(RESULTS) == ""
