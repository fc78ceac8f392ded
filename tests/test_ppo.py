import torch

from minigrpo.advantages import explained_variance, gae
from minigrpo.metrics import read_jsonl
from minigrpo.ppo import PPO, PPOConfig, train
from minigrpo.rewards import make_reward
from minigrpo.rl import Run
from minigrpo.rollout import collect
from toy_tasks import food


def naive_gae(rewards, values, mask, gamma, lam):
    B, T = rewards.shape
    adv = torch.zeros(B, T)
    for b in range(B):
        n = int(mask[b].sum())
        last = 0.0
        for t in reversed(range(n)):
            v_next = values[b, t + 1].item() if t + 1 < n else 0.0
            delta = rewards[b, t].item() + gamma * v_next - values[b, t].item()
            last = delta + gamma * lam * last
            adv[b, t] = last
    return adv


def test_ppo_gae_on_a_real_rollout_equals_the_naive_loop(tmp_path, tiny_pretrained):
    init, model, tok = tiny_pretrained
    run = Run(PPOConfig(init=str(init), out=str(tmp_path / "r"), quiet=True, preserve=False, beta=0.1), "ppo")
    algo = PPO(run)
    torch.nn.init.normal_(algo.value_head.linear.weight, std=0.5)  # non-trivial values
    batch = collect(run.policy, run.ref, tok, ["ravin likes "], 6, make_reward("pizza", food.REWARDS),
                    torch.Generator().manual_seed(0), old_logp=True, keep_ref_logits=True)
    run.policy.load_state_dict({k: v + 0.01 * torch.randn_like(v) for k, v in run.policy.state_dict().items()})
    batch.old_logp = batch.old_logp + 0.05 * torch.randn_like(batch.old_logp)  # a KL penalty that is not 0
    with torch.no_grad():
        _, _, values = algo.forward(batch.gen)
    rewards, _ = algo.token_rewards(batch)
    mask = batch.mask
    adv, ret = gae(rewards, torch.where(mask, values, 0.0), mask, 1.0, 0.95)
    assert torch.allclose(adv, naive_gae(rewards, values, mask, 1.0, 0.95), atol=1e-5)
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
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0]]))  # λ = γ = 1: the return is the reward-to-go
    assert torch.allclose(adv, torch.tensor([[0.5, 0.5, 0.5]]))
    returns = torch.tensor([[0.0, 1.0, 2.0]])
    assert abs(explained_variance(values, returns, mask).item()) < 1e-6  # a constant critic explains nothing
    assert explained_variance(returns, returns, mask).item() == 1.0
    # residuals [0, 0, 1]: Var 2/9 against Var[R] 2/3 -> 1 - 1/3
    assert abs(explained_variance(torch.tensor([[0.0, 1.0, 1.0]]), returns, mask).item() - 2 / 3) < 1e-6


def test_ppo_runs_three_steps_with_both_critics(tmp_path, tiny_pretrained):
    init, model, _ = tiny_pretrained
    for critic in ("separate", "head"):
        cfg = PPOConfig(init=str(init), out=str(tmp_path / critic), steps=3, prompts_per_step=2, group_size=4, quiet=True,
                        eval_every=1, preserve_per_prompt=2, preserve_batch=8, critic=critic)
        s = train(cfg, log=lambda *a: None)
        assert s["step"] == 3 and 0 <= s["target_rate"] <= 1
        rows = [r for r in read_jsonl(tmp_path / critic / "metrics.jsonl") if "value_loss" in r]
        assert len(rows) == 3 and all("explained_variance" in r and "approx_kl" in r for r in rows)
