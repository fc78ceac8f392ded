import copy
import dataclasses
import json
import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import perturbed, right_padded

from minigrpo.grpo import GRPO, PRESETS, GRPOConfig, advantages, grpo_loss, main, train
from minigrpo.lm import logprobs
from minigrpo.lm.checkpoint import read_checkpoint
from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.rl import rollout
from minigrpo.rl.loop import Run
from minigrpo.rl.preserve import anchor_loss
from minigrpo.rl.rollout import collect
from minigrpo.util.jsonl import read_jsonl
from minigrpo.variants.policy_losses import POLICY_LOSSES
from toy_tasks import food
from toy_tasks.rewards import make_reward

TIME_KEYS = {"step_time", "tokens_per_s"}


def cfg_for(tmp_path, init, **kw):
    base = dict(
        init=str(init),
        out=str(tmp_path / "run"),
        steps=3,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=12,
        eval_every=1,
        ckpt_every=2,
        quiet=True,
        preserve_per_prompt=2,
        preserve_batch=8,
        # tests of the update: no stop rule, no step guard
        goal=0.0,
        trust_region=0.0,
        trust_region_anchor=0.0,
        # no metrics.png: drawing it is most of a 3-step run's time (1.0 s of 1.3);
        # test_every_preset_runs_three_steps draws it for every preset
        plot=False,
    )
    return GRPOConfig(**{**base, **kw})


def fake_run(cfg, model):
    """The few things GRPO.update needs from a Run, without preservation."""

    def clip_and_step(opt, loss, params):
        opt.zero_grad()
        loss.backward()
        opt.step()
        return 0.0

    return SimpleNamespace(
        cfg=cfg, policy=model, anchor_term=lambda: None, clip_and_step=clip_and_step
    )


def two_completion_batch(model, tok, reward="pizza", seed=0, old_logp=True):
    ref = __import__("copy").deepcopy(model)
    return collect(
        model,
        ref,
        tok,
        ["ravin likes "],
        2,
        make_reward(reward, food.REWARDS),
        torch.Generator().manual_seed(seed),
        max_new_tokens=12,
        keep_ref_logits=True,
        old_logp=old_logp,
    )


def test_one_step_loss_equals_a_hand_computation(tiny_pretrained):
    _, model, tok = tiny_pretrained
    model = __import__("copy").deepcopy(model)
    batch = two_completion_batch(model, tok)
    batch.rewards = torch.tensor([1.0, 0.0])  # force one good, one bad completion
    cfg = GRPOConfig(
        group_size=2, updates=1, beta=0.04, kl="k3", loss_agg="token-mean", max_new_tokens=12
    )
    # hand computation, one completion at a time, with plain Python sums
    a = 0.5 / (2**0.5 / 2 + 1e-4)  # (1 - 0.5) / (Bessel std of [1, 0] + eps)
    adv = [a, -a]
    total, n_tok = 0.0, 0
    for i in range(2):
        n = int(batch.mask[i].sum())
        for t in range(n):
            lp, ref = batch.old_logp[i, t].item(), batch.ref_logp[i, t].item()
            k3 = torch.exp(torch.tensor(ref - lp)).item() - (ref - lp) - 1
            total += -adv[i] * 1.0 + 0.04 * k3  # ratio is 1 at the first update
            n_tok += 1
    stats = GRPO(fake_run(cfg, model)).update(batch, torch.optim.SGD(model.parameters(), lr=0.0))
    assert abs(stats["loss"] - total / n_tok) < 1e-5, (stats["loss"], total / n_tok)


def test_only_completion_tokens_receive_gradient(tiny_pretrained, monkeypatch):
    _, model, tok = tiny_pretrained
    model = __import__("copy").deepcopy(model)
    batch = two_completion_batch(model, tok, seed=1)
    batch.rewards = torch.tensor([1.0, 0.0])
    captured = {}
    original = logprobs.shifted_forward

    # capture each row's logits (B, P+T-1, V) of the training forward pass
    def forward(*args, **kwargs):
        logits, hidden = original(*args, **kwargs)
        if logits.requires_grad:
            logits.retain_grad()
            captured["logits"] = logits
        return logits, hidden

    monkeypatch.setattr(logprobs, "shifted_forward", forward)
    cfg = GRPOConfig(group_size=2, updates=1, beta=0.0)
    GRPO(fake_run(cfg, model)).update(batch, torch.optim.SGD(model.parameters(), lr=0.0))
    grad = captured["logits"].grad.abs().sum(-1)  # (N, P+T-1): position t predicts token t+1
    P = batch.gen.prompt_len
    assert (grad[:, : P - 1] == 0).all(), "a prompt token received gradient"
    for i in range(2):
        n = int(batch.mask[i].sum())
        assert (grad[i, P - 1 + n :] == 0).all(), "a token after the end received gradient"
        assert (grad[i, P - 1 : P - 1 + n] > 0).all(), "a completion token received no gradient"


