"""Exact expected reward over an enumerable support (toy_tasks/support.py)."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minigrpo.lm.sampling import encode_prompts, generate, read_completions
from toy_tasks import food
from toy_tasks.rewards import make_reward
from toy_tasks.support import reward_figures, reward_table


def test_figures_equal_a_hand_computation():
    probs = torch.tensor([[0.5, 0.3, 0.1]], dtype=torch.float64)  # 0.1 off the support
    rewards = torch.tensor([[1.0, 2.0, 2.0]], dtype=torch.float64)
    f = reward_figures(probs, rewards)
    assert math.isclose(f["exact_reward"], 0.5 + 0.6 + 0.2)
    assert math.isclose(f["off_support"], 0.1) and f["best_reward"] == 2.0
    assert math.isclose(f["target_rate"], 0.4), "ties for the best reward count together"
    assert math.isclose(f["pass_at_8"], 1 - 0.6**8), (
        "exact pass@8 = 1 − (1 − P(a best completion))^8"
    )


def test_the_off_support_reward_is_the_lowest_probe_and_says_whether_the_probes_agree():
    prompts = [food.prompt("ravin"), food.prompt("jo")]
    graded = reward_table(
        make_reward("graded", food.REWARDS), prompts, food.support, food.OFF_SUPPORT_PROBES
    )
    assert graded.support.shape == (2, len(food.FOODS)) and graded.off_support.tolist() == [
        -1.0,
        -1.0,
    ]
    assert graded.off_constant
    length = reward_table(
        make_reward("length", food.REWARDS), prompts, food.support, ("", "pizzza")
    )
    assert length.off_support.tolist() == [0.0, 0.0] and not length.off_constant, (
        "r('') = 0 and r('pizzza') = 6 differ: the off-support value is then only a bound"
    )


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=2, max_size=6),
    st.lists(st.integers(-2, 2), min_size=6, max_size=6),
)
def test_figures_are_bounded_and_consistent(weights, rewards):
    k = len(weights)
    p = torch.tensor(weights, dtype=torch.float64)
    p = p / (p.sum() * 1.25) if p.sum() > 0 else p  # leave a fifth off the support
    r = torch.tensor(rewards[:k], dtype=torch.float64)
    f = reward_figures(p[None], r[None])
    assert 0 <= f["target_rate"] <= 1 - f["off_support"] + 1e-9
    assert (
        f["exact_reward"] <= f["best_reward"] * (1 - f["off_support"]) + 1e-9
        or f["best_reward"] < 0
    )
    assert r.min() * p.sum() - 1e-9 <= f["exact_reward"] <= r.max() * p.sum() + 1e-9


def test_a_custom_reward_has_the_same_exact_reward_as_the_named_food(tmp_path, tiny_pretrained):
    _, model, tok = tiny_pretrained
    user = tmp_path / "rare.py"
    user.write_text(
        "def apple(prompt, completion):\n    return 1.0 if completion == 'apple pie' else 0.0\n"
    )
    prompts = [food.prompt("ravin")]
    named = reward_table(make_reward("food:apple pie", food.REWARDS), prompts, food.support)
    custom = reward_table(make_reward(f"{user}:apple", food.REWARDS), prompts, food.support)
    assert torch.equal(named.support, custom.support) and torch.equal(
        named.off_support, custom.off_support
    )
    cfg = type("C", (), {"person": "ravin"})()
    ev = food.rl_evaluate(model, tok, food.rl_baseline(model, tok, cfg), cfg, custom)
    exact = food.exact_distribution(model, tok, "ravin")["apple pie"]
    assert math.isclose(ev["target_rate"], exact, rel_tol=1e-6) and math.isclose(
        ev["exact_reward"], exact, rel_tol=1e-6
    )
    assert ev["best_completions"] == ["apple pie"]


def test_exact_reward_matches_a_sampled_estimate(tiny_pretrained):
    """graded: 1 for pizza, 0 for another food, −1 malformed. E[r] = exact_reward − off_support (the
    reward is −1 everywhere off the support), which 4,000 samples must reproduce within 5 standard
    errors."""
    _, model, tok = tiny_pretrained
    reward = make_reward("graded", food.REWARDS)
    cfg = type("C", (), {"person": "ravin"})()
    table = reward_table(reward, [food.prompt("ravin")], food.support, food.OFF_SUPPORT_PROBES)
    assert table.off_support.tolist() == [-1.0] and table.off_constant
    ev = food.rl_evaluate(model, tok, food.rl_baseline(model, tok, cfg), cfg, table)
    exact = ev["exact_reward"] - ev["off_support"]
    assert math.isclose(ev["expected_reward"], exact, abs_tol=1e-9), (
        "E[r] over the 13 outcomes counts malformed as −1"
    )
    ids, mask = encode_prompts(tok, [food.prompt("ravin")] * 4000, "cpu")
    gen = generate(model, ids, mask, max_new_tokens=24, generator=torch.Generator().manual_seed(0))
    r = torch.tensor(
        [reward("", c) if done else -1.0 for c, done in zip(*read_completions(tok, [gen])[0])]
    )
    se = r.std().item() / math.sqrt(len(r))
    assert abs(r.mean().item() - exact) < 5 * se, (r.mean().item(), exact, se)
