"""Properties of minigrpo/lm/prefix_tree.py, the shared-prefix forward (tree attention): on batches
of rows that share stems and repeat, it computes the plain forward's logits, hidden states and
gradients at every real slot, one node per distinct prefix, each node with its row's token, its
depth as position id and exactly its ancestors as keys."""

import torch
from conftest import SET, perturbed
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minigrpo.lm.logprobs import shifted_forward
from minigrpo.lm.model import GPT, GPTConfig, Weights
from minigrpo.lm.prefix_tree import build_prefix_tree, next_token_tree

V = 10
torch.manual_seed(0)
MODEL = perturbed(
    GPT(GPTConfig(vocab_size=V, block_size=16, n_layer=2, n_head=2, n_embd=16)), scale=0.3
)
SMALL = settings(SET, max_examples=15)  # the property tests that run the model


@st.composite
def batches(draw, max_rows=12):
    """(ids, key_mask) (B, T): rows = one of a few stems + one of a few tails (many repeats, shared
    prefixes), each placed at a random offset (left padding, the tokens, right padding), random
    tokens in the padding. Row 0 has ≥ 2 real tokens (a batch with no token to predict is
    test_a_batch_with_nothing_to_predict_...'s)."""
    token = st.integers(0, V - 1)
    stems = draw(st.lists(st.lists(token, max_size=6), min_size=1, max_size=3))
    tails = draw(st.lists(st.lists(token, max_size=4), min_size=1, max_size=4))
    rows = [
        draw(st.sampled_from(stems)) + draw(st.sampled_from(tails))
        for _ in range(draw(st.integers(1, max_rows)))
    ]
    rows = [r or [draw(token)] for r in rows]  # every row has a real token
    rows[0] += [draw(token)] * (len(rows[0]) < 2)  # and one row keeps a real token in ids[:, :-1]
    width = max(map(len, rows)) + draw(st.integers(0, 2))
    g = torch.Generator().manual_seed(draw(st.integers(0, 10**6)))
    ids = torch.randint(0, V, (len(rows), width), generator=g)
    key_mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for b, r in enumerate(rows):
        left = draw(st.integers(0, width - len(r)))
        ids[b, left : left + len(r)] = torch.tensor(r)
        key_mask[b, left : left + len(r)] = True
    return ids, key_mask


def real_rows(ids, key_mask):
    """Each row's real tokens, as a tuple."""
    return [tuple(ids[b][key_mask[b]].tolist()) for b in range(ids.size(0))]


def distinct_prefixes(ids, key_mask):
    return {r[:k] for r in real_rows(ids, key_mask) for k in range(1, len(r) + 1)}


def predicts_a_token(ids, key_mask):
    """(B, T-1) bool: input slot t is real and so is its target t+1."""
    if key_mask is None:
        return torch.ones_like(ids[:, :-1], dtype=torch.bool)
    return key_mask[:, :-1] & key_mask[:, 1:]


def assert_same_forward(ids, key_mask, tree=None):
    """Tree and plain forward agree (logits and hidden states) at every input slot of ids[:, :-1]
    whose target is real (a row's last real token predicts padding: the forward need not compute
    it)."""
    with torch.no_grad():
        logits, hidden = shifted_forward(MODEL, ids, key_mask, tree=tree)
        want_logits, want_hidden = shifted_forward(MODEL, ids, key_mask, shared_prefixes=False)
    real = predicts_a_token(ids, key_mask)
    assert logits.shape == want_logits.shape and hidden.shape == want_hidden.shape
    for got, want, what in ((logits, want_logits, "logits"), (hidden, want_hidden, "hidden")):
        err = (got - want)[real].abs().max().item() if real.any() else 0.0
        assert err < 1e-5, (
            f"tree {what} differ from the plain forward's by {err:.2e} at real "
            f"slots\nids={ids.tolist()}"
        )


@SMALL
@given(batches())
def test_tree_forward_equals_the_plain_forward_at_every_real_slot(batch):
    """Logits and final hidden states of the shared-prefix forward equal the plain forward's at real
    slots."""
    assert_same_forward(*batch)


