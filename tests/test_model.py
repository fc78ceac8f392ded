import math
import tempfile

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minigrpo.lm.model import (
    GPT,
    GPTConfig,
    KVCache,
    Weights,
    attention,
    causal_mask,
    one_query_attention,
    positions,
)
from minigrpo.lm.prefix_tree import next_token_tree

CFG = GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16)


def make_model(seed=0):
    torch.manual_seed(seed)
    return GPT(CFG).eval()


def test_logits_shape():
    model = make_model()
    assert model(torch.randint(0, 11, (3, 7))).shape == (3, 7, 11)


def test_causality_later_tokens_never_change_earlier_logits():
    model = make_model()
    x = torch.randint(0, 11, (2, 12))
    y = x.clone()
    y[:, 7:] = torch.randint(0, 11, (2, 5))
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6), (
        "changing token 7.. changed logits before 7"
    )
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_kv_cache_step_by_step_equals_full_forward():
    model = make_model()
    x = torch.randint(0, 11, (3, 10))
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache(3, 10)
        parts = [model(x[:, :4], cache=cache)]  # prefill 4, then one token at a time
        for t in range(4, 10):
            parts.append(model(x[:, t : t + 1], cache=cache))
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)


def test_cached_chunk_of_several_tokens_uses_a_bottom_right_causal_mask():
    # is_causal=True would be top-left aligned and let query 0 of the chunk see only key 0
    model = make_model()
    x = torch.randint(0, 11, (2, 9))
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache(2, 9)
        model(x[:, :5], cache=cache)
        chunk = model(x[:, 5:], cache=cache)
    assert torch.allclose(chunk, full[:, 5:], atol=1e-5)


def test_left_padding_with_key_mask_and_positions_equals_the_unpadded_row():
    model = make_model()
    row = torch.randint(3, 11, (1, 6))
    padded = torch.cat([torch.full((1, 3), 2), row], 1)
    mask = torch.tensor([[False] * 3 + [True] * 6])
    with torch.no_grad():
        alone = model(row)
        pad = model(padded, pos=positions(mask), key_mask=mask)
    assert torch.allclose(pad[:, 3:], alone, atol=1e-5)
    assert torch.isfinite(pad).all(), "padding queries must not produce NaN"


def test_positions_count_real_tokens_only():
    mask = torch.tensor([[False, False, True, True], [True, True, True, True]])
    assert positions(mask).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]


def test_sequence_longer_than_block_size_is_an_error():
    model = make_model()
    try:
        model(torch.zeros(1, 17, dtype=torch.long))
    except ValueError as e:
        assert "block_size" in str(e)
    else:
        raise AssertionError("expected ValueError")


