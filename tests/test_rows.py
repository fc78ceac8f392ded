"""population/rows.py: the members' rows through their prefix trees (one build, each member a
segment) against the plain forward, and PPO's minibatches selected together (their trees built as
one) against each selected alone."""

from dataclasses import replace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_population import members

from minigrpo.lm.sampling import Generation
from minigrpo.lm.tokenizer import PAD_ID
from minigrpo.population.rows import Rows, Trees
from minigrpo.population.stacked import Stack


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 4), st.integers(1, 5), st.integers(0, 3)), min_size=1, max_size=3
    ),
    st.integers(0, 2**16),
    st.sampled_from([None, 2]),
    st.booleans(),
)
def test_the_members_prefix_trees_give_the_plain_forwards_log_probs_states_and_gradients(
    shapes, seed, group_size, twin
):
    """Rows.of's forward through the members' prefix trees (population/rows.Trees: one tree build,
    each member a segment), against the same rows' plain forward (its oracle): members with other
    prompt widths and completion lengths (left and right padding), rows that repeat (shared
    prefixes; a member's rows the same as another's), trees of several packed sequences (a small
    group size)."""
    torch.manual_seed(seed)
    models = members(3, seed)[: len(shapes)]
    gens = []
    # a member: 4 rows, its prompts `width` wide, its completions ≤ `length`
    for width, length, copies in shapes:
        ids = torch.randint(3, 20, (4, width + length))
        ids[1 : 1 + copies] = ids[0]  # shared prefixes
        key_mask = torch.ones_like(ids, dtype=torch.bool)
        key_mask[-1, : width - 1] = False  # a shorter prompt, left-padded
        ends = torch.randint(1, length + 1, (4,))
        completion_mask = torch.arange(length)[None] < ends[:, None]
        key_mask[:, width:] = completion_mask
        ids = ids.masked_fill(~key_mask, PAD_ID)
        gens.append(
            Generation(
                ids,
                key_mask,
                width,
                completion_mask,
                torch.zeros(4, length),
                torch.ones(4, dtype=torch.bool),
            )
        )
    # the last member's rows are the first's: still its own nodes, through its weights
    if twin and len(gens) > 1:
        gens[-1] = gens[0]
    fast = Rows.of(gens)
    if group_size is not None:
        fast.tree = Trees.build(fast.ids, fast.key_mask, group_size)
    plain = replace(fast, tree=None)
    stack = Stack(models)
    got, want = fast.logprobs(stack, 0.8, states=True), plain.logprobs(stack, 0.8, states=True)
    real = fast.completion_mask
    for a, b in zip(got, want):
        assert torch.allclose(a[real], b[real], atol=1e-5)
    grads = []
    for rows in (fast, plain):
        for m in models:
            m.zero_grad()
        logp, _, h = rows.logprobs(stack, 0.8, states=True)
        (logp.sum() + h[real].square().sum()).backward()
        grads.append([p.grad.clone() for m in models for p in m.parameters()])
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-3) for a, b in zip(*grads))


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([(2, 2), (3, 1), (1, 3)]))
def test_minibatches_selected_together_are_each_selected_alone(seed, sizes):
    """PPO's minibatches of a step: their rows picked for each member, their trees built as one
    (each (minibatch, member) a segment, Trees.split), give each minibatch's rows and the log-probs
    of its own tree and of the plain forward; minibatches of other sizes get a tree each."""
    torch.manual_seed(seed)
    models, N, W, T = members(2, seed), 4, 3, 4
    ids = torch.randint(3, 20, (N, W + T))
    ids[1] = ids[0]  # a shared prefix
    key_mask = torch.ones_like(ids, dtype=torch.bool)
    key_mask[:, W:] = torch.arange(T)[None] < torch.randint(1, T + 1, (N, 1))
    gen = Generation(
        ids.masked_fill(~key_mask, PAD_ID),
        key_mask,
        W,
        key_mask[:, W:],
        torch.zeros(N, T),
        torch.ones(N, dtype=torch.bool),
    )
    rows, stack = Rows.of([gen, gen]), Stack(models)
    order = torch.stack([torch.randperm(N), torch.randperm(N)])
    indices = list(order.split(list(sizes), dim=1))
    together = rows.select(indices)
    for index, sub in zip(indices, together):
        alone = rows.select([index])[0]
        for name in ("ids", "key_mask", "completion_mask"):
            assert torch.equal(getattr(sub, name), getattr(alone, name)), name
        got, mine, plain = (r.logprobs(stack)[0] for r in (sub, alone, replace(alone, tree=None)))
        assert torch.allclose(got, mine, atol=1e-6) and torch.allclose(got, plain, atol=1e-5)
