"""population/rows.py: each member scores its rows (padded among the others', through a batch of
prefix trees built as one) as its single run scores them (lm/logprobs.generation_logprobs of its own
Generation and GPT), and as the plain forward does; PPO's minibatches (Generation.select of each
member's rows) as each member's own selected alone; rows every member shares through their one
tree."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_population import members

from minigrpo.lm.logprobs import completion_token_logprobs, generation_logprobs, shifted_forward
from minigrpo.lm.prefix_tree import next_token_tree
from minigrpo.lm.sampling import Generation
from minigrpo.lm.tokenizer import PAD_ID
from minigrpo.population.rows import shared_rows, stacked_rows
from minigrpo.population.stacked import Stack


def generation(ids, key_mask, width):
    """A Generation of rows ids, key_mask (N, width + T) whose completions start at `width`."""
    n, t = ids.size(0), ids.size(1) - width
    return Generation(
        ids.masked_fill(~key_mask, PAD_ID),
        key_mask,
        width,
        key_mask[:, width:],
        torch.zeros(n, t),
        torch.ones(n, dtype=torch.bool),
    )


def plain_logprobs(stack, rows, temperature=1.0):
    """The completion tokens' log-probs of rows through the plain forward (every slot, no tree)."""
    logits, _ = shifted_forward(stack, rows.ids, rows.key_mask, temperature, shared_prefixes=False)
    P, N, L = rows.ids.shape
    return completion_token_logprobs(
        logits.flatten(0, 1),
        rows.ids.flatten(0, 1),
        rows.prompt_len,
        rows.completion_mask.flatten(0, 1),
    ).view(P, N, -1)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 4), st.integers(1, 5), st.integers(0, 3)), min_size=1, max_size=3
    ),
    st.integers(0, 2**16),
    st.sampled_from([None, 2]),
    st.booleans(),
)
def test_each_member_scores_its_rows_as_its_single_run_does(shapes, seed, group_size, twin):
    """stacked_rows' log-probs, logits, states and gradients, member by member, against its single
    run's generation_logprobs over its own Generation (and the plain forward's log-probs): members
    with other prompt widths and completion lengths (left and right padding), rows that repeat
    (shared prefixes; a member's rows the same as another's), trees of several packed sequences (a
    small group size)."""
    torch.manual_seed(seed)
    models = members(3, seed)[: len(shapes)]
    gens = []
    # a member: 4 rows, its prompts `width` wide, its completions ≤ `length`
    for width, length, copies in shapes:
        ids = torch.randint(3, 20, (4, width + length))
        ids[1 : 1 + copies] = ids[0]  # shared prefixes
        key_mask = torch.ones_like(ids, dtype=torch.bool)
        key_mask[-1, : width - 1] = False  # a shorter prompt, left-padded
        key_mask[:, width:] = torch.arange(length)[None] < torch.randint(1, length + 1, (4, 1))
        gens.append(generation(ids, key_mask, width))
    # the last member's rows are the first's: still its own nodes, through its weights
    if twin and len(gens) > 1:
        gens[-1] = gens[0]
    rows, stack = stacked_rows(gens), Stack(models)
    if group_size is not None:
        rows._tree = next_token_tree(rows.ids, rows.key_mask, group_size)
    logp, logits, h = generation_logprobs(stack, rows, 0.8, True, True)
    real = rows.completion_mask
    assert torch.allclose(logp[real], plain_logprobs(stack, rows, 0.8)[real], atol=1e-5)
    assert not logp[~real].any(), "a padded slot counts"
    (logp.sum() + h[real].square().sum()).backward()
    together = [p.grad.clone() for m in models for p in m.parameters()]
    for m in models:
        m.zero_grad()
    for p, (m, g) in enumerate(zip(models, gens)):
        t, mask = g.completion_mask.size(1), g.completion_mask
        want = generation_logprobs(m, g, 0.8, return_logits=True, return_hidden=True)
        for got, alone in zip((logp, logits, h), want):
            assert torch.allclose(got[p, :, :t][mask], alone[mask], atol=1e-5), p
        (want[0].sum() + want[2][mask].square().sum()).backward()
    alone = [p.grad for m in models for p in m.parameters()]
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-3) for a, b in zip(together, alone))


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([(2, 2), (3, 1), (1, 3)]))
def test_minibatches_select_each_members_own_rows_and_score_as_each_member_alone(seed, sizes):
    """PPO's minibatches of a step: Generation.select of (member, row) indices gives each member's
    chosen rows, scored through their batch of trees as each member's own rows selected alone are
    by its own GPT, and as by the plain forward."""
    torch.manual_seed(seed)
    models, N, W, T = members(2, seed), 4, 3, 4
    ids = torch.randint(3, 20, (N, W + T))
    ids[1] = ids[0]  # a shared prefix
    key_mask = torch.ones_like(ids, dtype=torch.bool)
    key_mask[:, W:] = torch.arange(T)[None] < torch.randint(1, T + 1, (N, 1))
    gen = generation(ids, key_mask, W)
    rows, stack = stacked_rows([gen, gen]), Stack(models)
    order = torch.stack([torch.randperm(N), torch.randperm(N)])
    for index in order.split(list(sizes), dim=1):
        sub = rows.select(index)
        for name in ("ids", "key_mask", "completion_mask"):
            want = torch.stack([getattr(rows, name)[p, index[p]] for p in range(2)])
            assert torch.equal(getattr(sub, name), want), name
        got = generation_logprobs(stack, sub)
        for p, m in enumerate(models):
            alone = gen.select(index[p])
            mine = generation_logprobs(m, alone)
            assert torch.allclose(got[p, :, : mine.size(1)], mine, atol=1e-6)
        assert torch.allclose(got, plain_logprobs(stack, sub), atol=1e-5)


def test_rows_every_member_shares_go_through_their_one_tree_each_members_weights_its_own():
    """shared_rows (the anchor's): one Generation for P members, its one prefix tree expanded, each
    member's log-probs and logits those of its single run over that Generation."""
    models, N, W, T = members(3, 1), 5, 3, 4
    ids = torch.randint(3, 20, (N, W + T))
    ids[2:] = ids[0]
    key_mask = torch.ones_like(ids, dtype=torch.bool)
    key_mask[:, W:] = torch.arange(T)[None] < torch.tensor([[4], [2], [3], [1], [4]])
    gen = generation(ids, key_mask, W)
    with torch.no_grad():
        logp, logits = generation_logprobs(Stack(models), shared_rows(gen, 3), 1.3, True)
        for p, m in enumerate(models):
            want = generation_logprobs(m, gen, 1.3, return_logits=True)
            for got, alone in zip((logp, logits), want):
                assert torch.allclose(
                    got[p][gen.completion_mask], alone[gen.completion_mask], atol=1e-5
                )
