import copy
import json
import math

import pytest
import torch
from conftest import naive_gae
from oracle_values import prefix_values, values_at

from minigrpo.lm.checkpoint import read_checkpoint
from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.objectives.advantages import explained_variance, gae
from minigrpo.ppo import PPO, PPOConfig, main, train
from minigrpo.rl.config import parse_rl_config
from minigrpo.rl.loop import Run
from minigrpo.rl.rollout import collect
from minigrpo.util.jsonl import read_jsonl
from toy_tasks import food
from toy_tasks.rewards import make_reward


def test_ppo_gae_on_a_real_rollout_equals_the_naive_loop(tmp_path, tiny_pretrained):
    init, model, tok = tiny_pretrained
    run = Run(
        PPOConfig(init=str(init), out=str(tmp_path / "r"), quiet=True, preserve=False, beta=0.1),
        "ppo",
    )
    algo = PPO(run)
    torch.nn.init.normal_(algo.critic.head.linear.weight, std=0.5)  # non-trivial values
    batch = collect(
        run.policy,
        run.ref,
        tok,
        ["ravin likes "],
        6,
        make_reward("pizza", food.REWARDS),
        torch.Generator().manual_seed(0),
        old_logp=True,
        keep_ref_logits=True,
    )
    run.policy.load_state_dict(
        {k: v + 0.01 * torch.randn_like(v) for k, v in run.policy.state_dict().items()}
    )
    # a KL penalty that is not 0
    batch.old_logp = batch.old_logp + 0.05 * torch.randn_like(batch.old_logp)
    with torch.no_grad():
        values = algo.critic.values(batch)
    rewards, _ = algo.token_rewards(batch)
    mask = batch.mask
    adv, ret = gae(rewards, torch.where(mask, values, 0.0), mask, 1.0, 0.95)
    assert torch.allclose(
        adv.double(), naive_gae(rewards, values, mask.sum(1).tolist(), 1.0, 0.95), atol=1e-5
    )
    # the scalar reward sits on the last valid token, the KL penalty on every valid token
    last = mask.sum(1) - 1
    kl = torch.where(mask, batch.old_logp - batch.ref_logp, 0.0)
    expected_last = -0.1 * kl.gather(1, last[:, None]).squeeze(1) + batch.rewards
    assert torch.allclose(rewards.gather(1, last[:, None]).squeeze(1), expected_last, atol=1e-6)
    assert (rewards[~mask] == 0).all()


def test_value_targets_and_explained_variance_on_a_hand_example():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.5, 0.5]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    # λ = γ = 1: the return is the reward-to-go
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0]]))
    assert torch.allclose(adv, torch.tensor([[0.5, 0.5, 0.5]]))
    returns = torch.tensor([[0.0, 1.0, 2.0]])
    # a constant critic explains nothing
    assert abs(explained_variance(values, returns, mask).item()) < 1e-6
    assert explained_variance(returns, returns, mask).item() == 1.0
    # residuals [0, 0, 1]: Var 2/9 against Var[R] 2/3 -> 1 - 1/3
    assert (
        abs(explained_variance(torch.tensor([[0.0, 1.0, 1.0]]), returns, mask).item() - 2 / 3)
        < 1e-6
    )


def test_ppo_runs_three_steps_with_both_critics(tmp_path, tiny_pretrained):
    init, model, _ = tiny_pretrained
    for critic in ("separate", "head"):
        cfg = PPOConfig(
            init=str(init),
            out=str(tmp_path / critic),
            steps=3,
            prompts_per_step=2,
            group_size=4,
            quiet=True,
            eval_every=1,
            preserve_per_prompt=2,
            preserve_batch=8,
            critic=critic,
            plot=False,  # drawn by the ppo command's run below (vf_clip none)
        )
        s = train(cfg, log=lambda *a: None)
        assert s["step"] == 3 and 0 <= s["target_rate"] <= 1
        rows = [r for r in read_jsonl(tmp_path / critic / "metrics.jsonl") if "value_loss" in r]
        assert len(rows) == 3 and all("explained_variance" in r and "approx_kl" in r for r in rows)
        assert all(-1e6 < r["explained_variance_oracle"] <= 1 for r in rows), (
            "scored against the exact values"
        )