@SMALL
@given(batches(), st.integers(0, 10**6))
def test_tree_gradients_equal_the_plain_forwards(batch, seed):
    """A random weighted sum of the real slots' logits gives the same parameter gradients along both
    paths."""
    ids, key_mask = batch
    w = torch.randn(ids.size(0), ids.size(1) - 1, V, generator=torch.Generator().manual_seed(seed))
    w = w * predicts_a_token(ids, key_mask)[:, :, None]
    grads = []
    for shared in (True, False):
        MODEL.zero_grad()
        (shifted_forward(MODEL, ids, key_mask, shared_prefixes=shared)[0] * w).sum().backward()
        grads.append({n: p.grad.clone() for n, p in MODEL.named_parameters()})
    MODEL.zero_grad()
    for name, want in grads[1].items():
        err = (grads[0][name] - want).abs().max().item()
        assert err < 1e-4 * (1 + want.abs().max().item()), (
            f"gradient of {name} differs by {err:.2e}"
        )


# rows 0 i i … i (i < 10, width 12): 111 prefixes, more than one packed sequence's 96 (the last row
# starts a second)
ACROSS_SEQUENCES = torch.cat(
    [torch.zeros(V, 1, dtype=torch.long), torch.arange(V)[:, None].expand(V, 11)], 1
)


