"""The shared run loop (rl.py): evaluation, stop rule, generators, resume after a stop."""

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from minigrpo.grpo import GRPOConfig, main, train
from minigrpo.rl.run_state import GENERATORS, Run
from minigrpo.rl.trust_region import step_probes
from minigrpo.util.jsonl import read_jsonl

TIME_KEYS = {"step_time", "tokens_per_s"}


def cfg_for(tmp_path, init, name="run", **kw):
    base = dict(
        init=str(init),
        out=str(tmp_path / name),
        steps=4,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=12,
        eval_every=1,
        ckpt_every=2,
        quiet=True,
        preserve_per_prompt=4,
        preserve_batch=8,
        goal=0.0,
        plot=False,  # no test here reads metrics.png (drawing it is most of a short run's time)
    )
    return GRPOConfig(**{**base, **kw})


def training_rows(folder):
    return [
        {k: v for k, v in r.items() if k not in TIME_KEYS}
        for r in read_jsonl(folder / "metrics.jsonl")
    ]


@pytest.mark.slow
def test_evaluating_every_step_does_not_change_the_trajectory(tmp_path, tiny_pretrained):
    init, _, _ = tiny_pretrained
    train(cfg_for(tmp_path, init, "every1", eval_every=1))
    train(cfg_for(tmp_path, init, "every3", eval_every=3))
    a, b = training_rows(tmp_path / "every1"), training_rows(tmp_path / "every3")
    assert len(a) == len(b) == 5
    # the training figures agree; the sparser run just has fewer evaluations
    for ra, rb in zip(a, b):
        # peaks are over the evaluations each run saw
        same = [k for k in rb if not k.startswith("peak_")]
        assert {k: ra[k] for k in same} == {k: rb[k] for k in same}
    assert "target_rate" in a[1] and "target_rate" not in b[1] and "target_rate" in b[3]


def test_step_one_samples_the_same_completions_with_and_without_preservation(
    tmp_path, tiny_pretrained
):
    init, _, _ = tiny_pretrained
    texts = {}
    for preserve in (True, False):
        train(cfg_for(tmp_path, init, f"p{preserve}", preserve=preserve, steps=1))
        texts[preserve] = (tmp_path / f"p{preserve}" / "samples.txt").read_text()
    assert texts[True] == texts[False]


def test_generators_live_on_the_run_device_and_differ_by_purpose(tmp_path, tiny_pretrained):
    init, _, _ = tiny_pretrained
    run = Run(cfg_for(tmp_path, init, device="cpu"), "grpo")
    assert set(run.gens) == set(GENERATORS)
    for name, where in GENERATORS.items():
        want = run.device if where == "device" else torch.device("cpu")
        assert run.gens[name].device.type == want.type, name
    firsts = {
        name: torch.randint(
            10**9, (1,), generator=torch.Generator().set_state(g.get_state())
        ).item()
        for name, g in run.gens.items()
        if g.device.type == "cpu"
    }
    assert len(set(firsts.values())) == len(firsts), "two purposes share one random stream"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_grpo_and_ppo_run_on_cuda_and_their_exact_figures_match_the_cpu(tmp_path, tiny_pretrained):
    from minigrpo.ppo import PPOConfig
    from minigrpo.ppo import train as train_ppo

    init, _, _ = tiny_pretrained
    for name, make, trainer in (("grpo", GRPOConfig, train), ("ppo", PPOConfig, train_ppo)):
        base = dict(
            init=str(init),
            steps=2,
            prompts_per_step=2,
            group_size=4,
            max_new_tokens=12,
            quiet=True,
            preserve_per_prompt=4,
            preserve_batch=8,
            goal=0.0,
        )
        gpu = trainer(make(**base, out=str(tmp_path / f"{name}-cuda"), device="cuda"))
        assert gpu["step"] == 2, name
        assert all(
            math.isfinite(gpu[k])
            for k in ("target_rate", "exact_reward", "malformed", "worst_drift")
        ), gpu
        # step 0's exact evaluation is the same model on both devices: equal to float tolerance
        first = lambda out: json.loads(
            (tmp_path / out / "metrics.jsonl").read_text().splitlines()[0]
        )
        cpu_run = trainer(
            make(**{**base, "steps": 1}, out=str(tmp_path / f"{name}-cpu"), device="cpu")
        )
        assert cpu_run["step"] == 1
        a, b = first(f"{name}-cuda"), first(f"{name}-cpu")
        # relative: the malformed mass is ~1e-3, where 1e-4 absolute would pass a 10 % error
        assert all(
            math.isclose(a[k], b[k], rel_tol=1e-4, abs_tol=1e-9)
            for k in ("target_rate", "malformed")
        ), (a, b)