# ---- single updates by hand ----------------------------------------------------------------------


def ppo_setup(tmp_path, init, tok, name="r", **kw):
    """A real Run (preservation off) and PPO with a non-trivial critic, and a rollout of 6
    completions whose π_old log-probs are moved away from the policy's (so the ratio is not 1 and
    the KL penalty not 0)."""
    cfg = PPOConfig(
        **{
            "init": str(init),
            "out": str(tmp_path / name),
            "quiet": True,
            "preserve": False,
            "beta": 0.1,
            "epochs": 1,
            "minibatches": 1,
            "grad_clip": 0.0,
            **kw,
        }
    )
    run = Run(cfg, "ppo")
    algo = PPO(run)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        if algo.critic.head is not None:  # a learned critic
            algo.critic.head.linear.weight.normal_(0.0, 0.5, generator=g)
            algo.critic.head.linear.bias.fill_(0.1)
        # the critic's trunk differs from the policy's from here on
        if algo.critic.trunk is not None:
            for p in algo.critic.trunk.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=g))
    batch = collect(
        run.policy,
        run.ref,
        tok,
        ["ravin likes "],
        6,
        make_reward("pizza", food.REWARDS),
        torch.Generator().manual_seed(0),
        old_logp=True,
        keep_ref_logits=True,
    )
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    return run, algo, batch


def test_one_minibatch_update_equals_a_hand_computation(tmp_path, tiny_pretrained):
    init, _, tok = tiny_pretrained
    beta, clip, vf_coef, ent_coef, lam = 0.1, 0.2, 0.5, 0.01, 0.95
    run, algo, batch = ppo_setup(
        tmp_path, init, tok, beta=beta, clip=clip, vf_coef=vf_coef, entropy_coef=ent_coef, lam=lam
    )
    mask = batch.mask
    logp = batch.old_logp.clone()  # log π_θ of the sampled tokens: this policy sampled them
    noise = 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
    batch.old_logp = torch.where(mask, logp + noise, 0.0)
    with torch.no_grad():
        _, hidden = generation_logprobs(algo.critic.trunk, batch.gen, return_hidden=True)
        V = algo.critic.head(hidden)
        _, logits = generation_logprobs(run.policy, batch.gen, return_logits=True)
    N, T = mask.shape
    lengths = [int(mask[i].sum()) for i in range(N)]
    valid = [(i, t) for i in range(N) for t in range(lengths[i])]
    old = lambda i, t: batch.old_logp[i, t].item()
    # per-token rewards: −β·(log π_old − log π_ref) everywhere, the scalar reward on the last token
    r = torch.zeros(N, T, dtype=torch.float64)
    for i, t in valid:
        r[i, t] = -beta * (old(i, t) - batch.ref_logp[i, t].item()) + (
            batch.rewards[i].item() if t == lengths[i] - 1 else 0
        )
    a_raw = naive_gae(r, V, lengths, 1.0, lam)
    mean = sum(a_raw[i, t].item() for i, t in valid) / len(valid)
    # population std
    std = math.sqrt(sum((a_raw[i, t].item() - mean) ** 2 for i, t in valid) / len(valid))
    pg = vl = ent = 0.0
    clipped = 0
    for i, t in valid:
        a = (a_raw[i, t].item() - mean) / std
        rho = math.exp(logp[i, t].item() - old(i, t))
        pg += -min(rho * a, min(max(rho, 1 - clip), 1 + clip) * a)
        clipped += (a > 0 and rho > 1 + clip) or (a < 0 and rho < 1 - clip)
        # the value target: GAE advantage (not whitened) + V
        ret = a_raw[i, t].item() + V[i, t].item()
        vl += 0.5 * (V[i, t].item() - ret) ** 2  # V = V_old at the only update: the clip cannot act
        p = torch.softmax(logits[i, t].double(), -1).tolist()
        ent += -sum(q * math.log(q) for q in p if q > 0)
    pg, vl, ent = pg / len(valid), vl / len(valid), ent / len(valid)
    kl_seq = (
        sum(
            sum(old(i, t) - batch.ref_logp[i, t].item() for t in range(lengths[i]))
            for i in range(N)
        )
        / N
    )
    stats = algo.update(batch, torch.optim.SGD(algo.parameters(), lr=0.0))
    assert clipped > 0 and stats["clip_frac_low"] + stats["clip_frac_high"] == pytest.approx(
        clipped / len(valid)
    )
    assert stats["policy_loss"] == pytest.approx(pg, abs=1e-5)
    assert stats["value_loss"] == pytest.approx(vl, abs=1e-5)
    assert stats["entropy"] == pytest.approx(ent, abs=1e-5)
    assert stats["loss"] == pytest.approx(pg + vf_coef * vl - ent_coef * ent, abs=1e-5)
    assert stats["kl_k1_seq"] == pytest.approx(kl_seq, abs=1e-5)
    assert stats["beta"] == beta, "without --kl-target β is fixed"