def test_updates_one_gives_ratio_exactly_one(tiny_pretrained):
    _, model, tok = tiny_pretrained
    model = __import__("copy").deepcopy(model)
    batch = two_completion_batch(model, tok)
    batch.rewards = torch.tensor([1.0, 0.0])
    stats = GRPO(fake_run(GRPOConfig(group_size=2, updates=1), model)).update(
        batch, torch.optim.AdamW(model.parameters(), lr=1e-2)
    )
    assert stats["ratio_mean"] == 1.0 and stats["ratio_max"] == 1.0
    assert stats["clip_frac_low"] == 0 and stats["clip_frac_high"] == 0
    stats2 = GRPO(fake_run(GRPOConfig(group_size=2, updates=3), model)).update(
        batch, torch.optim.AdamW(model.parameters(), lr=1e-1)
    )
    # away from 1 in either direction: which way depends on the two sampled completions
    # (machine-dependent)
    assert abs(stats2["ratio_max"] - 1.0) > 1e-4 or abs(stats2["ratio_mean"] - 1.0) > 1e-4, (
        f"with μ > 1 the later updates must see a ratio away from 1, got {stats2}"
    )


def test_old_logprobs_from_the_first_update_equal_a_separate_forward(tiny_pretrained):
    _, model, tok = tiny_pretrained
    model = __import__("copy").deepcopy(model)
    with_old = two_completion_batch(model, tok, seed=2)
    without = two_completion_batch(model, tok, seed=2, old_logp=False)
    assert without.old_logp is None
    for b in (with_old, without):
        b.rewards = torch.tensor([1.0, 0.0])
    cfg = GRPOConfig(group_size=2, updates=1)
    sgd = lambda: torch.optim.SGD(model.parameters(), lr=0.0)
    a = GRPO(fake_run(cfg, model)).update(with_old, sgd())
    b = GRPO(fake_run(cfg, model)).update(without, sgd())
    assert torch.equal(without.old_logp, with_old.old_logp), (
        "π_old log-probs differ between the two routes"
    )
    assert a["loss"] == b["loss"] and b["ratio_max"] == 1.0


def test_advantage_flags_follow_the_papers():
    r = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0])
    assert abs(advantages(r, GRPOConfig(group_size=8, adv_eps=0.0))[0].item() - 0.9354) < 1e-3
    assert (
        abs(
            advantages(r, GRPOConfig(group_size=8, adv_eps=0.0, adv_std="population"))[0].item()
            - 1.0
        )
        < 1e-6
    )
    assert advantages(r, GRPOConfig(group_size=8, adv_scale="none"))[0].item() == 0.5
    rloo = advantages(r, GRPOConfig(group_size=8, baseline="rloo", adv_scale="none"))
    assert abs(rloo[0].item() - 8 / 7 * 0.5) < 1e-6


def test_reference_never_changes_unless_asked(tmp_path, tiny_pretrained):
    init, model, _ = tiny_pretrained
    train(cfg_for(tmp_path, init, lr=1e-2), log=lambda *a: None)
    state = read_checkpoint(tmp_path / "run" / "model.pt")
    ref = state["extra"]["rl"]["ref"]
    assert all(torch.equal(ref[k], v) for k, v in model.state_dict().items()), "π_ref moved"
    assert not all(torch.equal(state["model"][k], v) for k, v in model.state_dict().items()), (
        "policy did not move"
    )
    train(
        cfg_for(tmp_path, init, lr=1e-2, out=str(tmp_path / "iter"), ref_update_every=1),
        log=lambda *a: None,
    )
    state = read_checkpoint(tmp_path / "iter" / "model.pt")
    assert all(torch.equal(state["extra"]["rl"]["ref"][k], v) for k, v in state["model"].items())


def test_resume_reproduces_the_uninterrupted_metrics(tmp_path, tiny_pretrained):
    init, _, _ = tiny_pretrained
    train(cfg_for(tmp_path, init, steps=4, out=str(tmp_path / "straight")), log=lambda *a: None)
    train(cfg_for(tmp_path, init, steps=2, out=str(tmp_path / "split")), log=lambda *a: None)
    main(["--resume", str(tmp_path / "split"), "--steps", "4", "--quiet"])
    a = read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    b = read_jsonl(tmp_path / "split" / "metrics.jsonl")
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4]
    assert strip(a) == strip(b)


