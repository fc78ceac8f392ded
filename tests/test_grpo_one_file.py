"""minigrpo/grpo_one_file.py, the GRPO a learner reads, is the real trainer's default recipe: the
same numbers as `grpo` with the machinery it leaves out turned off. A change to the default recipe
that reaches one and not the other fails here."""

import ast
import json
from pathlib import Path

import pytest
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
    "ratio_max", "approx_kl", "completion_len", "target_rate", "exact_reward", "best_reward",
    "expected_reward", "off_support", "pass_at_8", "kl_ref", "regret", "implied_beta",
    "kl_to_implied_optimum", "kl_to_optimum", "worst_drift", "malformed", "drift_alice",
    "drift_bob", "drift_chen", "drift_dmitri", "drift_emma", "drift_farah", "drift_jo",
]  # fmt: skip
UPDATE_ONLY = {"reward_mean", "reward_std", "equal_groups", "adv_mean", "adv_std", "policy_loss",
               "loss", "kl_exact", "entropy", "grad_norm", "clip_frac_low", "clip_frac_high",
               "ratio_mean", "ratio_max", "approx_kl", "completion_len"}  # fmt: skip


def rows(folder) -> list[dict]:
    return [json.loads(line) for line in (Path(folder) / "metrics.jsonl").read_text().splitlines()]


def close(a, b, rel: float = 1e-6, floor: float = 1e-9) -> bool:
    if a is None or b is None:  # a figure that is not finite is null in both (strict JSON)
        return a is b
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), floor)


def run_both(init, tmp_path, steps: int, *grpo_flags: str) -> tuple[list[dict], list[dict]]:
    common = ["--init", init, "--seed", "0", "--steps", str(steps)]
    out = ["--out", str(tmp_path / "grpo"), "--quiet", "--no-plot", "--device", "cpu"]
    grpo.train(grpo.parse([*common, *WITHOUT_THE_MACHINERY.split(), *out, *grpo_flags]))
    grpo_one_file.main([*common, "--out", str(tmp_path / "one")])
    return rows(tmp_path / "grpo"), rows(tmp_path / "one")


# 3 steps: the warm-up; 10: the warm-down too (round(0.2·3) = 1 step: no rate of 3 steps is cut)
@pytest.mark.parametrize("steps", [3, pytest.param(10, marks=pytest.mark.slow)])
def test_the_steps_log_what_grpo_logs_without_its_anchor_trust_region_and_stop_rule(
    tiny_pretrained, tmp_path, capsys, steps
):
    real, one = run_both(str(tiny_pretrained[0]), tmp_path, steps)
    out = capsys.readouterr().out
    assert out.count("| target ") == steps and "drift" in out and "malformed" in out
    assert [r["step"] for r in one] == [r["step"] for r in real] == list(range(steps + 1))
    for r, o in zip(real, one):
        for name in SHARED if r["step"] else set(SHARED) - UPDATE_ONLY:
            assert name in r and name in o, f"{name} missing at step {r['step']}"
            assert close(o[name], r[name]), f"step {r['step']} {name}: {o[name]} vs grpo {r[name]}"
    assert real[-1]["kl_exact"] > 0 and real[-1]["ratio_max"] > 1


def test_the_comparison_fails_when_one_recipe_value_differs(tiny_pretrained, tmp_path):
    """The check above can fail: grpo at another β logs another loss from its first step."""
    real, one = run_both(str(tiny_pretrained[0]), tmp_path, 1, "--beta", "0.25")
    assert not close(one[1]["loss"], real[1]["loss"])


def test_the_constants_are_grpos_defaults():
    d = grpo.GRPOConfig()
    pairs = {
        "PERSON": d.person,
        "G": d.group_size,
        "PROMPTS_PER_STEP": d.prompts_per_step,
        "MAX_NEW_TOKENS": d.max_new_tokens,
        "TEMPERATURE": d.temperature,
        "UPDATES": d.updates,
        "CLIP": d.clip_low,
        "BETA": d.beta,
        "ADV_EPS": d.adv_eps,
        "LR": d.lr,
        "WARMUP": d.warmup,
        "WARMDOWN": d.lr_warmdown,
        "GRAD_CLIP": d.grad_clip,
    }
    assert {k: getattr(grpo_one_file, k) for k in pairs} == pairs
    # what the file writes out is grpo's default recipe, and what it leaves out is off there
    recipe = (d.policy_loss, d.kl, d.kl_in, d.baseline, d.adv_scale, d.adv_std, d.loss_agg)
    assert recipe == (
        "ppo_clip",
        "exact",
        "loss",
        "group",
        "group",
        "unbiased",
        "seq-mean-token-mean",
    )
    off = (d.clip_high, d.dual_clip, d.ratio, d.entropy_coef, d.entropy_target, d.top_entropy)
    assert off == (None, None, "token", 0.0, None, 1.0)
    off = (d.skip_equal_groups, d.random_reward, d.fork_entropy, d.cov_control, d.is_correction)
    assert off == (False, False, 0.0, "none", "none")
    assert d.ref_update_every == 0 and d.unfinished_reward is None and d.eval_every == 1


def test_it_imports_only_the_model_the_math_and_the_world():
    tree = ast.parse((ROOT / "minigrpo" / "grpo_one_file.py").read_text())
    ours = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    ours = [m for m in ours if m.split(".")[0] in ("minigrpo", "toy_tasks")]
    allowed = ("minigrpo.lm.", "minigrpo.objectives.", "toy_tasks")
    assert ours and all(m.startswith(allowed) for m in ours), ours


def test_it_reads_in_one_sitting():
    lines = (ROOT / "minigrpo" / "grpo_one_file.py").read_text().splitlines()
    assert len(lines) <= 250 and max(map(len, lines)) <= 100


def test_help_and_bad_input(tiny_pretrained, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        grpo_one_file.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(f"--{flag}" in out for flag in ("reward", "init", "seed", "steps", "out"))
    assert "--steps" in one_line_error(grpo_one_file.main, ["--steps", "0"], capsys)
    assert "caviar" in one_line_error(grpo_one_file.main, ["--reward", "food:caviar"], capsys)
    missing = ["--init", str(tmp_path / "none.pt"), "--out", str(tmp_path / "a")]
    assert "pretrain" in one_line_error(grpo_one_file.main, missing, capsys)


def test_a_run_already_in_out_is_kept_unless_overwrite(tiny_pretrained, tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    argv = ["--init", str(tiny_pretrained[0]), "--steps", "1", "--out", str(tmp_path)]
    assert "--overwrite" in one_line_error(grpo_one_file.main, argv, capsys)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 0}\n'
    grpo_one_file.main([*argv, "--overwrite"])
    assert [r["step"] for r in rows(tmp_path)] == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["grpo_one_file", "ppo_one_file"])
def test_as_a_command_a_reward_that_raises_is_one_line_and_exit_2(
    tiny_pretrained, tmp_path, command
):
    import subprocess
    import sys

    # it scores the exact table (14 calls), then raises in step 1's scoring
    (tmp_path / "bad.py").write_text(
        "calls = []\ndef f(prompt, completion):\n    calls.append(1)\n"
        "    if len(calls) > 20:\n        raise ValueError('boom')\n    return 1.0\n"
    )
    argv = ["--init", str(tiny_pretrained[0]), "--reward", f"{tmp_path / 'bad.py'}:f"]
    done = subprocess.run(
        [sys.executable, "-m", f"minigrpo.{command}", *argv, "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "boom" in done.stderr and "Traceback" not in done.stderr
    assert (tmp_path / "out" / "metrics.jsonl").read_text().startswith('{"step": 0')  # step 0 kept
