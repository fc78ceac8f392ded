"""The variants wired into GRPO (the flags of minigrpo/variants and the presets): each flag's
distinguishing behaviour through grpo_loss, GRPO.update or a whole run. The math itself is pinned in
test_policy_losses.py, test_entropy_control.py, test_kl.py and test_advantages.py; every preset's
three-step run is test_grpo.py::test_every_preset_runs_three_steps (it walks PRESETS). Kept out of
test_grpo.py, whose grpo_loss tests also grade a learner's capstone (minigrpo.learn)."""

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import one_line_error
from test_grpo import TIME_KEYS, cfg_for, fake_run, loss_inputs, spy

from minigrpo.grpo import GRPO, PRESETS, GRPOConfig, advantages, grpo_loss, main, train
from minigrpo.lm.checkpoint import read_checkpoint
from minigrpo.objectives.entropy_control import (
    clip_cov_mask,
    next_coef,
    token_covariance,
    top_cov_mask,
    top_entropy_mask,
)
from minigrpo.objectives.kl import k3, k3_iw
from minigrpo.objectives.losses import entropy
from minigrpo.rl.rollout import collect
from minigrpo.util.jsonl import read_jsonl
from minigrpo.variants import advantages as adv_family
from minigrpo.variants import entropy as entropy_family
from toy_tasks import food
from toy_tasks.rewards import make_reward

QUIET = dict(log=lambda *a: None)


def logp_grad(cfg, shift=None, generator=None, seed=0):
    """grpo_loss on loss_inputs(seed) with log π_old = log π_θ − shift -> (d loss/d logp (N, T), its
    outputs, its inputs): shift[i, t] is the token's log-ratio log ρ."""
    logp, old, ref_logp, logits, ref_logits, adv, mask = loss_inputs(seed)
    if shift is not None:
        old = old - shift
    logp.retain_grad()
    out = grpo_loss(logp, old, ref_logp, logits, ref_logits, adv, mask, cfg, generator=generator)
    out[0].backward()
    return logp.grad, out, (logp, old, ref_logp, logits, ref_logits, adv, mask)


def shifted(*cells):
    """(3, 4) float64 log-ratios: 0 except the given ((i, t), value) cells."""
    s = torch.zeros(3, 4, dtype=torch.float64)
    for (i, t), v in cells:
        s[i, t] = v
    return s


def flat(**kw):
    """A config for single-loss tests: no KL, token-mean over the 8 valid tokens of loss_inputs."""
    return GRPOConfig(**{"beta": 0.0, "loss_agg": "token-mean", "max_new_tokens": 4, **kw})


# ---- the policy losses ---------------------------------------------------------------------------


def test_cispo_keeps_the_gradient_of_a_token_that_ppo_clip_stops():
    # A = 1 at ρ = e^0.5 > 1.2; A = 2 at ρ = e^2 > 5 (CISPO's cap)
    s = shifted(((0, 0), 0.5), ((2, 1), 2.0))
    g_ppo, _, _ = logp_grad(flat(), s)
    g_cispo, _, _ = logp_grad(
        flat(**{k: v for k, v in PRESETS["cispo"].items() if k != "loss_agg"}), s
    )
    assert g_ppo[0, 0] == 0 and g_ppo[2, 1] == 0, "PPO's clip stops both tokens"
    assert g_cispo[0, 0].item() == pytest.approx(-math.exp(0.5) * 1.0 / 8), (
        "CISPO: −sg(ρ)·A/N inside its cap"
    )
    assert g_cispo[2, 1].item() == pytest.approx(-5.0 * 2.0 / 8), (
        "CISPO: −(1+ε_high)·A/N past its cap: still a push"
    )