@pytest.mark.slow
def test_resume_is_exact_for_a_reward_that_draws_from_the_global_generators(
    tmp_path, tiny_pretrained
):
    """A reward drawing from torch's, Python's and numpy's global generators: --seed seeds all three
    and the checkpoint keeps their states, so the same seed gives the same run, interrupted and
    resumed or not."""
    init, _, _ = tiny_pretrained
    noisy = tmp_path / "noisy.py"
    noisy.write_text(
        "import random\nimport numpy as np\nimport torch\n"
        "def f(p, c):\n    return float(c == 'pizza') + random.random() + "
        "float(np.random.rand()) + "
        "torch.rand(()).item()\n"
    )
    cfg = lambda out, steps: cfg_for(
        tmp_path, init, steps=steps, out=str(tmp_path / out), reward=f"{noisy}:f"
    )  # noqa
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]
    train(cfg("straight", 4), log=lambda *a: None)
    train(cfg("again", 4), log=lambda *a: None)
    a, again = (strip(read_jsonl(tmp_path / d / "metrics.jsonl")) for d in ("straight", "again"))
    assert a == again, (
        "the same --seed must give the same run for a reward that draws random numbers"
    )
    train(cfg("split", 2), log=lambda *a: None)
    # the process's generators move on between the two halves
    random.random(), np.random.rand(), torch.rand(3)
    main(["--resume", str(tmp_path / "split"), "--steps", "4", "--quiet"])
    assert strip(read_jsonl(tmp_path / "split" / "metrics.jsonl")) == a


# the paper's GRPO in the default run; each other preset, 3 steps and a figure, in the slow one
@pytest.mark.parametrize(
    "preset",
    [p if p == "grpo" else pytest.param(p, marks=pytest.mark.slow) for p in sorted(PRESETS)],
)
def test_every_preset_runs_three_steps(tmp_path, tiny_pretrained, preset):
    init, _, _ = tiny_pretrained
    # explicit steps win
    cfg = cfg_for(tmp_path, init, **{**PRESETS[preset], "steps": 3}, preset=preset, plot=True)
    summary = train(cfg, log=lambda *a: None)
    assert summary["step"] == 3
    out = tmp_path / "run"
    assert {"model.pt", "config.json", "metrics.jsonl", "metrics.png", "samples.txt"} <= {
        p.name for p in out.iterdir()
    }
    assert json.loads((out / "config.json").read_text())["preset"] == preset


