"""PPO's critic objects (minigrpo/rl/critics.py), one at a time on a real rollout."""

import copy
import dataclasses
from types import SimpleNamespace

import pytest
import torch
from oracle_values import prefix_values

from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.lm.model import Weights
from minigrpo.lm.prefix_tree import next_token_tree
from minigrpo.objectives.losses import aggregate, value_loss
from minigrpo.objectives.ppo_objective import ppo_objective
from minigrpo.ppo import PPO, PPOConfig
from minigrpo.rl.config import parse_rl_config
from minigrpo.rl.critics import (
    CRITICS,
    HeadCritic,
    OracleCritic,
    SeparateCritic,
    exact_values,
    head_values,
)
from minigrpo.rl.loop import Run
from minigrpo.rl.rollout import collect
from minigrpo.util.cli import UsageError
from toy_tasks import food
from toy_tasks.rewards import make_reward


def fit(critic, batch, old_values, returns, clip):
    """A learned critic's value loss on a rollout as PPO's objective computes it
    (objectives/ppo_objective.py; its policy terms zero here) -> (the value loss, the values)."""
    values, mask = critic.values(batch), batch.mask
    zero = torch.zeros(mask.shape)
    cfg = SimpleNamespace(clip=0.2, entropy_coef=0.0, vf_clip=clip, vf_coef=1.0)
    logits = torch.zeros(*mask.shape, 5)
    loss, figures = ppo_objective(
        zero, zero, zero, logits, logits, mask, cfg, values, old_values, returns
    )
    assert torch.equal(loss, figures["value_loss"])  # nothing but the value loss
    return loss, values


def setup(tmp_path, init, tok, critic, name="r"):
    """A Run (preservation off), the named critic with a non-zero head, and a rollout of 6
    completions."""
    run = Run(
        PPOConfig(
            init=str(init), out=str(tmp_path / name), quiet=True, preserve=False, critic=critic
        ),
        "ppo",
    )
    c = CRITICS[critic](run)
    if c.head is not None:
        with torch.no_grad():
            c.head.linear.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(0))
            c.head.linear.bias.fill_(0.1)
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
    return run, c, batch


def test_the_table_names_the_three_critics_and_the_flag_takes_its_names():
    assert CRITICS == {"separate": SeparateCritic, "head": HeadCritic, "oracle": OracleCritic}
    field = {f.name: f for f in dataclasses.fields(PPOConfig)}["critic"]
    assert field.metadata["choices"] == sorted(CRITICS) and field.default in CRITICS
    assert parse_rl_config(PPOConfig, ["--critic", "oracle"], "", "ppo").critic == "oracle"
    with pytest.raises(
        UsageError, match="invalid choice: 'vine' \\(choose from 'head', 'oracle', 'separate'\\)"
    ):
        parse_rl_config(PPOConfig, ["--critic", "vine"], "", "ppo")


def test_the_oracle_has_no_parameters_no_value_loss_and_the_exact_values(tmp_path, tiny_pretrained):
    init, _, tok = tiny_pretrained
    run, c, batch = setup(tmp_path, init, tok, "oracle")
    assert c.parameters() == [] and not c.learned
    assert c.state_dict() == {"value_head": None, "critic_trunk": None}
    want = prefix_values(
        run.policy,
        tok,
        batch.prompts,
        batch.gen.completion_ids,
        batch.mask,
        run.prompts,
        run.task.support,
        run.rewards,
    )
    got = c.values(batch)
    # the slow oracle's values (tests/oracle_values.py), to rounding; 0 where masked
    assert torch.allclose(got, want, atol=1e-6) and (got[~batch.mask] == 0).all()
    assert got[batch.mask].abs().sum() > 0
    tree = c.tree  # the support's value tree, made at the first call and kept
    assert tree is not None and torch.equal(c.values(batch), got) and c.tree is tree
    assert [id(p) for p in PPO(run).parameters()] == [id(p) for p in run.policy.parameters()]