def test_every_evaluation_lies_under_the_exact_frontier(tmp_path, tiny_pretrained):
    init, _, _ = tiny_pretrained
    train(cfg_for(tmp_path, init, steps=4, beta=0.1, lr=3e-3))
    evals = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "regret" in r]
    assert len(evals) == 5 and evals[-1]["kl_ref"] > 0, (
        "step 0 and every step evaluate; the policy moved"
    )
    for r in evals:
        assert r["regret"] >= 0 and r["kl_ref"] >= 0 and r["kl_to_optimum"] >= 0, r
        assert r["target_rate"] - 1e-12 <= r["pass_at_8"] <= 1, r
        # None: inf in strict JSON (no better than π_ref)
        assert r["implied_beta"] is None or r["implied_beta"] > 0, r
    strict = lambda text: json.loads(
        text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c))
    )
    written = sorted((tmp_path / "run").glob("*.json*"))
    assert [p.name for p in written] == ["config.json", "metrics.jsonl", "summary.json"], written
    # every JSON file a run writes parses with a strict parser (no NaN, no Infinity)
    for path in written:
        for line in [path.read_text()] if path.suffix == ".json" else path.read_text().splitlines():
            strict(line)


def test_a_run_stops_at_its_goal_and_says_why(tmp_path, tiny_pretrained):
    init, _, _ = tiny_pretrained
    summary = train(
        cfg_for(
            tmp_path, init, goal=0.01, goal_patience=2, goal_malformed=1.0, goal_drift=1.0, steps=50
        )
    )
    assert summary["step"] == 2 and summary["stop_reason"].startswith("goal reached at step 1")
    summary = train(cfg_for(tmp_path, init, "capped", steps=3))
    assert summary["step"] == 3 and summary["stop_reason"].startswith("cap")
    rows = read_jsonl(tmp_path / "capped" / "metrics.jsonl")
    peaks = [r["peak_malformed"] for r in rows]
    assert peaks == sorted(peaks) and peaks[-1] == max(r["malformed"] for r in rows)