def test_preset_values_land_in_config_and_explicit_flags_win(tmp_path, tiny_pretrained):
    init, _, _ = tiny_pretrained
    out = tmp_path / "dapo"
    main(
        [
            "--init",
            str(init),
            "--out",
            str(out),
            "--preset",
            "dapo",
            "--clip-high",
            "0.3",
            "--steps",
            "1",
            "--group-size",
            "2",
            "--prompts-per-step",
            "1",
            "--quiet",
            "--preserve-per-prompt",
            "1",
        ]
    )
    cfg = json.loads((out / "config.json").read_text())
    assert (
        cfg["skip_equal_groups"] is True and cfg["loss_agg"] == "token-mean" and cfg["beta"] == 0.0
    )
    assert cfg["clip_high"] == 0.3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--group-size", "1"], "--group-size must be >= 2"),
        (["--reward", "chocolate"], "unknown reward 'chocolate'"),
        (["--reward", "pizza=x"], "malformed --reward spec"),
        (["--reward", "nope.py:f"], "does not exist"),
        (["--person", "zed"], "unknown --person 'zed'"),
        (["--preset", "ppo2"], "unknown --preset 'ppo2'"),
        (["--init", "missing.pt"], "python -m minigrpo.pretrain"),
        (["--no-rollout-kl"], "--no-rollout-kl skips π_ref's log-probs, which --beta 0.3 need"),
        (["--no-rollout-kl", "--beta", "0", "--fork-entropy", "0.5"], "and --fork-entropy need"),
    ],
)
def test_bad_input_gives_one_line_and_exit_code_2(tmp_path, tiny_pretrained, capsys, argv, message):
    init, _, _ = tiny_pretrained
    with pytest.raises(SystemExit) as e:
        main(["--init", str(init), "--out", str(tmp_path / "bad"), "--quiet", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_no_rollout_kl_at_beta_zero_trains_identically_without_the_reference_forward(
    tmp_path, tiny_pretrained, monkeypatch
):
    """At β = 0 the rollout's π_ref log-probs only feed its KL metrics: --no-rollout-kl skips their
    forward, and every other metric (the exact evaluation's kl_ref too) is unchanged."""
    init, _, _ = tiny_pretrained
    forwards = []
    orig = rollout.generation_logprobs
    monkeypatch.setattr(
        rollout,
        "generation_logprobs",
        lambda model, *a, **k: forwards.append(model) or orig(model, *a, **k),
    )
    rows = {}
    for on in (True, False):
        forwards.clear()
        train(
            cfg_for(
                tmp_path,
                init,
                preset="dapo",
                **PRESETS["dapo"],
                steps=3,
                out=str(tmp_path / str(on)),
                rollout_kl=on,
            ),
            log=lambda *a: None,
        )
        logged = read_jsonl(tmp_path / str(on) / "metrics.jsonl")
        rows[on] = [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in logged]
        assert len(forwards) == (3 if on else 0), (
            "collect's π_ref forwards (one a step, only with the metrics)"
        )
    kl = {"kl_exact"}  # dapo's --kl: exact, so the estimator's key is kl_exact too
    assert all(kl <= set(r) for r in rows[True] if "loss" in r) and not any(
        kl & set(r) for r in rows[False]
    )
    assert [{k: v for k, v in r.items() if k not in kl} for r in rows[True]] == rows[False]
    assert any("kl_ref" in r for r in rows[False])


def test_resume_of_a_folder_without_checkpoint_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as e:
        main(["--resume", str(tmp_path / "empty")])
    assert e.value.code == 2 and "config.json" in capsys.readouterr().err


def test_a_reward_that_raises_stops_the_run_with_one_line(tmp_path, tiny_pretrained, capsys):
    init, _, _ = tiny_pretrained
    bad = tmp_path / "bad_reward.py"
    bad.write_text(
        "def f(prompt, completion):\n    if completion != 'pizza':\n        raise "
        "KeyError(completion)\n"
        "    return 1.0\n"
    )
    with pytest.raises(SystemExit) as e:
        main(
            [
                "--init",
                str(init),
                "--out",
                str(tmp_path / "r"),
                "--quiet",
                "--reward",
                f"{bad}:f",
                "--steps",
                "2",
                "--preserve-per-prompt",
                "1",
            ]
        )
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "bad_reward.py:f" in err and "ravin likes " in err and "KeyError" in err


# ---- behaviour of single updates, by hand --------------------------------------------------------


def grads(model):
    return [
        p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()
    ]


@pytest.mark.parametrize("kl", ["k1", "k2", "k3"])
def test_kl_in_reward_subtracts_beta_times_the_summed_kl_of_each_sequence(tiny_pretrained, kl):
    _, model, tok = tiny_pretrained
    model = copy.deepcopy(model)
    ref = perturbed(model, 0.05, seed=0)  # π_old ≠ π_ref: a penalty that is not 0
    batch = collect(
        model,
        ref,
        tok,
        ["ravin likes "],
        4,
        make_reward("pizza", food.REWARDS),
        torch.Generator().manual_seed(3),
        max_new_tokens=12,
        keep_ref_logits=True,
    )
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    beta = 0.1
    cfg = GRPOConfig(
        group_size=4,
        updates=1,
        beta=beta,
        kl=kl,
        kl_in="reward",
        adv_scale="none",
        loss_agg="token-mean",
    )
    algo = GRPO(fake_run(cfg, model))
    assert algo.needs_old_logp, "the reward penalty needs π_old's log-probs from the rollout"
    # by hand: pen_i = β Σ_t k(log π_old, log π_ref), Δ = log π_ref − log π_old
    est = {"k1": lambda d: -d, "k2": lambda d: 0.5 * d * d, "k3": lambda d: math.exp(d) - d - 1}[kl]
    pen = []
    for i in range(4):
        n = int(batch.mask[i].sum())
        pen.append(
            beta
            * sum(est(batch.ref_logp[i, t].item() - batch.old_logp[i, t].item()) for t in range(n))
        )
    shaped = [r - p for r, p in zip(batch.rewards.tolist(), pen)]
    # no std division: the penalty shows in the advantages
    adv = [s - sum(shaped) / 4 for s in shaped]
    n_tok = [int(batch.mask[i].sum()) for i in range(4)]
    policy_loss = sum(-adv[i] * n_tok[i] for i in range(4)) / sum(n_tok)  # token-mean, ratio 1
    stats = algo.update(batch, torch.optim.SGD(model.parameters(), lr=0.0))
    assert max(abs(p) for p in pen) > 1e-3, "the test needs a non-zero penalty"
    assert abs(stats["kl_reward_penalty"] - sum(pen) / 4) < 1e-6, (
        stats["kl_reward_penalty"],
        sum(pen) / 4,
    )
    assert abs(stats["policy_loss"] - policy_loss) < 1e-5, (stats["policy_loss"], policy_loss)
    assert stats["loss"] == stats["policy_loss"], (
        "with --kl-in reward the loss must hold no KL term"
    )
    assert abs(stats["adv_std"] - torch.tensor(adv).std().item()) < 1e-5


def skipping_run(tmp_path, init, preserve, anchor="tree"):
    cfg = cfg_for(
        tmp_path,
        init,
        preserve=preserve,
        skip_equal_groups=True,
        grad_clip=0.0,
        preserve_coef=5.0,
        preserve_anchor=anchor,
        out=str(tmp_path / f"skip-{preserve}-{anchor}"),
    )
    return Run(cfg, "grpo")


@pytest.mark.parametrize("preserve, anchor", [(False, "tree"), (True, "tree"), (True, "sampled")])
def test_a_step_whose_groups_are_all_equal_takes_its_updates_on_preservation_alone(
    tmp_path, tiny_pretrained, preserve, anchor
):
    init, _, tok = tiny_pretrained
    run = skipping_run(tmp_path, init, preserve, anchor)
    with torch.no_grad():  # away from π_ref, so the preservation gradient is not 0
        for p in run.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    batch = collect(
        run.policy,
        run.ref,
        tok,
        ["ravin likes "] * 2,
        4,
        run.reward,
        torch.Generator().manual_seed(0),
        max_new_tokens=12,
        keep_ref_logits=True,
        old_logp=False,
    )
    batch.rewards = torch.ones(8)  # every group all-equal: no RL signal
    before = copy.deepcopy(run.policy)
    expected = copy.deepcopy(run.policy)
    losses = []
    if preserve:  # μ SGD steps on the preservation term alone, with the rows the run will draw
        m = run.anchor.gen.ids.size(0)
        rows_gen = torch.Generator()
        rows_gen.set_state(run.gens["anchor_rows"].get_state())
        sgd = torch.optim.SGD(expected.parameters(), lr=0.1)
        for _ in range(run.cfg.updates):
            # the tree anchor takes every row at every update; sampled: a fresh minibatch
            rows = None
            if anchor == "sampled":
                rows = torch.randperm(m, generator=rows_gen)[: run.cfg.preserve_batch]
            term = run.cfg.preserve_coef * anchor_loss(expected, run.anchor, rows)
            sgd.zero_grad()
            term.backward()
            losses.append(term.item())
            sgd.step()
    assert run.cfg.updates == 2 and (not preserve or losses[0] != losses[1]), (
        "two updates, each of its own"
    )
    stats = GRPO(run).update(batch, torch.optim.SGD(run.policy.parameters(), lr=0.1))
    assert stats["skipped"] == 1.0 and stats["equal_groups"] == 1.0
    assert "policy_loss" not in stats, "no policy loss may be computed on dropped groups"
    same = all(torch.equal(p, q) for p, q in zip(run.policy.parameters(), before.parameters()))
    if not preserve:
        assert same, "with preservation off an all-dropped step must leave the policy unchanged"
    else:
        assert not same and abs(stats["preserve_loss"] - sum(losses) / len(losses)) < 1e-6
        for p, q in zip(run.policy.parameters(), expected.parameters()):
            assert torch.allclose(p, q, atol=1e-6), (
                "the step must be exactly μ steps on the preservation term"
            )


def test_skip_equal_groups_trains_on_exactly_the_rows_of_the_other_groups(
    tiny_pretrained, monkeypatch
):
    _, model, tok = tiny_pretrained
    model = copy.deepcopy(model)
    batch = collect(
        model,
        copy.deepcopy(model),
        tok,
        ["ravin likes "] * 3,
        2,
        make_reward("pizza", food.REWARDS),
        torch.Generator().manual_seed(4),
        max_new_tokens=12,
        keep_ref_logits=True,
        old_logp=False,
    )
    batch.rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])  # the middle group is all-equal
    calls = []
    spy(monkeypatch, "generation_logprobs", calls)
    cfg = GRPOConfig(
        group_size=2,
        updates=1,
        beta=0.0,
        skip_equal_groups=True,
        loss_agg="token-mean",
        adv_eps=0.0,
    )
    stats = GRPO(fake_run(cfg, model)).update(batch, torch.optim.SGD(model.parameters(), lr=0.0))
    keep = [0, 1, 4, 5]
    assert len(calls) == 1 and torch.equal(calls[0][0][1].ids, batch.gen.ids[keep]), (
        "the wrong rows were kept"
    )
    assert stats["equal_groups"] == pytest.approx(1 / 3) and "skipped" not in stats
    # token-mean over the kept rows with A = ±1/√2 (Bessel std of a {1, 0} group), ratio 1
    a = [1 / math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2), 1 / math.sqrt(2)]
    n = [int(batch.mask[i].sum()) for i in keep]
    assert stats["policy_loss"] == pytest.approx(
        sum(-x * k for x, k in zip(a, n)) / sum(n), abs=1e-6
    )


