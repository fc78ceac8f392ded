"""bench's comparing section (minigrpo/bench/comparing.py): docs/experiments.md's "Comparing
algorithms" from compare's estimates, its conclusion only what intervals.verdict calls."""

from pathlib import Path

from test_intervals import many

from minigrpo.bench import comparing, pages
from minigrpo.tools.intervals import comparison


def test_the_conclusion_says_only_what_the_intervals_support():
    c = comparison(
        {
            "default": many(0.99),
            "grpo": many(0.97, seed=1),
            "dapo": many(0.99, seed=2),
            "ppo": many(0.99, seed=3, reach=0),
        }
    )
    lines = comparing.conclusion(c)
    assert lines[0].startswith("- **final exact target rate** (higher is better) against default:")
    assert "worse: grpo (IQM − default: -0.0" in lines[0]
    assert "no difference shown: dapo and ppo." in lines[0] and "better:" not in lines[0]
    assert "better: ppo (IQM − default: -1)" in lines[1] and "grpo" not in lines[1].split(";")[0]
    few = comparison({"default": many(0.99, 5), "grpo": many(0.9, 5, seed=1)})
    assert comparing.conclusion(few)[0].endswith("n < 10: none called: grpo."), "5 runs: no call"


def test_the_block_is_question_setup_a_table_per_figure_and_conclusion(monkeypatch):
    bars = {"peak_malformed": 0.001, "malformed": 0.001, "worst_drift": None}
    results = {
        name: [r | {"final": r["final"] | bars} for r in runs]
        for name, runs in (("default", many(0.99)), ("grpo", many(0.97, seed=1)))
    }
    monkeypatch.setattr(comparing, "read_runs", lambda folder: results)
    block = comparing.comparing_block(Path("unused"), wall=600.0)
    order = ["**Question.**", "**Setup.**", "in 10.0 minutes", "20/20 runs within every bar"]
    order += ["Runs counted per algorithm: default 10, grpo 10.", "*final exact target rate"]
    order += ["| grpo | 10 |", "*steps to 0.95", "*regret", "**Conclusion.**", "- **regret**"]
    at = [block.index(part) for part in order]
    assert at == sorted(at), block
    assert pages.page_of("comparing") == "experiments.md"