@pytest.mark.parametrize("loss_agg", ["seq-mean-token-mean", "token-mean"])
def test_gmpo_is_reduced_as_the_papers_sequence_loss_while_loss_agg_reduces_the_kl(loss_agg):
    cfg = GRPOConfig(**{**PRESETS["gmpo"], "beta": 0.0, "max_new_tokens": 4, "loss_agg": loss_agg})
    grad, (_, policy_loss, _, _), (_, _, _, _, _, adv, mask) = logp_grad(cfg)
    assert policy_loss.item() == pytest.approx(-adv.mean().item()), (
        "(1/B)·Σ_i −J_i with J_i = A_i at ρ ≡ 1"
    )
    n = mask.sum(1, keepdim=True).double()
    assert torch.allclose(grad, torch.where(mask, -adv[:, None] / (3 * n), torch.zeros(()))), (
        "at ρ ≡ 1 each token of row i gets −A_i/(B·|o_i|)"
    )
    cfg.beta = 0.3
    _, (loss, policy_loss, kl_tok, _), _ = logp_grad(cfg)
    kl = (
        kl_tok[mask].mean()
        if loss_agg == "token-mean"
        else (torch.where(mask, kl_tok, 0.0).sum(1) / n[:, 0]).mean()
    )
    assert (loss - policy_loss).item() == pytest.approx(0.3 * kl.item()), (
        "the KL term keeps --loss-agg"
    )


def test_sapo_gate_replaces_the_clip_with_a_smooth_weight():
    s = shifted(((0, 0), 0.5))
    cfg = flat(policy_loss="sapo")
    g_sapo, _, (_, _, _, _, _, adv, _) = logp_grad(cfg, s)
    g_ppo, _, _ = logp_grad(flat(), s)
    rho, x = math.exp(0.5), 1.0 * (math.exp(0.5) - 1)  # τ_pos = 1 where A > 0
    sig = 1 / (1 + math.exp(-x))
    assert g_ppo[0, 0] == 0 and g_sapo[0, 0].item() == pytest.approx(
        -4 * sig * (1 - sig) * rho * 1.0 / 8
    )
    assert torch.allclose(g_sapo[1:], g_ppo[1:]), "at ρ = 1 SAPO's gradient is PPO's (−A per token)"


# ---- the KL estimators ---------------------------------------------------------------------------


def test_k3_plus_has_k3s_value_and_k2s_gradient_and_k3_iw_weights_k3_by_the_ratio():
    beta = dict(beta=1.0, kl_in="loss")
    g_k2, _, _ = logp_grad(flat(kl="k2", **beta))
    g_plus, (_, _, kl_plus, _), (logp, _, ref_logp, *_rest) = logp_grad(flat(kl="k3+", **beta))
    assert torch.equal(kl_plus, k3(logp, ref_logp)), "k3+ logs and adds k3's value"
    assert torch.allclose(g_plus, g_k2), "k3+ differentiates as k2"
    g_iw, (_, _, kl_iw, _), (logp, old, ref_logp, *_rest) = logp_grad(flat(kl="k3_iw", **beta))
    assert torch.equal(kl_iw, k3(logp, ref_logp)) and torch.allclose(g_iw, g_k2), (
        "at ρ = 1: k3's value, k2's push"
    )
    s = shifted(((0, 1), 0.3), ((2, 2), -0.4))
    _, (_, _, kl_iw, _), (logp, old, ref_logp, *_rest) = logp_grad(flat(kl="k3_iw", **beta), s)
    assert torch.allclose(kl_iw, k3_iw(logp, ref_logp, old)), (
        "grpo_loss passes π_old's log-probs to k3_iw"
    )


# ---- the token selections: 80/20, Clip-Cov, KL-Cov -----------------------------------------------


def test_top_entropy_trains_only_the_current_policys_highest_entropy_tokens():
    grad, _, (_, _, _, logits, ref_logits, _, mask) = logp_grad(flat(top_entropy=0.2))
    chosen = top_entropy_mask(entropy(logits), mask, 0.2)
    assert int(chosen.sum()) == 2, "⌈0.2·8⌉ of the 8 valid tokens"
    assert torch.equal(grad != 0, chosen), (
        "the policy loss reaches exactly the top-entropy tokens of π_θ"
    )
    assert not torch.equal(chosen, top_entropy_mask(entropy(ref_logits), mask, 0.2)), (
        "π_ref's top tokens differ here, so the test tells the current policy's mask from "
        "--fork-entropy's"
    )