def test_resume_after_an_early_stop_is_refused_unless_the_rule_changes(
    tmp_path, tiny_pretrained, capsys
):
    init, _, _ = tiny_pretrained
    out = tmp_path / "stopped"
    args = [
        "--init",
        str(init),
        "--out",
        str(out),
        "--quiet",
        "--no-plot",  # metrics.png: most of a short run's time, and no test here reads it
        "--prompts-per-step",
        "2",
        "--group-size",
        "4",
        "--preserve-per-prompt",
        "4",
        "--goal",
        "0.01",
        "--goal-patience",
        "1",
        "--goal-malformed",
        "1",
        "--goal-drift",
        "1",
        "--steps",
        "20",
    ]
    main(args)
    assert json.loads((out / "summary.json").read_text())["step"] == 1
    with pytest.raises(SystemExit) as e:
        main(["--resume", str(out), "--steps", "20"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "stopped at step 1 (goal reached" in err and "--goal 0" in err
    main(["--resume", str(out), "--goal", "0", "--steps", "3"])
    assert json.loads((out / "summary.json").read_text())["step"] == 3
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [0, 1, 2, 3]


def test_resume_refuses_a_new_experiment_and_survives_a_moved_init(
    tmp_path, tiny_pretrained, capsys
):
    init, _, _ = tiny_pretrained
    moved = tmp_path / "init.pt"
    moved.write_bytes(init.read_bytes())
    out = tmp_path / "r"
    main(
        [
            "--init",
            str(moved),
            "--out",
            str(out),
            "--quiet",
            "--no-plot",
            "--prompts-per-step",
            "2",
            "--group-size",
            "4",
            "--preserve-per-prompt",
            "4",
            "--goal",
            "0",
            "--steps",
            "2",
        ]
    )
    for argv, message in [
        (["--reward", "food:sushi"], "--reward was 'pizza' and cannot become 'food:sushi'"),
        (["--out", str(tmp_path / "elsewhere")], "writes into its own folder"),
        (["--steps", "2"], "already took 2 steps"),
        ([], "already took 2 steps"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(["--resume", str(out), *argv])
        assert e.value.code == 2 and message in capsys.readouterr().err, argv
    moved.unlink()  # the checkpoint holds the model and π_ref: resuming needs no --init
    main(["--resume", str(out), "--steps", "3"])
    assert json.loads((out / "summary.json").read_text())["step"] == 3
    with pytest.raises(SystemExit) as e:
        main(["--resume", ""])
    assert e.value.code == 2 and "no such folder" in capsys.readouterr().err


def test_different_experiments_get_different_default_folders():
    from minigrpo.rl.config import default_out

    folders = {
        default_out(GRPOConfig(**kw), "grpo")
        for kw in [
            {},
            {"preserve": False},
            {"person": "bob"},
            {"preset": "dapo"},
            {"reward": "food:apple pie"},
        ]
    }
    assert folders == {
        "runs/grpo-pizza",
        "runs/grpo-pizza-no-preserve",
        "runs/grpo-pizza-bob",
        "runs/dapo-pizza",
        "runs/grpo-food-apple-pie",
    }
    a, b = (default_out(GRPOConfig(reward=f"{d}/r.py:reward"), "grpo") for d in ("week1", "week2"))
    assert (
        a != b and a.startswith("runs/grpo-r-py-reward-") and b.startswith("runs/grpo-r-py-reward-")
    ), (a, b)
    assert default_out(GRPOConfig(reward="week1/r.py:reward"), "grpo") == a, (
        "the same file, the same folder"
    )


def test_every_setting_that_changes_the_experiment_names_its_default_folder():
    """A plain run after `--policy-loss cispo` is not refused as "another run's folder": each flag
    that changes what is trained (not how long or how it reports) is in the default name."""
    from minigrpo.dpo import DPOConfig
    from minigrpo.ppo import PPOConfig
    from minigrpo.rl.config import parse_rl_config
    from minigrpo.variants.presets import PRESETS

    out = lambda cls, *argv: (
        parse_rl_config(cls, list(argv), "", cls.__name__[:-6].lower(), PRESETS).out
    )
    assert (
        out(GRPOConfig)
        == out(GRPOConfig, "--steps", "7", "--quiet", "--threads", "2", "--verbose")
        == "runs/grpo-pizza"
    )
    assert out(GRPOConfig, "--policy-loss", "cispo") == "runs/grpo-pizza-policy-loss-cispo"
    assert out(GRPOConfig, "--policy-loss", "ppo_clip") == "runs/grpo-pizza", (
        "the default value names nothing"
    )
    assert out(GRPOConfig, "--preset", "dapo", "--seed", "1") == "runs/dapo-pizza-seed-1"
    assert out(PPOConfig, "--critic", "oracle") == "runs/ppo-pizza-critic-oracle"
    assert out(DPOConfig, "--online") == "runs/dpo-pizza-online"
    many = out(
        GRPOConfig, "--lr", "0.001", "--group-size", "8", "--beta", "0.01", "--clip-high", "0.3"
    )
    assert len(many) < 100 and many != out(
        GRPOConfig, "--lr", "0.001", "--group-size", "8", "--beta", "0.01"
    )


def test_progress_says_skipped_and_the_run_ends_naming_its_folder(
    tmp_path, tiny_pretrained, capsys
):
    from minigrpo.rl.report import progress_line

    row = {"reward_mean": 1.0, "reward_rolling": 1.0, "skipped": 1.0, "step_time": 0.01}
    line = progress_line(3, 10, row, evaluated=False)
    assert "skipped" in line and "nan" not in line and "target" not in line
    assert "update skipped" in progress_line(3, 10, row, evaluated=False, verbose=True)
    init, _, _ = tiny_pretrained
    train(cfg_for(tmp_path, init, "named", quiet=False, steps=1))
    out = capsys.readouterr().out
    # what runs, then its budget: two lines (a "\\n" was once printed as such)
    first, second = out.splitlines()[:2]
    assert first.endswith(f"| from {init}") and second.startswith("at most 1 steps"), out
    assert (
        f"wrote {tmp_path / 'named'}/" in out
        and f"--checkpoint {tmp_path / 'named' / 'model.pt'}" in out
    )
    assert "stopped at step 1: cap" in out


def test_the_trust_region_probes_people_only_not_the_rl_prompts_forced_states(
    tmp_path, tiny_pretrained
):
    init, _, _ = tiny_pretrained
    run = Run(cfg_for(tmp_path, init, preserve_per_prompt=64), "grpo")
    assert (run.anchor.group == -1).any(), "the default anchor holds the RL prompt's forced states"
    # (name, gen, limit, weights, group)
    probes = {p[0]: p for p in step_probes(run.cfg, None, run.anchor_probe_rows)}
    _, gen, _, _, group = probes["anchor"]
    assert (group >= 0).all() and gen.ids.size(0) == int((run.anchor.group >= 0).sum())


def test_a_reward_that_exits_mid_run_stops_it_in_one_line_and_keeps_its_checkpoint(
    tmp_path, tiny_pretrained, capsys
):
    """A reward that calls sys.exit at its 41st call (after the support is scored and two steps ran:
    it stops in step 3): exit code 2 and one line naming it, never 0 with no summary; the checkpoint
    written before stays loadable."""
    from conftest import one_line_error

    from minigrpo.lm.checkpoint import read_checkpoint

    init, _, _ = tiny_pretrained
    quits = tmp_path / "quits.py"
    quits.write_text(
        "import sys\nn = 0\ndef f(p, c):\n    global n\n    n += 1\n"
        "    if n > 40:\n        sys.exit(0)\n    return float(c == 'pizza')\n"
    )
    argv = [
        "--init",
        str(init),
        "--reward",
        f"{quits}:f",
        "--out",
        str(tmp_path / "run"),
        "--steps",
        "40",
        "--goal",
        "0",
        "--plateau",
        "0",
        "--group-size",
        "4",
        "--prompts-per-step",
        "2",
        "--ckpt-every",
        "1",
        "--quiet",
        "--no-plot",
    ]
    err = one_line_error(main, argv, capsys)
    assert "sys.exit(0)" in err and "quits.py" in err and "stopped at step" in err, err
    assert not (tmp_path / "run" / "summary.json").exists()
    assert read_checkpoint(tmp_path / "run" / "model.pt")["step"] >= 1


FOOD_ROW = {
    "reward_mean": 0.984375,
    "reward_rolling": 0.7613,
    "target_rate": 0.98611,
    "exact_reward": 0.98611,
    "worst_drift": 0.02712,
    "peak_worst_drift": 0.03013,
    "malformed": 0.00152,
    "peak_malformed": 0.00153,
    "regret": 0.00116,
    "policy_loss": -0.00061,
    "kl_exact": 0.29371,
    "tr_scale": 0.5,
    "step_time": 0.155,
}


def test_the_progress_line_fits_a_terminal_and_verbose_shows_it_all():
    """The line was ~230 characters: by default at most 140 (the step, skipped, the trust region's
    cut, the reward, the exact target rate, drift and malformed mass now beside their end bars and
    their running maxima beside their every-step bars, the time), the whole line with --verbose
    (metrics.jsonl holds every field)."""
    from minigrpo.rl.report import progress_line

    arithmetic = {k: v for k, v in FOOD_ROW.items() if "drift" not in k and k != "regret"} | {
        "heldout_rate": 0.8125
    }
    for row in (FOOD_ROW, {**FOOD_ROW, "skipped": 1.0}, arithmetic):
        short, full = (
            progress_line(145, 200, row, True),
            progress_line(145, 200, row, True, verbose=True),
        )
        assert len(short) <= 140, (len(short), short)
        head = "step 145/200 skipped x0.5" if "skipped" in row else "step 145/200 x0.5"
        assert short.startswith(f"{head} | reward 0.984"), short
        assert short.endswith("| 155 ms"), short
        assert "target 0.986" in short and "malformed 0.0015≤0.01 max 0.0015≤0.02" in short, short
        assert ("drift 0.027≤0.03 max 0.030≤0.05" in short) == ("worst_drift" in row), short
        assert ("held-out 0.812" in short) == ("heldout_rate" in row), short
        assert ("skipped" in short) == ("skipped" in row), short
        assert (
            "avg10 0.761" in full
            and "E[r] 0.986" in full
            and "KL 0.2937" in full
            and "step x0.5" in full
        ), full
        assert ("regret 0.0012" in full) == ("regret" in row) and ("loss -0.0006" in full) != (
            "skipped" in row
        ), full
    assert len(progress_line(145, 200, FOOD_ROW, False)) <= 60, (
        "a step without an evaluation: the reward, the time"
    )
    whole = {**FOOD_ROW, "tr_scale": 1.0}
    assert progress_line(145, 200, whole, False).startswith("step 145/200 | reward"), (
        "a step the trust region kept whole shows no cut"
    )


def test_the_progress_line_says_which_bar_a_figure_is_beyond():
    """`drift 0.033 (max 0.033)` read as a breach of the goal's 0.03 bar while the every-step bar is
    0.05: the figure now stands beside its end bar, the max beside its every-step bar, and the sign
    says on which side of it the unrounded figure lies (0.0303 prints 0.030 and is beyond 0.03)."""
    from minigrpo.rl.report import bars_line, progress_line

    row = {**FOOD_ROW, "worst_drift": 0.0303, "peak_worst_drift": 0.0303, "peak_malformed": 0.021}
    line = progress_line(7, 200, row, True)
    assert "drift 0.030>0.03 max 0.030≤0.05" in line, line
    assert "malformed 0.0015≤0.01 max 0.0210>0.02" in line, line
    assert "target" in line and "x0.5" in line, line
    row = {**row, "target_rate": 0.9499, "peak_worst_drift": float("nan")}
    closing = bars_line(row)
    assert closing.startswith("bars: final target 0.950<0.95 | drift end 0.030>0.03"), closing
    assert "every step nan>0.05" in closing, "NaN is never within a bar"
    assert "drift" not in bars_line({k: v for k, v in row.items() if "drift" not in k})


@given(st.floats(0, 1), st.floats(0.001, 1), st.integers(1, 5), st.booleans())
def test_a_figure_beside_its_bar_says_the_side_it_is_on(value, bar, digits, higher):
    from minigrpo.rl.report import against

    text = against(value, bar, digits, higher)
    sign = next(c for c in text if c in "≤≥<>")
    shown, bar_text = text.split(sign)
    within = value >= bar if higher else value <= bar
    assert shown == f"{value:.{digits}f}" and bar_text == f"{bar:g}"
    assert (
        sign
        == {(True, True): "≥", (True, False): "<", (False, True): "≤", (False, False): ">"}[
            (higher, within)
        ]
    )


def test_a_no_preserve_run_suggests_sampling_another_person(tmp_path, tiny_pretrained, capsys):
    """The closing hint sampled ravin, the trained person, which hides the spill-over --no-preserve
    exists to show."""
    init, _, _ = tiny_pretrained
    train(cfg_for(tmp_path, init, "np", quiet=False, steps=1, preserve=False))
    out = capsys.readouterr().out
    assert "--prompt 'alice likes '" in out and "--prompt 'ravin likes '" not in out, out
    train(cfg_for(tmp_path, init, "np-bob", quiet=False, steps=1, preserve=False, person="alice"))
    assert "--prompt 'ravin likes '" in capsys.readouterr().out, (
        "another person than the one trained"
    )
