"""toy_tasks/value_tree.py: the exact values of many models at once, against the slow oracle
(tests/oracle_values.py, model by model) on every prefix of the support, prefixes that leave it, and
sampled rollouts."""

import copy

import pytest
import torch
from oracle_values import prefix_values
from test_oracle import OFF, PROMPTS, TABLE

from minigrpo.lm.logprobs import pad_left, sequence_logprobs
from minigrpo.lm.sampling import encode_prompts, generate
from toy_tasks import food
from toy_tasks.value_tree import ValueTree


def _rows(tok, texts: list[tuple[int, str]]):
    """(prompt index, completion) pairs -> prompt_index (N,), completion ids (N, T) right-padded,
    mask (N, T): the completion's tokens and its EOS valid, as a rollout's."""
    ids = [tok.encode(c, eos=True) for _, c in texts]
    T = max(len(r) for r in ids)
    completion = torch.tensor([r + [tok.pad_id] * (T - len(r)) for r in ids])
    mask = torch.tensor([[True] * len(r) + [False] * (T - len(r)) for r in ids])
    return torch.tensor([i for i, _ in texts]), completion, mask


@pytest.mark.parametrize("temperature, beta", [(1.0, 0.0), (0.7, 0.1)])
def test_the_trees_values_are_the_slow_oracles_for_every_model_at_once(
    tiny_pretrained, temperature, beta
):
    """Three models (the pretrained one and two perturbed copies), each its own β, against π_ref:
    every support completion, completions that leave the support at any character, and rollouts
    sampled from the model."""
    _, ref, tok = tiny_pretrained
    models = [ref]
    for seed in (1, 2):
        m = copy.deepcopy(ref)
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.05 * torch.randn_like(p))
        models.append(m)
    betas = torch.tensor([beta, 2 * beta, 0.5 * beta])
    texts = [(i, f) for i in range(len(PROMPTS)) for f in food.FOODS] + [
        (i, c) for i in range(2) for c in OFF
    ]
    rows = [PROMPTS[i] for i, _ in texts]
    index, completion, mask = _rows(tok, texts)
    ids, km = encode_prompts(tok, [PROMPTS[0]] * 16, "cpu")
    # sampled rows too
    gen = generate(ref, ids, km, 10, temperature, generator=torch.Generator().manual_seed(0))
    tree = ValueTree(tok, PROMPTS, food.support, TABLE)
    logp = torch.stack([sequence_logprobs(m, tree.ids, tree.key_mask, temperature) for m in models])
    ref_logp = sequence_logprobs(ref, tree.ids, tree.key_mask, temperature).expand(3, -1, -1)
    V = tree.values(logp, ref_logp, betas)
    for index_, completion_, mask_, rows_ in [
        (index, completion, mask, rows),
        (
            torch.zeros(16, dtype=torch.long),
            gen.completion_ids,
            gen.completion_mask,
            [PROMPTS[0]] * 16,
        ),
    ]:
        P = len(models)
        got = tree.prefix_values(
            V, index_.expand(P, -1), completion_.expand(P, -1, -1), mask_.expand(P, -1, -1)
        )
        for p, m in enumerate(models):
            want = prefix_values(
                m,
                tok,
                rows_,
                completion_,
                mask_,
                PROMPTS,
                food.support,
                TABLE,
                temperature,
                ref,
                betas[p].item(),
            )
            assert torch.allclose(got[p], want, atol=1e-6), (p, (got[p] - want).abs().max())
    assert (
        got.shape == (3, 16, gen.completion_ids.size(1))
        and (got[:, ~gen.completion_mask] == 0).all()
    )


def test_the_tree_holds_each_prompt_support_once_and_its_rows_are_the_oracles():
    """Its rows are BOS + prompt + completion + EOS for every (prompt, support completion),
    left-padded; each prompt's prefixes are nodes of its own tree (a prefix shared by two foods is
    one node)."""
    from minigrpo.lm.tokenizer import CharTokenizer

    tok = CharTokenizer(sorted(set("".join(PROMPTS + food.FOODS))))
    tree = ValueTree(tok, PROMPTS, food.support, TABLE)
    want, _ = pad_left(
        [tok.encode(x, bos=True) + tok.encode(f, eos=True) for x in PROMPTS for f in food.FOODS],
        tok.pad_id,
    )
    assert torch.equal(tree.ids, want)
    prefixes = {f[:t] for f in food.FOODS for t in range(len(f) + 1)}
    # internal nodes and leaves
    assert tree.moves.size(0) == len(PROMPTS) * (len(prefixes) + len(food.FOODS))


def test_a_tree_of_each_models_own_reward_is_each_models_tree_of_that_reward(tiny_pretrained):
    """Models whose rewards differ (a lockstep population's members with rewards of their own): one
    tree of a table per model gives each model the values of the tree of its table alone, to the
    bit."""
    from toy_tasks.rewards import make_reward
    from toy_tasks.support import reward_table

    _, ref, tok = tiny_pretrained
    tables = [
        TABLE,
        reward_table(
            make_reward("food:sushi", food.REWARDS, ""),
            PROMPTS,
            food.support,
            food.OFF_SUPPORT_PROBES,
        ),
    ]
    both = ValueTree(tok, PROMPTS, food.support, tables)
    logp = sequence_logprobs(ref, both.ids, both.key_mask).expand(2, -1, -1)
    V, beta = both.values(logp, None, torch.zeros(2)), torch.zeros(1)
    index, completion, mask = _rows(tok, [(0, "sushi"), (1, "pizza"), (0, "zz")])
    got = both.prefix_values(
        V, index.expand(2, -1), completion.expand(2, -1, -1), mask.expand(2, -1, -1)
    )
    for p, table in enumerate(tables):
        alone = ValueTree(tok, PROMPTS, food.support, table)
        want = alone.values(logp[:1], None, beta)
        assert torch.equal(V[p], want[0])
        assert torch.equal(
            got[p], alone.prefix_values(want, index[None], completion[None], mask[None])[0]
        )
    assert not torch.equal(V[0], V[1])  # the two rewards value the tree otherwise