def test_the_oracle_critic_has_no_parameters_and_no_value_loss(tmp_path, tiny_pretrained):
    init, _, tok = tiny_pretrained
    run, algo, batch = ppo_setup(tmp_path, init, tok, critic="oracle", epochs=2, minibatches=2)
    assert [id(p) for p in algo.parameters()] == [id(p) for p in run.policy.parameters()]
    state = algo.state_dict()
    assert state["value_head"] is None and state["critic_trunk"] is None
    algo.beta = 0.3
    algo.load_state_dict(state)
    assert algo.beta == 0.1
    stats = algo.update(batch, torch.optim.SGD(algo.parameters(), lr=1e-3))
    assert not {"value_loss", "value_clip_frac", "explained_variance_oracle"} & set(stats)
    assert stats["loss"] == pytest.approx(stats["policy_loss"], abs=1e-6), (
        "no value loss (no entropy bonus, no anchor)"
    )
    out = tmp_path / "oracle-run"
    s = train(
        PPOConfig(
            init=str(init),
            out=str(out),
            steps=2,
            prompts_per_step=2,
            group_size=4,
            quiet=True,
            goal=0.0,
            preserve_per_prompt=2,
            preserve_batch=8,
            critic="oracle",
            plot=False,  # no metrics.png: drawing it is most of a short run's time
        ),
        log=lambda *a: None,
    )
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "policy_loss" in r]
    assert s["step"] == 2 and len(rows) == 2 and not any("value_loss" in r for r in rows)


def test_the_oracle_advantage_at_the_first_token_is_the_reward_minus_the_exact_value(
    tmp_path, tiny_pretrained
):
    """λ = γ = 1 and β = 0: A_0 = r − V(empty prefix); every A_t = r − V(the row's first t
    characters)."""
    init, _, tok = tiny_pretrained
    run, algo, batch = ppo_setup(tmp_path, init, tok, critic="oracle", beta=0.0, lam=1.0, gamma=1.0)
    old_values, adv, returns, _ = algo.advantages(batch)
    v0 = values_at(
        run.policy, tok, [("ravin likes ", "")], run.prompts, run.task.support, run.rewards
    )
    assert torch.allclose(adv[:, 0].double(), batch.rewards.double() - v0, atol=1e-6)
    mask = batch.mask
    exact = prefix_values(
        run.policy,
        tok,
        batch.prompts,
        batch.gen.completion_ids,
        mask,
        run.prompts,
        run.task.support,
        run.rewards,
    )
    assert torch.allclose(old_values, exact, atol=1e-6)  # the slow oracle's, to rounding
    assert torch.allclose(adv, torch.where(mask, batch.rewards[:, None] - exact, 0.0), atol=1e-6)
    assert torch.allclose(returns, torch.where(mask, batch.rewards[:, None], 0.0), atol=1e-6)


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_the_oracle_values_the_kl_penalty_still_to_come(tmp_path, tiny_pretrained, beta):
    """λ = γ = 1, β > 0: A_t = r − β·Σ_{j≥t} k1_j − V_β(s_t), V_β the exact value of the penalised
    return at the run's current β (a value of the task reward alone would leave the expected penalty
    still to come in A_t)."""
    init, _, tok = tiny_pretrained
    run, algo, batch = ppo_setup(
        tmp_path, init, tok, critic="oracle", beta=beta, lam=1.0, gamma=1.0
    )
    with torch.no_grad():  # π_ref away from the policy, so the penalty still to come is not 0
        for p in run.ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    old_values, adv, _, _ = algo.advantages(batch)
    mask = batch.mask
    v = prefix_values(
        run.policy,
        tok,
        batch.prompts,
        batch.gen.completion_ids,
        mask,
        run.prompts,
        run.task.support,
        run.rewards,
        1.0,
        run.ref,
        beta,
    )
    assert torch.allclose(old_values, v, atol=1e-6)
    k1 = torch.where(mask, batch.old_logp - batch.ref_logp, 0.0)
    to_come = k1.flip(1).cumsum(1).flip(1)  # Σ_{j≥t} k1_j
    assert torch.allclose(
        adv, torch.where(mask, batch.rewards[:, None] - beta * to_come - v, 0.0), atol=1e-5
    )
    task_only = prefix_values(
        run.policy,
        tok,
        batch.prompts,
        batch.gen.completion_ids,
        mask,
        run.prompts,
        run.task.support,
        run.rewards,
    )
    assert not torch.allclose(old_values, task_only, atol=1e-4)