@pytest.mark.parametrize("critic", ["head", "separate"])
def test_learned_values_are_the_head_on_the_right_trunk_and_zero_where_masked(
    tmp_path, tiny_pretrained, critic
):
    init, _, tok = tiny_pretrained
    run, c, batch = setup(tmp_path, init, tok, critic, name=critic)
    assert c.learned
    if critic == "separate":
        with torch.no_grad():  # the critic's trunk now differs from the policy's
            for p in c.trunk.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    trunk = run.policy if critic == "head" else c.trunk
    with torch.no_grad():
        _, hidden = generation_logprobs(trunk, batch.gen, return_hidden=True)
        values = c.values(batch)
    mask = batch.mask
    assert values.shape == mask.shape and (values[~mask] == 0).all() and values[mask].std() > 0
    assert torch.allclose(values[mask], c.head(hidden)[mask], atol=1e-6)
    with torch.no_grad():
        _, policy_hidden = generation_logprobs(run.policy, batch.gen, return_hidden=True)
        given = c.values(batch, policy_hidden)
    if critic == "head":  # the policy's hidden states, when given, are used as they are
        assert torch.equal(given, values)
    else:  # ignored: the separate critic runs its own trunk
        assert torch.equal(given, values) and not torch.allclose(
            given[mask], c.head(policy_hidden)[mask]
        )


def test_the_head_critics_value_loss_reaches_the_policys_trunk(tmp_path, tiny_pretrained):
    init, _, tok = tiny_pretrained
    run, c, batch = setup(tmp_path, init, tok, "head")
    policy_ids = {id(p) for p in run.policy.parameters()}
    assert [id(p) for p in c.parameters()] == [id(p) for p in c.head.parameters()]
    assert not policy_ids & {id(p) for p in c.parameters()}, (
        "the policy's weights are the optimiser's once"
    )
    returns = torch.where(batch.mask, 1.0, 0.0)
    vl, values = fit(c, batch, torch.zeros(batch.mask.shape), returns, None)
    vl.backward()
    grads = [p.grad for p in run.policy.parameters()]
    assert sum(g.abs().sum().item() for g in grads if g is not None) > 0, (
        "a shared trunk: V's gradient reaches it"
    )
    assert c.head.linear.weight.grad.abs().sum() > 0


def test_the_separate_critic_never_touches_the_policy(tmp_path, tiny_pretrained):
    init, _, tok = tiny_pretrained
    run, c, batch = setup(tmp_path, init, tok, "separate")
    policy_ids = {id(p) for p in run.policy.parameters()}
    mine = c.parameters()
    assert not policy_ids & {id(p) for p in mine}
    assert len(mine) == len(list(c.head.parameters())) + len(list(run.policy.parameters()))
    before = {k: v.clone() for k, v in run.policy.state_dict().items()}
    returns = torch.where(batch.mask, 1.0, 0.0)
    vl, _ = fit(c, batch, torch.zeros(batch.mask.shape), returns, 0.2)
    vl.backward()
    assert all(p.grad is None for p in run.policy.parameters()), "no gradient flows into the policy"
    assert sum(p.grad.abs().sum().item() for p in c.trunk.parameters() if p.grad is not None) > 0
    torch.optim.SGD(mine, lr=0.1).step()
    assert all(torch.equal(v, run.policy.state_dict()[k]) for k, v in before.items()), (
        "the policy's weights moved"
    )


def test_the_value_loss_is_the_token_mean_of_the_clipped_squared_error(tmp_path, tiny_pretrained):
    init, _, tok = tiny_pretrained
    run, c, batch = setup(tmp_path, init, tok, "head")
    mask = batch.mask
    g = torch.Generator().manual_seed(2)
    old = torch.where(mask, torch.randn(mask.shape, generator=g), 0.0)
    returns = torch.where(mask, torch.randn(mask.shape, generator=g), 0.0)
    for clip in (None, 0.05):
        vl, values = fit(c, batch, old, returns, clip)
        v, o, r = values[mask].detach().double(), old[mask].double(), returns[mask].double()
        err = (v - r) ** 2
        if clip is not None:
            err = torch.maximum(err, (o + (v - o).clamp(-clip, clip) - r) ** 2)
        assert vl.item() == pytest.approx((0.5 * err).mean().item(), rel=1e-5)
        assert vl.item() == pytest.approx(
            aggregate(value_loss(values, old, returns, mask, clip), mask, "token-mean").item(),
            rel=1e-6,
        )
    assert fit(c, batch, old, returns, 0.05)[0].item() > fit(c, batch, old, returns, None)[0].item()