def entropy_gradient(model, batch, cfg):
    """∇ of the aggregated per-token entropy of the batch's completions, computed from the logits by
    hand."""
    model.zero_grad()
    _, logits = generation_logprobs(model, batch.gen, return_logits=True)
    logp = torch.log_softmax(logits, -1)
    h = -(logp.exp() * logp).sum(-1)  # (N, T)
    m = batch.mask
    agg = (torch.where(m, h, 0.0).sum(1) / m.sum(1)).mean()  # seq-mean-token-mean (GRPO's default)
    agg.backward()
    return grads(model), agg.item()


def test_entropy_bonus_adds_minus_coef_times_the_entropy_gradient(tiny_pretrained):
    _, model, tok = tiny_pretrained
    coef = 0.5
    out = {}
    for c in (0.0, coef):
        m = copy.deepcopy(model)
        batch = two_completion_batch(m, tok, seed=5)
        batch.rewards = torch.tensor([1.0, 0.0])
        cfg = GRPOConfig(group_size=2, updates=1, beta=0.0, entropy_coef=c)
        GRPO(fake_run(cfg, m)).update(batch, torch.optim.SGD(m.parameters(), lr=0.0))
        out[c] = grads(m)
    g_h, h0 = entropy_gradient(copy.deepcopy(model), batch, cfg)
    diff = [gc - g0 for gc, g0 in zip(out[coef], out[0.0])]
    for d, gh in zip(diff, g_h):
        assert torch.allclose(d, -coef * gh, atol=1e-6), "the entropy term's gradient must be −c·∇H"
    # the direction: a descent step on the loss with the bonus raises the entropy (first order)
    assert sum((-d * gh).sum().item() for d, gh in zip(diff, g_h)) > 0
    lr = 0.05
    after = {}
    for c, g in out.items():
        m = copy.deepcopy(model)
        with torch.no_grad():
            for p, gp in zip(m.parameters(), g):
                p.sub_(lr * gp)
        after[c] = entropy_gradient(m, batch, cfg)[1]
    assert after[coef] > after[0.0], f"the bonus must raise the entropy: {after}"


