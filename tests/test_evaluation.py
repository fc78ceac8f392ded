"""A lockstep population's exact evaluation (minigrpo/population/evaluation.py): the task's
rl_evaluate_many of the members' weights stacked (lm/logprobs.completion_logprobs scores them
in one forward) gives each member what its own GPT gives, and every member's GPT takes its weights
from the stack after an update."""

import math
from types import SimpleNamespace

import pytest
import torch

from minigrpo.lm.logprobs import completion_logprobs
from minigrpo.lm.model import GPT, GPTConfig
from minigrpo.lm.tokenizer import CharTokenizer
from minigrpo.population.evaluation import evaluate_members
from minigrpo.population.stacked import Stack
from toy_tasks import arithmetic, food
from toy_tasks.rewards import make_reward
from toy_tasks.support import reward_table

PROMPTS, COMPLETIONS = ["ab ", "ab ", "ba "] * 2, ["a", "bb", "ab", "b", "aab", ""]


def models_of(tok, n=3, block_size=16, seed=0):
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=tok.vocab_size, block_size=block_size, n_layer=2, n_head=2, n_embd=16
    )
    return [GPT(cfg).eval() for _ in range(n)]


def test_stacked_weights_score_as_one_what_each_model_scores_alone():
    tok = CharTokenizer("ab ")
    models = models_of(tok)
    alone = torch.stack([completion_logprobs(m, tok, PROMPTS, COMPLETIONS) for m in models])
    assert torch.equal(completion_logprobs(models, tok, PROMPTS, COMPLETIONS), alone)
    stack = Stack(models)
    assert torch.allclose(completion_logprobs(stack, tok, PROMPTS, COMPLETIONS), alone, atol=1e-5)
    assert torch.allclose(
        completion_logprobs(stack.rows([2, 0]), tok, PROMPTS, COMPLETIONS),
        alone[[2, 0]],
        atol=1e-5,
    )


def close(got, want) -> bool:
    """Every figure of an evaluation within float rounding of the other's, nested dicts too."""
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(close(got[k], want[k]) for k in want)
    if isinstance(want, float):
        return math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-6)
    return got == want


def task_run(task, reward, model, person="ravin"):
    """What an evaluation reads of a run: task, tokenizer, cfg, baseline, reward table."""
    tok = CharTokenizer(task.ALPHABET)
    cfg = SimpleNamespace(reward=reward, person=person, beta=0.1)
    rewards = reward_table(
        make_reward(reward, task.REWARDS),
        task.rl_prompts(cfg),
        task.support,
        task.OFF_SUPPORT_PROBES,
    )
    return SimpleNamespace(task=task, tok=tok, cfg=cfg, rewards=rewards, baseline=None)


@pytest.mark.parametrize(
    "task, reward, block",
    [(food, "pizza", 48), (arithmetic, "correct+format", 24)],
    ids=["food", "arithmetic"],
)
def test_a_tasks_evaluation_of_stacked_weights_is_each_models_own(task, reward, block):
    run = task_run(task, reward, None)
    models = models_of(run.tok, block_size=block)
    run.baseline = task.rl_baseline(models[0], run.tok, run.cfg)
    alone = [task.rl_evaluate(m, run.tok, run.baseline, run.cfg, run.rewards) for m in models]
    many = task.rl_evaluate_many(Stack(models), run.tok, run.baseline, run.cfg, run.rewards)
    assert len(many) == 3 and all(close(g, w) for g, w in zip(many, alone))


def test_the_members_gpts_take_their_weights_from_the_stack_and_evaluate_as_one():
    """After an update of the stacked weights, Stack.copy_to writes each member's into its own GPT
    (what its own forwards compute with); evaluate_members then gives each member its single run's
    figures."""
    run = task_run(food, "pizza", None)
    models = models_of(run.tok, block_size=48)
    run.baseline = food.rl_baseline(models[0], run.tok, run.cfg)
    stack = Stack(models, trainable=True)
    with torch.no_grad():  # an update of the stacked weights
        for w in stack.w.values():
            w.add_(0.05 * torch.randn(w.shape))
    stack.copy_to(models)
    for p, m in enumerate(models):
        assert all(torch.equal(w, stack.w[k][p]) for k, w in m.named_parameters()), p
    members = [SimpleNamespace(run=SimpleNamespace(**vars(run), policy=m)) for m in models]
    got = evaluate_members(members)
    for m in members:
        want = food.rl_evaluate(m.run.policy, run.tok, run.baseline, run.cfg, run.rewards)
        assert close(got[id(m)], want)
