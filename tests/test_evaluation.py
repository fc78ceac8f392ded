"""A lockstep population's exact evaluation (minigrpo/population/evaluation.py): every member's
forward is one, and lm/logprobs.completion_logprobs_many scores every member from the stacked logits
at once."""

import torch

from minigrpo.lm.logprobs import completion_logprobs, completion_logprobs_many, scoring_batch
from minigrpo.lm.model import GPT, GPTConfig
from minigrpo.lm.tokenizer import CharTokenizer
from minigrpo.population.evaluation import SharedForward
from minigrpo.population.stacked import Stack

PROMPTS, COMPLETIONS = ["ab ", "ab ", "ba "] * 2, ["a", "bb", "ab", "b", "aab", ""]


def test_members_score_as_one_what_each_scores_alone_through_the_shared_forward():
    tok = CharTokenizer("ab ")
    torch.manual_seed(0)
    models = [
        GPT(
            GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=16)
        ).eval()
        for _ in range(3)
    ]
    # not a population: each model alone
    plain = completion_logprobs_many(models, tok, PROMPTS, COMPLETIONS)
    assert torch.equal(
        plain, torch.stack([completion_logprobs(m, tok, PROMPTS, COMPLETIONS) for m in models])
    )
    shared = SharedForward()
    for p, m in enumerate(models):
        shared.adopt(m, p)
    shared.fresh(Stack(models))
    # each its own view
    alone = torch.stack([completion_logprobs(m, tok, PROMPTS, COMPLETIONS) for m in models])
    tree = scoring_batch(tok, tuple(PROMPTS), tuple(COMPLETIONS), True, torch.device("cpu"))[3]
    with torch.no_grad():  # as completion_logprobs_many calls it
        assert models[0].logits_of_all(models, tree).shape[0] == 3, (
            "the members' logits, stacked: scored as one"
        )
    assert torch.equal(completion_logprobs_many(models, tok, PROMPTS, COMPLETIONS), alone)
    assert torch.equal(
        completion_logprobs_many(models[::-2], tok, PROMPTS, COMPLETIONS), alone[[2, 0]]
    )
    assert torch.allclose(alone, plain, atol=1e-5), (
        "the stacked forward: the models' own to float rounding"
    )


def test_a_members_own_forward_takes_its_weights_from_the_stack_after_an_update():
    """A member's GPT is not kept current each step (its checkpoint comes from the stacks): a
    forward the shared one does not serve (a KV cache's) first copies the member's weights from the
    stack, once a step."""
    tok = CharTokenizer("ab ")
    torch.manual_seed(0)
    models = [
        GPT(
            GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=16)
        ).eval()
        for _ in range(2)
    ]
    stack = Stack(models, trainable=True)
    shared = SharedForward()
    for p, m in enumerate(models):
        shared.adopt(m, p)
    with torch.no_grad():  # an update of the stacked weights
        for w in stack.w.values():
            w.add_(torch.randn(w.shape))
    idx = torch.randint(tok.vocab_size, (3, 5))
    with torch.no_grad():
        stale = models[1](idx)
        shared.fresh(stack)
        want = stack.head(
            stack.hidden(
                idx[None].expand(2, 3, 5),
                torch.arange(5).expand(2, 3, 5),
                torch.ones(5, 5, dtype=torch.bool).tril().expand(6, 1, 5, 5),
            )
        )[1]
        got = models[1](idx)
    assert not torch.allclose(stale, want, atol=1e-3), "before fresh(): the GPT's own, old weights"
    assert torch.allclose(got, want, atol=1e-5), (
        "a forward without a cache: the shared forward's, from the stack"
    )
    assert shared.current == set(), "served by the stack: no member's own weights copied"
    with torch.no_grad():
        cached = models[0](idx, cache=models[0].new_cache(3, 5))
    assert torch.allclose(
        cached,
        stack.head(
            stack.hidden(
                idx[None].expand(2, 3, 5),
                torch.arange(5).expand(2, 3, 5),
                torch.ones(5, 5, dtype=torch.bool).tril().expand(6, 1, 5, 5),
            )
        )[0],
        atol=1e-5,
    ), (
        "member 0's cached forward runs on its own GPT, which must first take its weights from "
        "the stack"
    )
    assert shared.current == {0}, "member 0's weights copied, once; member 1's not"