# ---- the presets' distinguishing behaviour, through train ---------------------------------------


def spy(monkeypatch, name, record, table=None, module=None):
    """Wrap <module>.<name> (default module: minigrpo.grpo), or the function of table[name] (e.g. a
    POLICY_LOSSES entry), so every call's arguments and result are appended to `record`."""
    import minigrpo.grpo as grpo_module

    grpo_module = module or grpo_module
    original = getattr(grpo_module, name) if table is None else table[name].fn

    def wrapped(*args, **kw):
        out = original(*args, **kw)
        record.append((args, kw, out))
        return out

    if table is None:
        monkeypatch.setattr(grpo_module, name, wrapped)
    else:
        monkeypatch.setitem(table, name, dataclasses.replace(table[name], fn=wrapped))


def test_dapo_drops_equal_reward_groups_and_trains_on_the_rest(
    tmp_path, tiny_pretrained, monkeypatch
):
    init, _, _ = tiny_pretrained
    calls = []
    spy(monkeypatch, "generation_logprobs", calls)
    cfg = cfg_for(
        tmp_path,
        init,
        **PRESETS["dapo"],
        preset="dapo",
        steps=4,
        prompts_per_step=3,
        group_size=3,
        goal=0.0,
        seed=1,
    )
    train(cfg, log=lambda *a: None)
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    # rows of each inner update's forward pass
    sizes = [args[1].ids.size(0) for args, _, _ in calls]
    expected = []
    for r in rows:  # μ = 2 inner updates per step, on the groups that were not all-equal
        kept = round((1 - r["equal_groups"]) * cfg.prompts_per_step) * cfg.group_size
        expected += [kept] * cfg.updates if kept else []
    assert sizes == expected, (sizes, [r["equal_groups"] for r in rows])
    assert any(0 < r["equal_groups"] < 1 for r in rows), (
        "the test needs a step where some group was dropped"
    )
    assert min(sizes) < cfg.prompts_per_step * cfg.group_size


def per_token_losses_along_rows(calls):
    """For the second inner update of each step: does the per-token loss vary along a row?"""
    varies = []
    for args, kw, out in calls[1::2]:
        mask = args[3]
        for i in range(out.size(0)):
            v = out[i][mask[i]]
            if len(v) > 1 and v.abs().max() > 0:
                varies.append((v.max() - v.min()).item() > 1e-7 * v.abs().max().item())
    return varies