def test_clip_cov_detaches_a_seeded_random_share_of_the_tokens_the_clip_leaves_alone(monkeypatch):
    calls = []
    spy(monkeypatch, "clip_cov_mask", calls, module=entropy_family)
    cfg = flat(cov_control="clip_cov", cov_ratio=0.5, clip_cov_low=-100.0, clip_cov_high=100.0)
    s = shifted(((0, 0), 0.5), ((1, 0), -0.1))
    g_ppo, (_, p_ppo, _, _), _ = logp_grad(flat(), s)
    g_cov, (_, p_cov, _, _), (logp, _, _, _, _, adv, mask) = logp_grad(
        cfg, s, torch.Generator().manual_seed(3)
    )
    ((args, _, chosen),) = calls
    stopped = args[6]
    assert torch.equal(stopped, mask & (g_ppo == 0)), (
        "the exclusions are the tokens PPO's clip already stops"
    )
    assert torch.equal(
        chosen,
        clip_cov_mask(
            token_covariance(logp, adv, mask),
            mask,
            0.5,
            -100.0,
            100.0,
            torch.Generator().manual_seed(3),
            stopped,
        ),
    )
    assert int(chosen.sum()) == 4 and not (chosen & stopped).any()
    assert (g_cov[chosen] == 0).all() and torch.equal(g_cov[~chosen], g_ppo[~chosen]), (
        "the chosen tokens lose their gradient, the others keep PPO's"
    )
    assert p_cov.item() == pytest.approx(p_ppo.item()), (
        "detached, not removed: the loss value is PPO's"
    )


def test_kl_cov_drops_the_clip_and_adds_k_times_abs_log_ratio_on_the_top_covariance_tokens():
    s = shifted(((0, 0), 0.5), ((0, 1), -0.2), ((1, 0), 0.1), ((2, 0), -0.3), ((2, 3), 0.25))
    cfg = flat(cov_control="kl_cov", cov_ratio=0.3, kl_cov_coef=1.0)
    grad, _, (logp, old, _, _, _, adv, mask) = logp_grad(cfg, s)
    top = top_cov_mask(token_covariance(logp, adv, mask), mask, 0.3)
    assert int(top.sum()) == 2, "max(1, ⌊0.3·8⌋) tokens"
    unclipped = -s.exp() * adv[:, None] / 8  # d(−ρA)/d log π, token-mean over 8
    want = torch.where(mask, unclipped, torch.zeros(())) + torch.where(
        top, torch.sign(s) / 8, torch.zeros(())
    )
    assert torch.allclose(grad, want), (grad, want)
    assert grad[0, 0] != 0, "no clip: the token PPO would stop keeps its gradient"


# ---- advantages: GPG and ReMax -------------------------------------------------------------------


def test_gpg_scales_the_centred_advantages_by_n_over_the_nonzero_count():
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1])  # the second group is all-equal: A = 0 there
    adv = advantages(
        r, GRPOConfig(group_size=4, **{k: v for k, v in PRESETS["gpg"].items() if k == "adv_scale"})
    )
    assert torch.allclose(adv, 2 * torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])), "α = 8/4"


def greedy_completion(model, tok, prompt, n):
    """Argmax decoding by full recomputation, one token at a time -> (text, finished)."""
    ids, out = torch.tensor([tok.encode(prompt, bos=True)]), []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(ids)[0, -1].argmax())
            if nxt == tok.eos_id:
                return tok.decode(out), True
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    return tok.decode(out), False