def naive_attention(q, k, v, allowed):
    """softmax(q·kᵀ/√D) over the allowed keys, then ·v; allowed (T, T_keys) or (B, 1, T, T_keys)
    bool."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


def test_attention_is_the_softmax_of_scaled_scores_with_a_causal_mask():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    got = attention(q, k, v)
    assert got.shape == (2, 3, 5, 4), (
        f"attention returned shape {tuple(got.shape)}, expected (B, H, T, D)"
    )
    assert torch.allclose(got, naive_attention(q, k, v, causal), atol=1e-10), (
        "without a mask, query i must attend to keys 0..i with weights softmax(q·kᵀ/√D)"
    )
    mask = torch.rand(2, 1, 5, 5, generator=g) < 0.5
    mask |= torch.eye(5, dtype=torch.bool)  # every query sees itself
    assert torch.allclose(attention(q, k, v, mask), naive_attention(q, k, v, mask), atol=1e-10), (
        "with attn_mask, exactly the keys where it is True must be attended"
    )


def test_attention_writes_the_new_keys_into_the_cache_and_attends_over_all_of_them():
    g = torch.Generator().manual_seed(1)
    cfg = GPTConfig(vocab_size=5, block_size=8, n_layer=2, n_head=2, n_embd=8)
    cache = KVCache(cfg, 3, 8, "cpu", torch.float64)
    old_k, old_v = (torch.randn(3, 2, 4, 4, generator=g, dtype=torch.float64) for _ in range(2))
    # 4 tokens already cached
    cache.k[1, :, :, :4], cache.v[1, :, :, :4], cache.length = old_k, old_v, 4
    q, k, v = (torch.randn(3, 2, 1, 4, generator=g, dtype=torch.float64) for _ in range(3))
    got = attention(q, k, v, cache=cache, layer=1)
    assert torch.equal(cache.k[1, :, :, 4:5], k) and torch.equal(cache.v[1, :, :, 4:5], v), (
        "the new keys and values belong in slots [cache.length, cache.length + T) of the layer's "
        "cache"
    )
    assert (cache.k[0] == 0).all(), "only layer `layer` of the cache may be written"
    assert cache.length == 4, (
        "attention must not advance cache.length (GPT.hidden does, after every layer)"
    )
    keys, values = torch.cat([old_k, k], 2), torch.cat([old_v, v], 2)
    assert torch.allclose(
        got, naive_attention(q, keys, values, torch.ones(1, 5, dtype=torch.bool)), atol=1e-10
    ), "one new query must attend over every cached key and itself"


def test_causal_mask_of_one_query_is_the_general_mask():
    """causal_mask's shortcut for a decoding step (T = 1) equals the general rule: key j <= offset
    and real, or the query itself, whatever the key mask (the query's own slot may even be
    padding)."""
    from minigrpo.lm.model import causal_mask

    g = torch.Generator().manual_seed(0)
    for offset in range(6):
        key_mask = torch.rand(4, offset + 3, generator=g) < 0.5
        q_abs, k_abs = torch.tensor([[offset]]), torch.arange(offset + 1)[None, :]
        want = (((k_abs <= q_abs) & key_mask[:, None, : offset + 1]) | (k_abs == q_abs))[:, None]
        assert torch.equal(causal_mask(offset, 1, key_mask), want)
    assert causal_mask(3, 1, None) is None


def test_linear_weights_lie_in_in_out_order_through_copies_loads_and_training():
    """model.in_out_order: each Linear weight keeps nn.Linear's (out, in) shape and values, but
    w.t() is contiguous, and stays so wherever a model goes: deepcopy, .double(), load_state_dict, a
    checkpoint, a backward and AdamW."""
    import copy

    from minigrpo.lm.checkpoint import load_checkpoint, save_checkpoint
    from minigrpo.lm.optim import AdamW
    from minigrpo.lm.tokenizer import CharTokenizer

    def linear_weights(m):
        return [mod.weight for mod in m.modules() if isinstance(mod, torch.nn.Linear)]

    def in_out(m):
        ws = linear_weights(m)
        return len(ws) == 4 * m.cfg.n_layer and all(
            w.t().is_contiguous() and not w.is_contiguous() for w in ws
        )

    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8))
    qkv = model.blocks[0].attn.qkv.weight
    assert qkv.shape == (24, 8) and in_out(model)
    opt = AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, 11, (3, 8))).logsumexp(-1).mean().backward()
    assert qkv.grad.stride() == qkv.stride()  # autograd gives the gradient the weight's order
    opt.step()
    assert (
        in_out(model)
        and opt.m[next(i for i, p in enumerate(opt.params) if p is qkv)].stride() == qkv.stride()
    )
    twin = GPT(model.cfg)
    # as older checkpoints hold them
    twin.load_state_dict({k: v.contiguous() for k, v in model.state_dict().items()})
    assert in_out(twin) and all(
        torch.equal(a, b) for a, b in zip(twin.parameters(), model.parameters())
    )
    assert in_out(copy.deepcopy(model)) and in_out(copy.deepcopy(model).double())
    with tempfile.TemporaryDirectory() as d:
        save_checkpoint(f"{d}/m.pt", model, CharTokenizer("abcdefgh"), "food", step=1)
        loaded, _, _ = load_checkpoint(f"{d}/m.pt")
    assert in_out(loaded) and all(
        torch.equal(a, b) for a, b in zip(loaded.parameters(), model.parameters())
    )


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 4),
    H=st.integers(1, 3),
    T_keys=st.integers(1, 9),
    D=st.sampled_from([1, 4, 16]),
    masked=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_one_query_attention_equals_the_fused_attention(B, H, T_keys, D, masked, seed):
    """The decoding step's written-out attention (lm/model.one_query_attention, what attention()
    uses for one query on a GPU) equals F.scaled_dot_product_attention's, with and without a mask;
    the query always sees its own key (the last), as causal_mask makes it."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, 1, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, H, T_keys, D, generator=g, dtype=torch.float64) for _ in range(2))
    mask = None
    if masked:
        mask = torch.rand(B, 1, 1, T_keys, generator=g) < 0.5
        mask[..., -1] = True
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = one_query_attention(q, k, v, mask)
    assert got.shape == (B, H, 1, D), (
        f"one_query_attention returned {tuple(got.shape)}, expected (B, H, 1, D)"
    )
    assert torch.allclose(got, want, atol=1e-12), (
        "a single query's attention must be SDPA's to float64 rounding"
    )
    assert torch.allclose(
        got,
        naive_attention(q, k, v, torch.ones(1, T_keys, dtype=torch.bool) if mask is None else mask),
        atol=1e-12,
    )


