"""compare and optimum on the sums world (issue 54, item 5), through the task registry alone: a tiny
sums model (conftest.tiny_sums_pretrained), compare's runs with both engines carrying the world's
own exact figures into runs.csv and table.md, and the exact optimum of every RL prompt at one β."""

import csv
import json

import pytest
import torch
from conftest import one_line_error

from minigrpo import compare, optimum
from minigrpo.exact import frontier as F
from toy_tasks import sums as su
from toy_tasks.sums_exact import exact_figures_many, support_probs_many

# 4 prompts x 4 completions a step: the runs' exact evaluations (every completion of 567 prompts)
# are most of their time
SMALL = ["--prompts-per-step", "4", "--group-size", "4", "--jobs", "2", "--device", "cpu"]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["pool", "population"])
def test_compare_on_sums_carries_the_worlds_exact_figures_and_judges_its_bars(
    engine, tiny_sums_pretrained, tmp_path, capsys
):
    init, _, _ = tiny_sums_pretrained
    out = tmp_path / engine
    argv = ["--task", "sums", "--reward", "correct", "--algos", "grpo", "--seeds", "2"]
    compare.main(
        [*argv, "--steps", "2", "--engine", engine, "--init", str(init), "--out", str(out)]
    )
    printed = capsys.readouterr().out
    with open(out / "runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == ["grpo-s0", "grpo-s1"]
    for row, seed in zip(rows, (0, 1)):
        logged = [json.loads(x) for x in (out / f"grpo-s{seed}" / "metrics.jsonl").open()]
        last = logged[-1]
        assert last["step"] == 2 and row["steps"] == "2"
        for key in ("exact_accuracy", "exact_think_rate", "exact_pass_at_64", "malformed_heldout"):
            for name in (key, f"{key}_heldout") if "heldout" not in key else (key,):
                assert float(row[name]) == last[name], (name, row)
        peak = max(r["malformed_heldout"] for r in logged)
        assert float(row["peak_malformed_heldout"]) == peak
        # the bars as for every world: a model that answers almost nothing misses the target and
        # the every-step malformed bar
        assert row["within bars"] == "False" and "peak malformed" in row["missed"], row
    table = (out / "table.md").read_text()
    assert "The world's own figures" in table and "| exact_think_rate_heldout |" in table
    assert "peak malformed 0.9" in table and "(step 0)" in table
    assert "exact_think_rate" in printed and "exact_think_rate_heldout" not in printed, printed


def test_compare_on_sums_refuses_a_food_model_and_a_food_reward_in_one_line(
    tiny_pretrained, capsys
):
    base = ["--task", "sums", "--seeds", "1", "--steps", "1", "--out", "unused"]
    err = one_line_error(compare.main, [*base, "--init", str(tiny_pretrained[0])], capsys)
    assert "pretrained on task 'food', not 'sums'" in err
    # the reward is judged before the model is read
    err = one_line_error(
        compare.main, [*base, "--reward", "pizza", "--init", "/nonexistent/model.pt"], capsys
    )
    assert "unknown reward 'pizza'" in err and "correct" in err


def frontier_table(text: str) -> list[list[str]]:
    head = next(i for i, line in enumerate(text.splitlines()) if line.split()[:2] == ["β", "KL"])
    lines = text.splitlines()[head:]
    end = next(i for i, x in enumerate(lines) if not x.strip() or x.startswith("wrote"))
    return [line.split() for line in lines[:end]]


@pytest.mark.slow
def test_optimum_on_sums_is_every_prompts_own_optimum_at_one_beta(
    tiny_sums_pretrained, tmp_path, capsys
):
    """The table's β = ∞ row is π_ref's own exact figures (sums_exact); at β = 0.3 the means over
    the prompts are frontier.py's prompt by prompt, over each support and one malformed bucket."""
    init, model, tok = tiny_sums_pretrained
    optimum.main(["--task", "sums", "--init", str(init), "--out", str(tmp_path / "o")])
    text = capsys.readouterr().out
    rows = frontier_table(text)
    head, first, last = rows[0], rows[1], rows[-1]
    assert head[:4] == ["β", "KL", "E[r]", "P(best)"] and "think_rate" in head
    assert first[0] == "∞" and last[:2] == ["→", "0"]
    last = ["→ 0", *last[2:]]  # one column
    probs = support_probs_many([model], tok, su.PROMPTS)
    ref = exact_figures_many(probs, su.PROMPTS)[0]
    for column, key in (
        ("accuracy", "exact_accuracy"),
        ("think_rate", "exact_think_rate"),
        ("malformed", "malformed"),
    ):
        assert float(first[head.index(column)]) == pytest.approx(ref[key], abs=1e-4), column
    assert float(first[2]) == pytest.approx(ref["exact_accuracy"], abs=1e-4)
    assert float(last[2]) == 1.0 and float(last[head.index("malformed")]) < 1e-4
    assert (tmp_path / "o" / "frontier.png").read_bytes()[:4] == b"\x89PNG"

    optimum.main(["--task", "sums", "--init", str(init), "--beta", "0.3", "--json"])
    got = json.loads(capsys.readouterr().out)
    kls, rewards = [], []
    for i, p in enumerate(su.PROMPTS):
        k = len(su.support(p))
        q = torch.cat([probs[0, i, :k], (1 - probs[0, i, :k].sum()).clamp(min=0)[None]])
        r = torch.tensor([float(o.answer == su.value(p)) for o in su.outcomes(p)] + [0.0])
        fig = F.optimum_figures(q / q.sum(), r.double(), 0.3)
        kls.append(fig["kl"])
        rewards.append(fig["expected_reward"])
    assert got["kl"] == pytest.approx(sum(kls) / len(kls), rel=1e-6)
    assert got["expected_reward"] == pytest.approx(sum(rewards) / len(rewards), rel=1e-6)
    assert got["prompt"] == su.PROMPTS[0] and sum(got["distribution"].values()) == pytest.approx(1)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--reward", "pizza"], "unknown reward 'pizza'"),
        (["--beta", "0"], "--beta must be"),
        (["--prompt", "9+9+9+9+9="], "is not an RL prompt of task sums"),
        (["--init", "/nonexistent/model.pt"], "pretrain --task sums"),
    ],
)
def test_optimum_on_sums_refuses_bad_input_in_one_line(argv, says, capsys):
    assert says in one_line_error(optimum.main, ["--task", "sums", *argv], capsys)


def test_optimum_on_sums_refuses_a_food_model(tiny_pretrained, capsys):
    err = one_line_error(
        optimum.main, ["--task", "sums", "--init", str(tiny_pretrained[0])], capsys
    )
    assert "is a food model" in err