def test_remax_subtracts_the_reward_of_each_prompts_greedy_completion(tiny_pretrained, monkeypatch):
    import copy

    _, model, tok = tiny_pretrained
    model = copy.deepcopy(model)
    reward, prompts = make_reward("length", food.REWARDS), ["ravin likes ", "bob likes "]
    batch = collect(
        model,
        copy.deepcopy(model),
        tok,
        prompts,
        3,
        reward,
        torch.Generator().manual_seed(0),
        max_new_tokens=12,
        keep_ref_logits=True,
        old_logp=False,
    )
    calls = []
    spy(monkeypatch, "advantages", calls, module=adv_family)  # signal's
    cfg = GRPOConfig(group_size=3, max_new_tokens=12, **PRESETS["remax"])
    run = SimpleNamespace(**vars(fake_run(cfg, model)), tok=tok, reward=reward)
    want = []
    for p in prompts:
        text, finished = greedy_completion(model, tok, p, 12)
        assert finished
        want.append(reward(p, text))
    GRPO(run).update(batch, torch.optim.SGD(model.parameters(), lr=0.0))
    ((args, _, adv),) = calls
    assert args[2].tolist() == want, "the baseline is the reward of π_old's greedy completion"
    assert torch.allclose(adv, batch.rewards - torch.tensor(want).repeat_interleave(3)), (
        "A = r − r(greedy), no std"
    )


# ---- runs: the random-reward control, adaptive entropy, resume -----------------------------------


@pytest.mark.slow
def test_random_rewards_ignore_the_completions_and_reproduce_by_seed(
    tmp_path, tiny_pretrained, monkeypatch
):
    init, _, _ = tiny_pretrained
    calls = []
    spy(monkeypatch, "advantages", calls, module=adv_family)  # signal's
    draws, weights, sampled = {}, {}, {}
    for name, reward, seed in (
        ("pizza", "pizza", 0),
        ("length", "length", 0),
        ("again", "pizza", 0),
        ("seed1", "pizza", 1),
    ):
        calls.clear()
        out = tmp_path / name
        train(
            cfg_for(
                tmp_path, init, **PRESETS["random_reward"], reward=reward, seed=seed, out=str(out)
            ),
            **QUIET,
        )
        draws[name] = [args[0].tolist() for args, _, _ in calls]
        weights[name] = read_checkpoint(out / "model.pt")["model"]
        sampled[name] = [
            r["reward_mean"] for r in read_jsonl(out / "metrics.jsonl") if r["step"] > 0
        ]
    assert (
        all(x in (0.0, 1.0) for step in draws["pizza"] for x in step) and len(draws["pizza"]) == 3
    )
    assert sampled["pizza"] != sampled["length"], (
        "the real rewards differ (else the test could not fail)"
    )
    assert draws["pizza"] == draws["length"], (
        "the update's rewards do not depend on the reward or the completions"
    )
    assert all(torch.equal(weights["pizza"][k], weights["length"][k]) for k in weights["pizza"]), (
        "so the whole trajectory is the same whatever --reward says"
    )
    assert draws["again"] == draws["pizza"] and draws["seed1"] != draws["pizza"], "seeded by --seed"


