import json
from types import SimpleNamespace

import pytest
import torch

from minigrpo.grpo import GRPO, PRESETS, GRPOConfig, advantages, main, train
from minigrpo.metrics import read_jsonl
from minigrpo.rewards import make_reward
from minigrpo.rollout import collect
from minigrpo.checkpoint import read_checkpoint
from toy_tasks import food

TIME_KEYS = {"step_time", "tokens_per_s"}


def cfg_for(tmp_path, init, **kw):
    base = dict(init=str(init), out=str(tmp_path / "run"), steps=3, prompts_per_step=2, group_size=4,
                max_new_tokens=12, eval_every=1, ckpt_every=2, quiet=True, preserve_per_prompt=2, preserve_batch=8)
    return GRPOConfig(**{**base, **kw})


def fake_run(cfg, model):
    """The few things GRPO.update needs from a Run, without preservation."""
    def clip_and_step(opt, loss, params):
        opt.zero_grad()
        loss.backward()
        opt.step()
        return 0.0
    return SimpleNamespace(cfg=cfg, policy=model, anchor_term=lambda: None, clip_and_step=clip_and_step)


def two_completion_batch(model, tok, reward="pizza", seed=0, old_logp=True):
    ref = __import__("copy").deepcopy(model)
    return collect(model, ref, tok, ["ravin likes "], 2, make_reward(reward, food.REWARDS), torch.Generator().manual_seed(seed),
                   max_new_tokens=12, keep_ref_logits=True, old_logp=old_logp)


def test_one_step_loss_equals_a_hand_computation(tiny_pretrained):
    _, model, tok = tiny_pretrained
    model = __import__("copy").deepcopy(model)
    batch = two_completion_batch(model, tok)
    batch.rewards = torch.tensor([1.0, 0.0])  # force one good, one bad completion
    cfg = GRPOConfig(group_size=2, updates=1, beta=0.04, kl="k3", loss_agg="token-mean", max_new_tokens=12)
    # hand computation, one completion at a time, with plain Python sums
    a = 0.5 / (2 ** 0.5 / 2 + 1e-4)  # (1 - 0.5) / (Bessel std of [1, 0] + eps)
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


def test_only_completion_tokens_receive_gradient(tiny_pretrained):
    _, model, tok = tiny_pretrained
    model = __import__("copy").deepcopy(model)
    batch = two_completion_batch(model, tok, seed=1)
    batch.rewards = torch.tensor([1.0, 0.0])
    captured = {}
    original = model.head
    def head(h):  # capture the logits of the training forward pass
        out = original(h)
        out.retain_grad()
        captured["logits"] = out
        return out
    model.head = head
    cfg = GRPOConfig(group_size=2, updates=1, beta=0.0)
    GRPO(fake_run(cfg, model)).update(batch, torch.optim.SGD(model.parameters(), lr=0.0))
    grad = captured["logits"].grad.abs().sum(-1)  # (N, P+T-1): position t predicts token t+1
    P = batch.gen.prompt_len
    assert (grad[:, : P - 1] == 0).all(), "a prompt token received gradient"
    for i in range(2):
        n = int(batch.mask[i].sum())
        assert (grad[i, P - 1 + n:] == 0).all(), "a token after the end received gradient"
        assert (grad[i, P - 1: P - 1 + n] > 0).all(), "a completion token received no gradient"


def test_updates_one_gives_ratio_exactly_one(tiny_pretrained):
    _, model, tok = tiny_pretrained
    model = __import__("copy").deepcopy(model)
    batch = two_completion_batch(model, tok)
    batch.rewards = torch.tensor([1.0, 0.0])
    stats = GRPO(fake_run(GRPOConfig(group_size=2, updates=1), model)).update(batch, torch.optim.AdamW(model.parameters(), lr=1e-2))
    assert stats["ratio_mean"] == 1.0 and stats["ratio_max"] == 1.0
    assert stats["clip_frac_low"] == 0 and stats["clip_frac_high"] == 0
    stats2 = GRPO(fake_run(GRPOConfig(group_size=2, updates=3), model)).update(batch, torch.optim.AdamW(model.parameters(), lr=1e-1))
    assert stats2["ratio_max"] > 1.0, "with μ > 1 the later updates must see a ratio away from 1"


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
    assert torch.equal(without.old_logp, with_old.old_logp), "π_old log-probs differ between the two routes"
    assert a["loss"] == b["loss"] and b["ratio_max"] == 1.0


