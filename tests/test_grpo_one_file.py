"""minigrpo/grpo_one_file.py, the GRPO a learner reads, is the real trainer's default recipe: the
same numbers as `grpo` with the machinery it leaves out turned off. A change to the default recipe
that reaches one and not the other fails here."""

import ast
import json
import math
from pathlib import Path

from conftest import one_line_error

from minigrpo import grpo, grpo_one_file

ROOT = Path(__file__).resolve().parents[1]
# what grpo adds that the one file leaves out, off: the anchor, the trust region, the stop rule
WITHOUT_THE_MACHINERY = (
    "--no-preserve --trust-region 0 --trust-region-anchor 0 --goal 0 --plateau 0"
)
# every figure both log: the losses, the KL, the advantages, the clip, the exact evaluation
SHARED = [
    "reward_mean", "reward_std", "equal_groups", "adv_mean", "adv_std", "policy_loss", "loss",
    "kl_exact", "entropy", "grad_norm", "clip_frac_low", "clip_frac_high", "ratio_mean",
    "ratio_max", "approx_kl", "completion_len", "target_rate", "exact_reward", "worst_drift",
    "malformed", "kl_ref", "regret", "kl_to_optimum", "drift_alice",
]  # fmt: skip


def rows(folder) -> list[dict]:
    return [json.loads(line) for line in (Path(folder) / "metrics.jsonl").read_text().splitlines()]


def close(a: float, b: float, rel: float = 1e-6, floor: float = 1e-9) -> bool:
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), floor)


def test_three_steps_log_what_grpo_logs_without_its_anchor_trust_region_and_stop_rule(
    tiny_pretrained, tmp_path
):
    init = str(tiny_pretrained[0])
    common = ["--init", init, "--seed", "0", "--steps", "3", "--device", "cpu"]
    grpo.train(
        grpo.parse(
            [
                *common,
                *WITHOUT_THE_MACHINERY.split(),
                "--out",
                str(tmp_path / "grpo"),
                "--quiet",
                "--no-plot",
            ]
        )
    )
    grpo_one_file.train(grpo_one_file.parse_args([*common, "--out", str(tmp_path / "one")]))
    real, one = rows(tmp_path / "grpo"), rows(tmp_path / "one")
    assert [r["step"] for r in one] == [r["step"] for r in real] == [0, 1, 2, 3]
    for r, o in zip(real[1:], one[1:]):
        for name in SHARED:
            assert name in r and name in o, f"{name} missing at step {r['step']}"
            assert close(o[name], r[name]), f"step {r['step']} {name}: {o[name]} vs grpo {r[name]}"
    assert real[-1]["kl_exact"] > 0 and real[-1]["clip_frac_low"] + real[-1]["ratio_max"] > 1


def test_the_comparison_fails_when_one_recipe_value_differs(tiny_pretrained, tmp_path):
    """The check above can fail: grpo at another β logs other losses from step 1."""
    init = str(tiny_pretrained[0])
    common = ["--init", init, "--seed", "0", "--steps", "1", "--device", "cpu"]
    other = [*WITHOUT_THE_MACHINERY.split(), "--beta", "0.25", "--quiet", "--no-plot"]
    grpo.train(grpo.parse([*common, *other, "--out", str(tmp_path / "grpo")]))
    grpo_one_file.train(grpo_one_file.parse_args([*common, "--out", str(tmp_path / "one")]))
    real, one = rows(tmp_path / "grpo")[1], rows(tmp_path / "one")[1]
    assert close(one["policy_loss"], real["policy_loss"])  # the same first update's surrogate
    assert not close(one["loss"], real["loss"])  # but not the same β·KL


def test_it_imports_only_the_model_the_math_and_the_world():
    tree = ast.parse((ROOT / "minigrpo" / "grpo_one_file.py").read_text())
    ours = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    ours = [m for m in ours if m.split(".")[0] in ("minigrpo", "toy_tasks")]
    allowed = ("minigrpo.lm.", "minigrpo.objectives.", "toy_tasks")
    assert ours and all(m.startswith(allowed) for m in ours), ours


def test_it_reads_in_one_sitting():
    lines = (ROOT / "minigrpo" / "grpo_one_file.py").read_text().splitlines()
    assert len(lines) <= 250 and max(map(len, lines)) <= 100


def test_bad_input_is_one_line_and_exit_2(tiny_pretrained, tmp_path, capsys):
    init = str(tiny_pretrained[0])
    err = one_line_error(
        grpo_one_file.main,
        ["--init", init, "--reward", "food:caviar", "--out", str(tmp_path)],
        capsys,
    )
    assert "caviar" in err
    err = one_line_error(grpo_one_file.main, ["--init", str(tmp_path / "none.pt")], capsys)
    assert "--init" in err and "pretrain" in err


def test_a_non_finite_figure_is_written_as_null():
    assert grpo_one_file.numbers({"a": math.inf, "b": 0.5, "c": True, "d": "x"}) == {
        "a": None,
        "b": 0.5,
    }