def test_adaptive_entropy_coefficient_moves_toward_the_target_and_enters_the_loss(
    tmp_path, tiny_pretrained
):
    init, _, _ = tiny_pretrained
    base = dict(
        steps=4,
        preserve=False,
        beta=0.0,
        loss_agg="token-mean",
        entropy_step=0.01,
        entropy_coef_max=0.025,
    )
    # entropy below: c rises
    for name, target, c0, coefs in (
        ("below", 10.0, 0.0, [0.0, 0.01, 0.02, 0.025]),
        # entropy above: c falls
        ("above", 0.0, 0.02, [0.02, 0.01, 0.0, 0.0]),
    ):
        train(
            cfg_for(
                tmp_path,
                init,
                **base,
                entropy_target=target,
                entropy_coef=c0,
                out=str(tmp_path / name),
            ),
            **QUIET,
        )
        rows = [r for r in read_jsonl(tmp_path / name / "metrics.jsonl") if r["step"] > 0]
        assert [r["entropy_coef"] for r in rows] == pytest.approx(coefs)
        for r, nxt in zip(rows, rows[1:]):
            assert nxt["entropy_coef"] == pytest.approx(
                next_coef(r["entropy_coef"], r["entropy_rollout"], target, 0.01, 0.0, 0.025)
            )
        for r in rows:
            alpha = r["entropy_coef"] if r["entropy_rollout"] <= target else 0.0
            assert r["entropy_coef_applied"] == pytest.approx(alpha)
            assert r["loss"] - r["policy_loss"] == pytest.approx(-alpha * r["entropy"], abs=1e-6), (
                "the applied coefficient is the entropy bonus of the step's loss"
            )


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags",
    [
        {"random_reward": True},
        {
            "cov_control": "clip_cov",
            "cov_ratio": 0.2,
            "clip_cov_low": -100.0,
            "clip_cov_high": 100.0,
            "lr": 1e-2,
        },
        {"entropy_target": 10.0, "entropy_step": 0.01},
    ],
    ids=["random_reward", "clip_cov", "entropy_target"],
)
def test_resume_continues_the_second_waves_state_exactly(tmp_path, tiny_pretrained, flags):
    init, _, _ = tiny_pretrained
    train(cfg_for(tmp_path, init, **flags, steps=4, out=str(tmp_path / "straight")), **QUIET)
    train(cfg_for(tmp_path, init, **flags, steps=2, out=str(tmp_path / "split")), **QUIET)
    main(["--resume", str(tmp_path / "split"), "--steps", "4", "--quiet"])
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]
    a, b = (strip(read_jsonl(tmp_path / f / "metrics.jsonl")) for f in ("straight", "split"))
    assert a == b


# ---- presets and refusals ------------------------------------------------------------------------


def test_second_wave_presets_set_only_their_papers_flags():
    assert PRESETS["reinforce_rej"]["skip_equal_groups"] is True, (
        "REINFORCE-Rej reuses DAPO's filter flag"
    )
    assert PRESETS["entropy_8020"] == {"top_entropy": 0.2}
    assert PRESETS["random_reward"] == {"random_reward": True}
    assert PRESETS["sapo"]["sapo_tau_pos"] == 1.0 and PRESETS["sapo"]["sapo_tau_neg"] == 1.05
    assert PRESETS["gmpo"]["gmpo_eps"] == 0.4 and PRESETS["kl_cov"]["cov_ratio"] == 2e-4
    assert (PRESETS["clip_cov"]["clip_cov_low"], PRESETS["clip_cov"]["clip_cov_high"]) == (1.0, 5.0)
    for name in ("cispo", "gmpo", "sapo", "clip_cov", "kl_cov", "entropy_8020", "random_reward"):
        assert "beta" not in PRESETS[name] and "kl" not in PRESETS[name], (
            f"{name} keeps the run's KL term"
        )
    # no std division: the run's exact KL at a third of its weight
    for name in ("remax", "reinforce_rej"):
        assert PRESETS[name]["beta"] == 0.1 and "kl" not in PRESETS[name], name


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--cov-control", "clip_cov", "--policy-loss", "cispo"], "acts on --policy-loss ppo_clip"),
        (["--policy-loss", "gmpo", "--ratio", "sequence"], "belong to --policy-loss ppo_clip"),
        (["--kl", "k3+", "--kl-in", "reward"], "works only with --kl-in loss"),
        (
            ["--random-reward", "--baseline", "remax", "--adv-scale", "none"],
            "--random-reward replaces",
        ),
        (["--top-entropy", "0"], "--top-entropy must be"),
        (["--clip-cov-low", "6"], "is above --clip-cov-high"),
    ],
)
def test_meaningless_combinations_are_refused_with_one_line(tmp_path, capsys, argv, message):
    err = one_line_error(main, ["--out", str(tmp_path / "bad"), "--quiet", *argv], capsys)
    assert message in err, err