@pytest.mark.parametrize("critic", ["head", "separate"])
def test_the_state_dict_round_trips_into_a_fresh_critic(tmp_path, tiny_pretrained, critic):
    init, _, tok = tiny_pretrained
    run, c, batch = setup(tmp_path, init, tok, critic, name=critic)
    if c.trunk is not None:
        with torch.no_grad():
            for p in c.trunk.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    state = c.state_dict()
    assert set(state) == {"value_head", "critic_trunk"} and (state["critic_trunk"] is None) == (
        critic == "head"
    )
    fresh = CRITICS[critic](run)
    with torch.no_grad():
        assert not torch.equal(fresh.values(batch), c.values(batch))
        fresh.load_state_dict(state)
        assert torch.equal(fresh.values(batch), c.values(batch))
    algo = PPO(run)
    algo.critic, algo.beta = c, 0.123
    saved = algo.state_dict()
    assert set(saved) == {"value_head", "beta", "critic_trunk"}, (
        "the checkpoint keys PPO has always written"
    )
    other = PPO(run)
    other.load_state_dict(saved)
    assert other.beta == 0.123
    with torch.no_grad():
        assert torch.equal(other.critic.values(batch), c.values(batch))


def test_values_over_stacked_weights_are_each_models_alone(tmp_path, tiny_pretrained):
    """rl/critics' value functions take M models' weights stacked (a population's members): each
    model's values are its own critic's alone, to rounding; the oracle's under each model's β."""
    init, _, tok = tiny_pretrained
    run, a, batch = setup(tmp_path, init, tok, "separate")
    b = SeparateCritic(run)
    oracles = [OracleCritic(run), OracleCritic(run)]
    policies = [run.policy, copy.deepcopy(run.policy)]
    with torch.no_grad():
        for p in [*b.named_weights().values(), *policies[1].parameters()]:
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(4)))
    stack = lambda named: Weights(
        run.policy.cfg, {k: torch.stack([n[k] for n in named]) for k in named[0]}
    )
    grow = lambda x: torch.stack([x, x])
    gen = batch.gen
    rows = SimpleNamespace(
        ids=grow(gen.ids), key_mask=grow(gen.key_mask), prompt_len=gen.prompt_len,
        completion_mask=grow(gen.completion_mask),
        prefix_tree=lambda: next_token_tree(grow(gen.ids), grow(gen.key_mask)),
    )  # fmt: skip
    with torch.no_grad():
        w = stack([a.named_weights(), b.named_weights()])
        got = head_values(w.w["head.weight"], w.w["head.bias"], rows, trunk=w)
        assert torch.allclose(got, torch.stack([a.values(batch), b.values(batch)]), atol=1e-5)
        betas = [0.0, 0.1]
        want = []
        for o, policy, beta in zip(oracles, policies, betas):
            run.policy, o.beta = policy, beta
            want.append(o.values(batch))
        index = torch.tensor([[oracles[0].place[x] for x in batch.prompts]] * 2)
        policy = stack([dict(p.named_parameters()) for p in policies])
        ref = stack([dict(run.ref.named_parameters())] * 2)
        got = exact_values(
            oracles[0].tree, policy, ref, betas, run.cfg.temperature, index,
            grow(gen.completion_ids), rows.completion_mask,
        )  # fmt: skip
        assert torch.allclose(got, torch.stack(want), atol=1e-5)
    # a member's checkpoint state from its weights by name is its critic's own
    state = b.state_dict(b.named_weights())
    assert all(torch.equal(state[k][n], t) for k, s in b.state_dict().items() for n, t in s.items())
