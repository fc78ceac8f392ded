"""The pure pieces of bench's mismatch section (minigrpo/bench/mismatch.py): the enumeration of
every likely completion under π and a sampler, and the exact expected gradients built on it. No
timing."""

import math

import pytest
import torch

from minigrpo.bench.mismatch import (
    CORRECTIONS,
    enumerate_completions,
    estimator_coefs,
    grad_of,
    token_logp,
    versus,
)
from minigrpo.lm.sampling import encode_prompts, generate
from toy_tasks import food
from toy_tasks.rewards import make_reward, score

PROMPT, FLOOR = "ravin likes ", 1e-3
pytestmark = pytest.mark.slow  # a bench section's pieces: with the slow tests (3 s)


@pytest.fixture(scope="module")
def tree(tiny_pretrained):
    """(model, tok, the completions with π or π at temperature 1.5 >= FLOOR, log π (N, T) with grad,
    rewards)."""
    _, model, tok = tiny_pretrained
    model.eval()
    gen = enumerate_completions([(model, 1.0, None), (model, 1.5, None)], tok, PROMPT, 12, FLOOR)
    texts = [tok.decode(r.tolist()) for r in gen.completion_ids]
    rewards = torch.tensor(
        score(
            make_reward("pizza", food.REWARDS), [PROMPT] * len(texts), texts, gen.finished.tolist()
        )
    )
    return model, tok, gen, token_logp(model, gen), rewards


def test_every_completion_above_the_floor_under_either_distribution_is_enumerated_once(tree):
    model, tok, gen, pi_logp, _ = tree
    rows = [tuple(r[m].tolist()) for r, m in zip(gen.completion_ids, gen.completion_mask)]
    assert len(set(rows)) == len(rows), "each completion once"
    with torch.no_grad():
        q_logp = token_logp(model, gen, 1.5)
    best = torch.maximum(pi_logp.detach().sum(1), q_logp.sum(1))
    assert (best >= math.log(FLOOR) - 1e-5).all(), "nothing below the floor under both"
    ids, mask = encode_prompts(tok, [PROMPT] * 3000)
    for temperature in (1.0, 1.5):  # every sampled completion that is likely enough is in the set
        s = generate(model, ids, mask, 12, temperature, generator=torch.Generator().manual_seed(1))
        lp = s.logprobs.sum(1)
        likely = {
            tuple(r[m].tolist())
            for r, m, p in zip(s.completion_ids, s.completion_mask, lp)
            if p >= math.log(2 * FLOOR)
        }
        assert likely and likely <= set(rows)


def test_the_exact_gradient_is_the_gradient_of_the_expected_advantage(tree):
    model, _, gen, pi_logp, rewards = tree
    pi_y = pi_logp.detach().sum(1).exp()
    b = (pi_y * rewards).sum() / pi_y.sum()
    truth = grad_of(
        model, pi_logp, estimator_coefs(pi_logp, pi_logp, gen.completion_mask, rewards, b)
    )
    # ∇ Σ_y π(y)(r − b)
    direct = grad_of(model, pi_logp.sum(1).exp() * (rewards - b), torch.ones(len(rewards)))
    assert torch.allclose(truth, direct, atol=1e-7, rtol=1e-4)


def test_on_policy_every_correction_is_exact_and_only_the_uncapped_weight_undoes_a_temperature(
    tree,
):
    model, _, gen, pi_logp, rewards = tree
    mask = gen.completion_mask
    pi_y = pi_logp.detach().sum(1).exp()
    b = (pi_y * rewards).sum() / pi_y.sum()
    truth = grad_of(model, pi_logp, estimator_coefs(pi_logp, pi_logp, mask, rewards, b))
    for corr in CORRECTIONS.values():  # q = π: weights exactly 1
        assert torch.equal(
            grad_of(model, pi_logp, estimator_coefs(pi_logp, pi_logp, mask, rewards, b, corr)),
            truth,
        )
    with torch.no_grad():
        q = token_logp(model, gen, 1.5)
    g = lambda corr, cap: grad_of(
        model, pi_logp, estimator_coefs(pi_logp, q, mask, rewards, b, corr, cap)
    )  # noqa
    cos, err = versus(g(("tis", "sequence"), math.inf), truth)
    assert err < 1e-4, (
        "Σ_y q·(π/q)·(r − b)·∇log π = g_true on the enumerated set: sequence IS, uncapped, is exact"
    )
    assert versus(g(None, 2.0), truth)[1] > 100 * err, "the uncorrected estimator is biased"
    assert versus(g(("tis", "token"), math.inf), truth)[1] > 100 * err, (
        "per-token weights ignore the prefix's shift"
    )