def test_a_learned_critic_is_scored_against_the_exact_values(tmp_path, tiny_pretrained):
    init, _, tok = tiny_pretrained
    run, algo, batch = ppo_setup(tmp_path, init, tok)
    # lr 0: the critic is unchanged
    stats = algo.update(batch, torch.optim.SGD(algo.parameters(), lr=0.0))
    with torch.no_grad():
        critic = algo.critic.values(batch)
    exact = prefix_values(
        run.policy,
        tok,
        batch.prompts,
        batch.gen.completion_ids,
        batch.mask,
        run.prompts,
        # PPO's return: β's penalty in
        run.task.support,
        run.rewards,
        1.0,
        run.ref,
        algo.beta,
    )
    want = explained_variance(critic, exact, batch.mask).item()
    assert stats["explained_variance_oracle"] == pytest.approx(want, abs=1e-5) and want < 0.9


def test_adaptive_beta_grows_above_the_kl_target_and_shrinks_below(tmp_path, tiny_pretrained):
    init, _, tok = tiny_pretrained
    beta0, results = 0.1, {}
    for factor in (None, 0.1, 0.9, 1.1, 10.0):  # target = factor × the batch's KL per sequence
        run, algo, batch = ppo_setup(tmp_path, init, tok, name=f"b{factor}", beta=beta0)
        batch.old_logp = torch.where(batch.mask, batch.ref_logp + 0.5, 0.0)  # k1 = 0.5 per token
        kl = 0.5 * batch.mask.sum(1).double().mean().item()
        algo.cfg.kl_target = None if factor is None else factor * kl
        stats = algo.update(batch, torch.optim.SGD(algo.parameters(), lr=0.0))
        assert stats["kl_k1_seq"] == pytest.approx(kl, rel=1e-5) and stats["beta"] == algo.beta
        results[factor] = algo.beta
        N = batch.mask.size(0)
        assert abs(algo.beta / beta0 - 1) <= 0.2 * N / 1000 + 1e-12, (
            "one step moves β by at most 20 % · N/1000"
        )
    assert results[None] == beta0
    assert results[0.1] > results[0.9] > beta0 > results[1.1] > results[10.0], (
        "β must grow when the KL is above the target (more the further), shrink below it: "
        f"{results}"
    )


def test_entropy_bonus_pushes_the_policy_towards_higher_entropy(tmp_path, tiny_pretrained):
    init, _, tok = tiny_pretrained
    coef, grads = 0.5, {}
    for c in (0.0, coef):
        run, algo, batch = ppo_setup(tmp_path, init, tok, name=f"e{c}", entropy_coef=c)
        algo.update(batch, torch.optim.SGD(algo.parameters(), lr=0.0))
        grads[c] = [p.grad.clone() for p in run.policy.parameters()]
    # ∇ of the token-mean entropy, by hand from the logits
    policy = copy.deepcopy(run.policy)
    _, logits = generation_logprobs(policy, batch.gen, return_logits=True)
    lp = torch.log_softmax(logits, -1)
    h = -(lp.exp() * lp).sum(-1)
    (torch.where(batch.mask, h, 0.0).sum() / batch.mask.sum()).backward()
    g_h = [p.grad for p in policy.parameters()]
    diff = [a - b for a, b in zip(grads[coef], grads[0.0])]
    for d, gh in zip(diff, g_h):
        assert torch.allclose(d, -coef * gh, atol=1e-6), (
            "the bonus must add −c·∇H to the policy's gradient"
        )
    assert sum((-d * gh).sum().item() for d, gh in zip(diff, g_h)) > 0, (
        "a descent step must raise the entropy"
    )