@SET
@example((ACROSS_SEQUENCES, torch.ones_like(ACROSS_SEQUENCES, dtype=torch.bool)))
@given(batches())
def test_one_node_per_distinct_prefix(batch):
    """num_nodes = the distinct prefixes r[:k] (k ≥ 1) of the rows' real tokens r, counted with a
    set, once per packed sequence that holds a row with it (a sequence's first row brings its own
    copy of its ancestors): exactly the distinct prefixes when one sequence holds them all, never
    fewer."""
    ids, key_mask = batch
    tree = build_prefix_tree(ids, key_mask)
    assert len(set(tree.index[key_mask].tolist())) == tree.num_nodes, (
        "every node is some real (row, slot)'s node"
    )
    N = tree.tokens.size(1)
    per_sequence = {
        (int(tree.index[b, key_mask[b]][-1]) // N, prefix)
        for b in range(ids.size(0))
        for prefix in distinct_prefixes(ids[b : b + 1], key_mask[b : b + 1])
        if key_mask[b].any()
    }
    assert tree.num_nodes == len(per_sequence) >= len(distinct_prefixes(ids, key_mask))
    if tree.tokens.size(0) == 1:
        assert tree.num_nodes == len(distinct_prefixes(ids, key_mask))


def assert_structure(ids, key_mask, tree):
    """Each real (row, slot)'s node holds the row's token at position id = its depth, and its mask
    row is True exactly at the nodes of the row's slots up to it (its ancestors and itself)."""
    G, N = tree.tokens.shape
    assert (
        tree.mask.shape == (G, 1, N, N)
        and tree.pos.shape == (G, N)
        and tree.index.shape == ids.shape
    )
    tokens, pos = tree.tokens.flatten(), tree.pos.flatten()
    for b in range(ids.size(0)):
        slots = key_mask[b].nonzero().flatten().tolist()
        for depth, t in enumerate(slots):
            node = int(tree.index[b, t])
            assert tokens[node] == ids[b, t] and pos[node] == depth, (
                f"row {b}, slot {t}: node {node}"
            )
            path = tree.index[b, slots[: depth + 1]]
            assert (path // N == node // N).all(), (
                f"row {b}, slot {t}: an ancestor sits in another sequence"
            )
            want = torch.zeros(N, dtype=torch.bool)
            want[path % N] = True
            assert torch.equal(tree.mask[node // N, 0, node % N], want), (
                f"row {b}, slot {t}: node {node} sees "
                f"{tree.mask[node // N, 0, node % N].nonzero().flatten().tolist()}"
                f", its path is {(path % N).tolist()}"
            )


@SET
@given(batches())
def test_each_node_has_its_rows_token_its_depth_and_exactly_its_ancestors_as_keys(batch):
    """The node at tree.index: the row's token, position id = depth, mask row = the row's path up to
    it."""
    assert_structure(*batch, build_prefix_tree(*batch))


@SET
@given(batches(), st.integers(1, 3), st.sampled_from([2, 96]), st.integers(0, 10**6))
def test_segments_share_no_node_and_no_sequence_and_each_is_the_tree_of_its_own_rows(
    batch, segments, group_size, seed
):
    """segment= (a lockstep population's members): every sequence holds one segment's rows only,
    each segment's nodes are exactly those of the tree of its rows alone (its own sequences, cut at
    the same places), and each node still has its row's token, depth and ancestors."""
    ids, key_mask = batch
    segment = torch.randint(
        0, segments, (ids.size(0),), generator=torch.Generator().manual_seed(seed)
    )
    tree = build_prefix_tree(ids, key_mask, group_size, segment)
    assert_structure(ids, key_mask, tree)
    N = tree.tokens.size(1)
    real = key_mask.any(1)
    assert torch.equal(
        tree.segment[tree.index[real, :] // N].masked_select(key_mask[real]),
        segment[real, None].expand_as(key_mask[real]).masked_select(key_mask[real]),
    )
    alone = [
        build_prefix_tree(ids[segment == s], key_mask[segment == s], group_size)
        for s in segment.unique()
        if key_mask[segment == s].any()
    ]
    assert tree.num_nodes == sum(t.num_nodes for t in alone)
    assert tree.tokens.size(0) == sum(t.tokens.size(0) for t in alone)


@SMALL
@given(batches(), st.sampled_from([1, 2, 5]))
def test_small_groups_still_give_the_plain_forward(batch, group_size):
    """Packing the nodes into many short sequences keeps the structure and the plain forward's
    logits."""
    ids, key_mask = batch
    tree = build_prefix_tree(ids[:, :-1], key_mask[:, :-1], group_size=group_size)
    assert_structure(ids[:, :-1], key_mask[:, :-1], tree)
    assert_same_forward(ids, key_mask, tree)


# rows 0 0 0 0 0 | 0 0 0 0 0 0 | 1 0 0 0 0 0 (sorted), group_size 5: the second sequence starts at
# the middle row,
# re-creates its 5 shared nodes and adds 1 + 6: 12 nodes
@SET
@example(
    (
        torch.tensor([[1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 9]]),
        torch.tensor([[True] * 6, [True] * 6, [True] * 5 + [False]]),
    ),
    5,
)
@given(batches(), st.sampled_from([1, 2, 5]))
def test_no_packed_sequence_holds_more_than_group_size_plus_2T_nodes(batch, group_size):
    """Each packed sequence holds at most group_size + 2T nodes (T = the batch's width): the rows
    that start in it add fewer than group_size + T, and its first row brings up to T more, its own
    copy of its ancestors."""
    ids, key_mask = batch
    tree = build_prefix_tree(ids, key_mask, group_size=group_size)
    per_sequence = torch.bincount(
        torch.tensor(sorted(set(tree.index[key_mask].tolist()))) // tree.tokens.size(1)
    )
    assert per_sequence.max() <= group_size + 2 * ids.size(1), (
        f"sequences hold {per_sequence.tolist()} nodes > group_size {group_size} + 2T "
        f"{2 * ids.size(1)}; "
        f"rows={real_rows(ids, key_mask)}"
    )


@SET
@given(
    st.lists(st.integers(0, V - 1), min_size=1, max_size=12), st.integers(1, 12), st.integers(0, 3)
)
def test_identical_rows_collapse_to_one_path(row, B, pad):
    """B copies of one row (padded alike or not) make exactly len(row) nodes."""
    ids = torch.full((B, len(row) + pad), 2)
    key_mask = torch.zeros_like(ids, dtype=torch.bool)
    for b in range(B):
        left = b % (pad + 1)
        ids[b, left : left + len(row)] = torch.tensor(row)
        key_mask[b, left : left + len(row)] = True
    tree = build_prefix_tree(ids, key_mask)
    assert tree.num_nodes == len(row)
    assert (tree.index[key_mask].view(B, -1) == tree.index[key_mask].view(B, -1)[:1]).all(), (
        "rows share the nodes"
    )


@SMALL
@example((ACROSS_SEQUENCES, None))  # two packed sequences at the default group size
@given(batches())
def test_key_mask_none_means_every_slot_is_real(batch):
    """key_mask=None: every slot real (the random padding too, so often over 96 nodes: several
    packed sequences): the same tree as an all-True mask, and the plain forward's logits."""
    ids, _ = batch
    full = torch.ones_like(ids, dtype=torch.bool)
    a, b = build_prefix_tree(ids), build_prefix_tree(ids, full)
    assert a.num_nodes == b.num_nodes
    for field in ("tokens", "pos", "mask", "index"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert_same_forward(ids, None)


def test_a_batch_with_nothing_to_predict_still_gives_the_plain_forwards_shapes():
    """No input slot predicts a real token (one real token per row, or ids one token wide): no node
    to compute, but the forward still returns (B, T-1, ·) logits and hidden states, as the plain
    forward does."""
    for ids, key_mask in [
        (torch.tensor([[3, 4]]), torch.tensor([[False, True]])),
        (torch.tensor([[3, 4], [5, 6]]), torch.tensor([[True, False], [False, True]])),
        (torch.tensor([[3]]), torch.tensor([[True]])),
    ]:
        with torch.no_grad():
            logits, hidden = shifted_forward(MODEL, ids, key_mask)
            want_logits, want_hidden = shifted_forward(MODEL, ids, key_mask, shared_prefixes=False)
        assert logits.shape == want_logits.shape and hidden.shape == want_hidden.shape
        assert torch.isfinite(logits).all() and torch.isfinite(hidden).all()


def three_trees(ids, key_mask):
    """Rows of one shape for three trees: the batch, its rows reversed, its first row repeated."""
    return (
        torch.stack([ids, ids.flip(0), ids[:1].expand_as(ids)]),
        torch.stack([key_mask, key_mask.flip(0), key_mask[:1].expand_as(key_mask)]),
    )


@SET
@given(batches(), st.sampled_from([2, 96]))
def test_a_batch_of_trees_is_each_tree_built_alone(batch, group_size):
    """ids (M, B, T): M trees from one build, each the tree of its rows alone (its structure, its
    node count), each row's index inside its own tree's slots, and gather reading each row's node;
    unbind gives them back one by one."""
    many, masks = three_trees(*batch)
    tree = build_prefix_tree(many, masks, group_size)
    M, G, N = tree.tokens.shape
    assert tree.mask.shape == (M * G, 1, N, N) and tree.index.shape == many.shape
    assert (tree.index // (G * N) == torch.arange(M).view(M, 1, 1)).all(), "a row left its tree"
    assert torch.equal(tree.gather(tree.tokens[..., None])[..., 0][masks], many[masks])
    alone = [build_prefix_tree(i, k, group_size) for i, k in zip(many, masks)]
    assert tree.num_nodes == sum(t.num_nodes for t in alone)
    for i, k, part, want in zip(many, masks, tree.unbind(), alone):
        assert_structure(i, k, part)
        assert part.num_nodes == want.num_nodes and part.tokens.size(0) == G


@SMALL
@given(batches())
def test_stacked_weights_compute_each_models_plain_forward_through_its_tree(batch):
    """Two models' weights stacked (lm/model.Weights (2, ...)) over a batch of two trees (each its
    own rows), and over one tree expanded for both: each model's logits and hidden states are its
    plain forward's alone at every real slot; the stacked plain forward too."""
    ids, key_mask = batch
    models = [MODEL, perturbed(MODEL, 0.3, seed=1)]
    named = [dict(m.named_parameters()) for m in models]
    w = Weights(MODEL.cfg, {n: torch.stack([p[n] for p in named]) for n in named[0]})
    many, masks = three_trees(ids, key_mask)
    many, masks = many[:2], masks[:2]
    one = (ids.expand(2, *ids.shape), key_mask.expand(2, *key_mask.shape))
    with torch.no_grad():
        for (r_ids, r_mask), tree in (
            ((many, masks), None),
            (one, next_token_tree(ids, key_mask).expand(2)),
        ):
            got = [
                shifted_forward(w, r_ids, r_mask, tree=tree),
                shifted_forward(w, r_ids, r_mask, shared_prefixes=False),
            ]
            for m, model in enumerate(models):
                want = shifted_forward(model, r_ids[m], r_mask[m], shared_prefixes=False)
                real = predicts_a_token(r_ids[m], r_mask[m])
                for logits_hidden in got:
                    for a, b in zip(logits_hidden, want):
                        assert (a[m] - b)[real].abs().max() < 1e-5 if real.any() else True