def test_advantage_flags_follow_the_papers():
    r = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0])
    assert abs(advantages(r, GRPOConfig(group_size=8, adv_eps=0.0))[0].item() - 0.9354) < 1e-3
    assert abs(advantages(r, GRPOConfig(group_size=8, adv_eps=0.0, adv_std="population"))[0].item() - 1.0) < 1e-6
    assert advantages(r, GRPOConfig(group_size=8, adv_scale="none"))[0].item() == 0.5
    rloo = advantages(r, GRPOConfig(group_size=8, baseline="rloo", adv_scale="none"))
    assert abs(rloo[0].item() - 8 / 7 * 0.5) < 1e-6


def test_reference_never_changes_unless_asked(tmp_path, tiny_pretrained):
    init, model, _ = tiny_pretrained
    train(cfg_for(tmp_path, init, lr=1e-2), log=lambda *a: None)
    state = read_checkpoint(tmp_path / "run" / "model.pt")
    ref = state["extra"]["rl"]["ref"]
    assert all(torch.equal(ref[k], v) for k, v in model.state_dict().items()), "π_ref moved"
    assert not all(torch.equal(state["model"][k], v) for k, v in model.state_dict().items()), "policy did not move"
    train(cfg_for(tmp_path, init, lr=1e-2, out=str(tmp_path / "iter"), ref_update_every=1), log=lambda *a: None)
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


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_runs_three_steps(tmp_path, tiny_pretrained, preset):
    init, _, _ = tiny_pretrained
    cfg = cfg_for(tmp_path, init, **{**PRESETS[preset], "steps": 3}, preset=preset)  # explicit steps win
    summary = train(cfg, log=lambda *a: None)
    assert summary["step"] == 3
    out = tmp_path / "run"
    assert {"model.pt", "config.json", "metrics.jsonl", "metrics.png", "samples.txt"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "config.json").read_text())["preset"] == preset


def test_preset_values_land_in_config_and_explicit_flags_win(tmp_path, tiny_pretrained):
    init, _, _ = tiny_pretrained
    out = tmp_path / "dapo"
    main(["--init", str(init), "--out", str(out), "--preset", "dapo", "--clip-high", "0.3", "--steps", "1",
          "--group-size", "2", "--prompts-per-step", "1", "--quiet", "--preserve-per-prompt", "1"])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["skip_equal_groups"] is True and cfg["loss_agg"] == "token-mean" and cfg["beta"] == 0.0
    assert cfg["clip_high"] == 0.3


@pytest.mark.parametrize("argv, message", [
    (["--group-size", "1"], "--group-size must be >= 2"),
    (["--reward", "chocolate"], "unknown reward 'chocolate'"),
    (["--reward", "pizza=x"], "malformed --reward spec"),
    (["--reward", "nope.py:f"], "does not exist"),
    (["--person", "zed"], "unknown --person 'zed'"),
    (["--preset", "ppo2"], "unknown --preset 'ppo2'"),
    (["--init", "missing.pt"], "python -m minigrpo.pretrain"),
])
def test_bad_input_gives_one_line_and_exit_code_2(tmp_path, tiny_pretrained, capsys, argv, message):
    init, _, _ = tiny_pretrained
    with pytest.raises(SystemExit) as e:
        main(["--init", str(init), "--out", str(tmp_path / "bad"), "--quiet", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_resume_of_a_folder_without_checkpoint_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as e:
        main(["--resume", str(tmp_path / "empty")])
    assert e.value.code == 2 and "config.json" in capsys.readouterr().err


def test_a_reward_that_raises_stops_the_run_with_one_line(tmp_path, tiny_pretrained, capsys):
    init, _, _ = tiny_pretrained
    bad = tmp_path / "bad_reward.py"
    bad.write_text("def f(prompt, completion):\n    if completion != 'pizza':\n        raise KeyError(completion)\n    return 1.0\n")
    with pytest.raises(SystemExit) as e:
        main(["--init", str(init), "--out", str(tmp_path / "r"), "--quiet", "--reward", f"{bad}:f", "--steps", "2",
              "--preserve-per-prompt", "1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "bad_reward.py:f" in err and "ravin likes " in err and "KeyError" in err