# ---- runs ---------------------------------------------------------------------------------------

TIME_KEYS = {"step_time", "tokens_per_s"}


@pytest.mark.parametrize("critic", ["separate", pytest.param("oracle", marks=pytest.mark.slow)])
def test_ppo_resume_reproduces_the_uninterrupted_metrics_and_weights(
    tmp_path, tiny_pretrained, critic
):
    init, _, _ = tiny_pretrained
    base = dict(
        init=str(init),
        critic=critic,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=12,
        quiet=True,
        eval_every=1,
        ckpt_every=2,
        preserve_per_prompt=2,
        preserve_batch=8,
        goal=0.0,
        kl_target=0.5,  # β adapts: state
        epochs=1,
        minibatches=2,
        plot=False,  # no metrics.png: drawing it is most of a short run's time
    )  # two minibatches: the shuffle generator's state matters
    train(PPOConfig(**base, steps=3, out=str(tmp_path / "straight")), log=lambda *a: None)
    train(PPOConfig(**base, steps=1, out=str(tmp_path / "split")), log=lambda *a: None)
    main(["--resume", str(tmp_path / "split"), "--steps", "3", "--quiet"])
    a = read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    b = read_jsonl(tmp_path / "split" / "metrics.jsonl")
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]
    assert [r["step"] for r in b] == [0, 1, 2, 3]
    assert len({r["beta"] for r in b if "beta" in r}) == 3, (
        "β must change every step (else its state is untested)"
    )
    assert strip(a) == strip(b)
    sa, sb = (
        read_checkpoint(tmp_path / "straight" / "model.pt"),
        read_checkpoint(tmp_path / "split" / "model.pt"),
    )
    assert all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])
    ca, cb = sa["extra"]["rl"]["algo_state"], sb["extra"]["rl"]["algo_state"]
    assert ca["beta"] == cb["beta"]
    for part in ("value_head", "critic_trunk"):
        assert (ca[part] is None) == (cb[part] is None) == (critic == "oracle")
        assert ca[part] is None or all(torch.equal(ca[part][k], cb[part][k]) for k in ca[part]), (
            f"{part} differs after resume"
        )


@pytest.mark.parametrize("text", ["none", "None", "NONE"])
def test_vf_clip_none_parses_to_none(text):
    cfg = parse_rl_config(PPOConfig, ["--vf-clip", text], "", "ppo")
    assert cfg.vf_clip is None
    assert parse_rl_config(PPOConfig, [], "", "ppo").vf_clip == 0.2
    assert (
        parse_rl_config(PPOConfig, ["--vf-clip", "0.3", "--kl-target", text], "", "ppo").vf_clip
        == 0.3
    )


def test_optional_number_flags_still_refuse_other_words(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--vf-clip", "off", "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and "invalid float value: 'off'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        # a plain int flag has no None to go back to
        main(["--steps", "none", "--out", str(tmp_path / "x")])
    assert "invalid int value: 'none'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_with_vf_clip_none_trains_with_the_unclipped_value_loss(tmp_path, tiny_pretrained):
    init, _, _ = tiny_pretrained
    out = tmp_path / "noclip"
    main(
        [
            "--init",
            str(init),
            "--out",
            str(out),
            "--vf-clip",
            "none",
            "--steps",
            "2",
            "--goal",
            "0",
            "--quiet",
            "--prompts-per-step",
            "2",
            "--group-size",
            "4",
            "--preserve-per-prompt",
            "2",
            "--preserve-batch",
            "8",
        ]
    )
    assert json.loads((out / "config.json").read_text())["vf_clip"] is None
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "value_loss" in r]
    assert len(rows) == 2 and all(r["value_clip_frac"] == 0 for r in rows)