def test_gspo_uses_one_ratio_per_sequence(tmp_path, tiny_pretrained, monkeypatch):
    """A constant advantage per row, so the per-token loss is constant along a row iff the ratio
    is."""
    init, _, _ = tiny_pretrained
    for preset, constant in (("gspo", True), ("grpo", False)):
        calls = []
        # grpo_loss picks its loss from the table
        spy(monkeypatch, "ppo_clip", calls, table=POLICY_LOSSES)
        cfg = cfg_for(
            tmp_path,
            init,
            **PRESETS[preset],
            preset=preset,
            steps=2,
            goal=0.0,
            lr=1e-2,
            out=str(tmp_path / preset),
            reward="length",
        )  # rewards differ in every group
        train(cfg, log=lambda *a: None)
        varies = per_token_losses_along_rows(calls)
        assert varies, f"{preset}: no row to check"
        if constant:
            assert not any(varies), "GSPO: the ratio must be the same at every token of a sequence"
        else:
            assert any(varies), (
                "the token-level ratio must vary along a sequence (else this test cannot fail)"
            )
        monkeypatch.undo()


def test_rloo_puts_its_kl_in_the_reward_not_the_loss(tmp_path, tiny_pretrained):
    init, _, _ = tiny_pretrained
    for preset in ("rloo", "grpo"):
        cfg = cfg_for(
            tmp_path,
            init,
            **PRESETS[preset],
            preset=preset,
            steps=2,
            goal=0.0,
            lr=1e-2,
            out=str(tmp_path / preset),
        )
        train(cfg, log=lambda *a: None)
        rows = [r for r in read_jsonl(tmp_path / preset / "metrics.jsonl") if r["step"] > 0]
        assert len(rows) == 2
        kl_in_loss = [r["loss"] - r["policy_loss"] - r["preserve_loss"] for r in rows]
        if preset == "rloo":
            assert all("kl_reward_penalty" in r for r in rows)
            assert rows[0]["kl_reward_penalty"] == 0.0, (
                "at step 1 π_old = π_ref: the penalty is exactly 0"
            )
            assert any(abs(r["kl_reward_penalty"]) > 1e-6 for r in rows[1:]), (
                "later steps must pay a penalty"
            )
            assert all(abs(x) < 1e-6 for x in kl_in_loss), (
                f"RLOO's loss must hold no KL term: {kl_in_loss}"
            )
        else:
            assert not any("kl_reward_penalty" in r for r in rows)
            assert any(x > 1e-6 for x in kl_in_loss[1:]), f"GRPO's KL is a loss term: {kl_in_loss}"


def test_j_beta_preset_takes_the_reinforce_gradient_of_the_kl_regularised_objective(
    tiny_pretrained,
):
    """∇J_β = E_y[(r(y) − β·log π(y)/π_ref(y) − b)·∇ log π(y)]: with --preset j_beta the update's
    gradient is exactly −(1/N) Σ_i A_i ∇ Σ_t log π(y_it), A_i = R_i − mean_{j≠i} R_j, R_i = r_i − β
    Σ_t log(π_old/π_ref)."""
    from minigrpo.grpo import PRESETS
    from minigrpo.lm.logprobs import generation_logprobs

    _, model, tok = tiny_pretrained
    model = copy.deepcopy(model)
    ref = perturbed(model, 0.05, seed=0)
    batch = collect(
        model,
        ref,
        tok,
        ["ravin likes "],
        4,
        make_reward("pizza", food.REWARDS),
        torch.Generator().manual_seed(5),
        max_new_tokens=12,
        keep_ref_logits=True,
    )
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    beta = 0.3
    cfg = GRPOConfig(group_size=4, **{**PRESETS["j_beta"], "beta": beta})
    assert cfg.updates == 1 and cfg.adv_scale == "none" and cfg.loss_agg == "seq-mean-token-sum"
    shaped = batch.rewards - beta * torch.where(
        batch.mask, batch.old_logp - batch.ref_logp, 0.0
    ).sum(1)
    adv = shaped - (shaped.sum() - shaped) / 3  # leave-one-out baseline
    logp = generation_logprobs(model, batch.gen)
    hand = -(adv[:, None] * torch.where(batch.mask, logp, 0.0)).sum() / 4
    want = torch.autograd.grad(hand, list(model.parameters()))
    GRPO(fake_run(cfg, model)).update(batch, torch.optim.SGD(model.parameters(), lr=0.0))
    got = [p.grad for p in model.parameters()]
    assert all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want)), (
        "j_beta's update must be the plain REINFORCE gradient of J_β (KL-shaped reward, "
        "leave-one-out, Σ_t, μ = 1)"
    )