def test_the_forward_of_stacked_weights_is_each_models_own():
    """Weights.hidden over P models' weights stacked (P, ...), idx (P, B, T): member p's rows equal
    its own GPT's, without a cache (left-padded rows), through a KV cache (a prefill, then a step),
    and under a prefix tree's attention mask; so do the logits through the tied heads."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=2, n_embd=16)
    models = [GPT(cfg) for _ in range(3)]
    named = [dict(m.named_parameters()) for m in models]
    stacked = Weights(cfg, {k: torch.stack([n[k] for n in named]) for k in named[0]})
    P, B, T = 3, 4, 6
    idx = torch.randint(3, 13, (P, B, T + 1))
    key_mask = torch.ones(P * B, T + 1, dtype=torch.bool)
    key_mask[1, :2] = key_mask[6, :3] = False
    pos = positions(key_mask).view(P, B, T + 1)
    with torch.no_grad():
        h = stacked.hidden(idx[..., :T], pos[..., :T], causal_mask(0, T, key_mask[:, :T]))
        cache = stacked.new_cache(P * B, T + 1)
        stacked.hidden(idx[..., :T], pos[..., :T], causal_mask(0, T, key_mask[:, :T]), cache)
        step = stacked.hidden(idx[..., T:], pos[..., T:], causal_mask(T, 1, key_mask), cache)
        tree = next_token_tree(idx[0], key_mask[:B])
        every = lambda x: x[None].expand(P, *x.shape)
        nodes = stacked.hidden(every(tree.tokens), every(tree.pos), every(tree.mask).flatten(0, 1))
        logits = stacked.head(h)
        for p, m in enumerate(models):
            km, real = key_mask.view(P, B, T + 1)[p], key_mask.view(P, B, T + 1)[p, :, :T]
            alone = m.hidden(idx[p, :, :T], pos[p, :, :T], km[:, :T])
            assert torch.allclose(h[p][real], alone[real], atol=1e-5), p
            assert torch.allclose(logits[p][real], m.head(alone)[real], atol=1e-5), p
            own = m.new_cache(B, T + 1)
            m.hidden(idx[p, :, :T], pos[p, :, :T], km[:, :T], own)
            assert torch.allclose(
                step[p], m.hidden(idx[p, :, T:], pos[p, :, T:], km, own), atol=1e-5
            )
            assert torch.allclose(cache.k[:, p * B : (p + 1) * B], own.k, atol=1e-5), p
            tree_alone = m.hidden(tree.tokens, pos=tree.pos, attn_mask=tree.mask)
            assert torch.allclose(nodes[p], tree_alone, atol=1e-5), p
