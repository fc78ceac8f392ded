"""minigrpo/ppo_one_file.py is minigrpo.ppo's default recipe written out in one file: for 3 (and
10) steps at seed 0 it logs what `python -m minigrpo.ppo` logs with the shared run's extras switched
off, to a relative 1e-6. A change to ppo's default recipe (or to the run loop's generators,
learning-rate schedule, critic) that is not made in both fails here."""

import json
import math

import pytest
from conftest import one_line_error

from minigrpo import ppo, ppo_one_file

# every metric the two compute; a name that disappears from either file fails the test
SHARED = (
    # the rollout
    "reward_mean",
    "reward_std",
    "completion_len",
    # the update: means over the epochs × minibatches updates
    "policy_loss",
    "value_loss",
    "loss",
    "entropy",
    "kl_exact",
    "approx_kl",
    "grad_norm",
    # the KL-shaped reward, the critic's values, the whitened advantages
    "kl_k1_seq",
    "value_mean",
    "explained_variance",
    "adv_mean",
    "adv_std",
    # the food world's exact evaluation
    "target_rate",
    "exact_reward",
    "best_reward",
    "expected_reward",
    "off_support",
    "pass_at_8",
    "kl_ref",
    "regret",
    "implied_beta",
    "kl_to_implied_optimum",
    "kl_to_optimum",
    "worst_drift",
    "malformed",
    *(f"drift_{p}" for p in ("alice", "bob", "chen", "dmitri", "emma", "farah", "jo")),
)
# logged at step 0 too, before any update
EVALUATION = SHARED[SHARED.index("target_rate") :]


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def close(a, b) -> bool:
    if a is None or b is None:  # a non-finite number (implied_beta at step 0) is null in both
        return a is b
    return abs(a - b) <= max(1e-9, 1e-6 * max(abs(a), abs(b)))


# 3 steps: the warm-up; 10: the warm-down too (round(0.2·3) = 1 step: no rate of 3 steps is cut)
@pytest.mark.parametrize("steps", [3, pytest.param(10, marks=pytest.mark.slow)])
def test_the_steps_equal_minigrpo_ppo_without_its_extras(tmp_path, tiny_pretrained, capsys, steps):
    init = str(tiny_pretrained[0])
    common = ["--init", init, "--seed", "0", "--steps", str(steps)]
    ppo.main(
        common
        + ["--out", str(tmp_path / "ppo"), "--no-preserve", "--trust-region", "0"]
        + ["--trust-region-anchor", "0", "--goal", "0", "--plateau", "0", "--no-plot", "--quiet"]
    )
    ppo_one_file.main(common + ["--out", str(tmp_path / "one")])
    out = capsys.readouterr().out
    assert out.count("| target ") == steps and "drift" in out and "malformed" in out
    theirs, ours = (
        rows(tmp_path / "ppo" / "metrics.jsonl"),
        rows(tmp_path / "one" / "metrics.jsonl"),
    )
    assert [r["step"] for r in theirs] == [r["step"] for r in ours] == list(range(steps + 1))
    assert (tmp_path / "one" / "model.pt").is_file()
    for a, b in zip(theirs, ours):
        names = SHARED if a["step"] else EVALUATION
        assert not set(names) - set(a), f"minigrpo.ppo no longer logs {set(names) - set(a)}"
        assert not set(names) - set(b), f"ppo_one_file no longer logs {set(names) - set(b)}"
        differ = [(n, a[n], b[n]) for n in names if not close(a[n], b[n])]
        assert not differ, f"step {a['step']}: (name, ppo, ppo_one_file) {differ}"
    # the run moved: the comparison is not of two untrained models
    assert not math.isclose(ours[0]["target_rate"], ours[-1]["target_rate"])


def test_help_and_bad_values(capsys):
    with pytest.raises(SystemExit) as e:
        ppo_one_file.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(f"--{flag}" in out for flag in ("reward", "init", "seed", "steps", "out"))
    assert "--steps" in one_line_error(ppo_one_file.main, ["--steps", "0"], capsys)
    assert "--seed" in one_line_error(ppo_one_file.main, ["--seed", "x"], capsys)
    assert "nachos" in one_line_error(ppo_one_file.main, ["--reward", "food:nachos"], capsys)
    missing = ["--init", "/nonexistent/model.pt", "--out", "/nonexistent/out"]
    assert "--init" in one_line_error(ppo_one_file.main, missing, capsys)


def test_the_constants_are_ppos_defaults():
    """Every constant of the recipe against PPOConfig's default, by name: this also covers what the
    runs above may not exercise (the value clip seldom binds in a few steps)."""
    d = ppo.PPOConfig()
    pairs = {
        "PERSON": d.person,
        "G": d.group_size,
        "PROMPTS_PER_STEP": d.prompts_per_step,
        "MAX_NEW_TOKENS": d.max_new_tokens,
        "TEMPERATURE": d.temperature,
        "BETA": d.beta,
        "GAMMA": d.gamma,
        "LAM": d.lam,
        "EPOCHS": d.epochs,
        "MINIBATCHES": d.minibatches,
        "CLIP": d.clip,
        "VF_CLIP": d.vf_clip,
        "VF_COEF": d.vf_coef,
        "LR": d.lr,
        "WARMUP": d.warmup,
        "WARMDOWN": d.lr_warmdown,
        "GRAD_CLIP": d.grad_clip,
    }
    assert {k: getattr(ppo_one_file, k) for k in pairs} == pairs
    # what the file leaves out is off in ppo's default recipe
    off = (d.critic, d.entropy_coef, d.kl_target, d.ref_update_every, d.unfinished_reward)
    assert off == ("separate", 0, None, 0, None) and d.eval_every == 1  # evaluated every step


def test_a_run_already_in_out_is_kept_unless_overwrite(tiny_pretrained, tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    argv = ["--init", str(tiny_pretrained[0]), "--steps", "1", "--out", str(tmp_path)]
    assert "--overwrite" in one_line_error(ppo_one_file.main, argv, capsys)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 0}\n'
    ppo_one_file.main([*argv, "--overwrite"])
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").open()]
    assert steps == [0, 1]