def loss_inputs(seed=0, lengths=(3, 1, 4), T=4, V=5):
    """Random (logp with grad, old_logp, ref_logp, logits with grad, ref_logits, adv, mask) for
    grpo_loss."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(lengths), T, V, generator=g, dtype=torch.float64, requires_grad=True)
    ref_logits = torch.randn(len(lengths), T, V, generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (len(lengths), T), generator=g)
    logp = torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1)
    ref_logp = torch.log_softmax(ref_logits, -1).gather(-1, ids[..., None]).squeeze(-1)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)[: len(lengths)]
    return (
        logp,
        logp.detach().clone(),
        ref_logp,
        logits,
        ref_logits,
        adv,
        right_padded(list(lengths), T),
    )


def test_grpo_loss_at_ratio_one_pushes_each_token_by_minus_its_advantage_over_its_length():
    logp, old, ref_logp, logits, ref_logits, adv, mask = loss_inputs()
    logp.retain_grad()
    # the default aggregation: the mean over tokens, then sequences
    cfg = GRPOConfig(beta=0.0, max_new_tokens=4)
    out = grpo_loss(logp, old, ref_logp, logits, ref_logits, adv, mask, cfg)
    assert isinstance(out, tuple) and len(out) == 4, (
        "grpo_loss returns (loss, policy_loss, kl_tok, entropy)"
    )
    loss, policy_loss = out[:2]
    loss.backward()
    n = mask.sum(1, keepdim=True).double()
    # −A_i / (B·|o_i|) per valid token
    want = torch.where(mask, -adv[:, None] / (3 * n), torch.zeros(()))
    assert torch.allclose(logp.grad, want), (
        f"d loss / d logp = {logp.grad.tolist()}, expected −A_i/(B·|o_i|) = {want.tolist()}: at "
        "ρ = 1 the clipped "
        "surrogate's gradient is −A per token, and seq-mean-token-mean divides by |o_i| and by B"
    )
    assert abs(loss.item() - policy_loss.item()) < 1e-12, (
        "with β = 0 and no entropy bonus the loss is the policy loss"
    )


@pytest.mark.parametrize("kl", ["exact", "k3"])
def test_grpo_loss_adds_beta_times_the_aggregated_kl_only_when_the_kl_is_in_the_loss(kl):
    logp, old, ref_logp, logits, ref_logits, adv, mask = loss_inputs(1)
    cfg = GRPOConfig(beta=0.3, kl=kl, loss_agg="token-mean", max_new_tokens=4)
    loss, policy_loss, kl_tok, _ = grpo_loss(
        logp, old, ref_logp, logits, ref_logits, adv, mask, cfg
    )
    kl_mean = kl_tok[mask].mean()
    assert (kl_tok[mask] >= -1e-12).all() and kl_tok.shape == mask.shape, (
        "KL_t must be (N, T) and ≥ 0 here"
    )
    assert abs(loss.item() - (policy_loss + 0.3 * kl_mean).item()) < 1e-10, (
        f"loss {loss.item():.6f} ≠ policy_loss + β·token-mean(KL_t) = "
        f"{(policy_loss + 0.3 * kl_mean).item():.6f}: "
        "the KL is ADDED to the loss we minimise (a penalty), aggregated like the policy loss"
    )
    cfg.kl_in = "reward"
    loss_r, policy_r, _, _ = grpo_loss(logp, old, ref_logp, logits, ref_logits, adv, mask, cfg)
    assert abs(loss_r.item() - policy_r.item()) < 1e-12, (
        "with --kl-in reward the KL is already in the rewards"
    )


def test_grpo_loss_subtracts_the_entropy_bonus_and_uses_policy_mask_for_the_surrogate_only():
    logp, old, ref_logp, logits, ref_logits, adv, mask = loss_inputs(2)
    cfg = GRPOConfig(beta=0.0, entropy_coef=0.1, loss_agg="token-mean", max_new_tokens=4)
    loss, policy_loss, _, ent = grpo_loss(logp, old, ref_logp, logits, ref_logits, adv, mask, cfg)
    assert abs(loss.item() - (policy_loss - 0.1 * ent[mask].mean()).item()) < 1e-10, (
        "loss = policy − c_H·H"
    )
    none = torch.zeros_like(mask)
    _, policy_none, _, _ = grpo_loss(
        logp, old, ref_logp, logits, ref_logits, adv, mask, cfg, policy_mask=none
    )
    assert policy_none.item() == 0.0, "tokens outside policy_mask carry no policy loss"
