"""decode.Decoder against its oracle, GPT.forward through the KV cache: logits, the cache it fills,
padding, and the prefill's sharing of repeated prompts (sampling.prefill), per member."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minigrpo.lm.decode import Decoder
from minigrpo.lm.model import GPT, GPTConfig, Weights, positions
from minigrpo.lm.sampling import prefill


def model_of(n_layer=2, n_head=2, n_embd=16, seed=0, block_size=16):
    torch.manual_seed(seed)
    return (
        GPT(
            GPTConfig(
                vocab_size=11, block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd
            )
        )
        .double()
        .eval()
    )


def left_padded(lengths, width, seed):
    """Rows of random ids, row i's last lengths[i] slots real, the rest padding: -> ids, key_mask
    (B, width)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 11, (len(lengths), width), generator=g)
    mask = torch.arange(width)[None, :] >= width - torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, 2), mask


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    steps=st.integers(1, 6),
    shape=st.sampled_from([(1, 1, 8), (2, 2, 16), (3, 4, 16)]),
    seed=st.integers(0, 2**16),
)
def test_decoder_equals_the_model_through_the_cache(lengths, steps, shape, seed):
    """A prefill of left-padded prompts, then one token per step: every step's logits and the whole
    cache agree with GPT.forward's (float64: to 1e-10)."""
    model, width = model_of(*shape, seed=seed % 7), max(lengths)
    ids, prompt_mask = left_padded(lengths, width, seed)
    new = torch.randint(
        3, 11, (len(lengths), steps), generator=torch.Generator().manual_seed(seed + 1)
    )
    key_mask = torch.cat([prompt_mask, torch.ones_like(new, dtype=torch.bool)], 1)
    padded = not bool(prompt_mask.all())
    km, pos = (key_mask if padded else None), positions(key_mask)
    decode = Decoder(model.weights())
    with torch.no_grad():
        want_cache, got_cache = (model.new_cache(len(lengths), width + steps) for _ in range(2))
        want = model(ids, pos[:, :width], None if km is None else km[:, :width], want_cache)[:, -1]
        got = decode(ids, pos[:, :width], got_cache, None if km is None else km[:, :width])
        assert (got - want).abs().max() < 1e-10
        for t in range(width, width + steps):
            m = None if km is None else km[:, : t + 1]
            want = model(new[:, t - width : t - width + 1], pos[:, t : t + 1], m, want_cache)[:, -1]
            got = decode(new[:, t - width : t - width + 1], pos[:, t : t + 1], got_cache, m)
            assert (got - want).abs().max() < 1e-10, f"step {t}"
    assert got_cache.length == want_cache.length == width + steps
    assert (got_cache.k - want_cache.k).abs().max() < 1e-10 and (
        got_cache.v - want_cache.v
    ).abs().max() < 1e-10


def test_decoder_refuses_to_run_past_block_size():
    model = model_of(block_size=6)
    cache = model.new_cache(2, 6)
    decode = Decoder(model.weights())
    with torch.no_grad():
        decode(torch.full((2, 6), 3), torch.arange(6).expand(2, 6), cache)
        with pytest.raises(ValueError, match="block_size"):
            decode(torch.full((2, 1), 3), torch.full((2, 1), 6), cache)


def test_decoder_computes_with_the_models_own_weights_in_any_memory_order():
    """The Decoder holds the model's own tensors (GPT keeps each Linear weight in (in, out) memory
    order, model.in_out_order: no copy per generate()); a model whose weights are ordinary (out, in)
    tensors decodes the same."""
    model, x = model_of(), torch.randint(3, 11, (2, 4))
    decode = Decoder(model.weights())
    qkv = model.blocks[0].attn.qkv.weight
    assert decode.weights.w["blocks.0.attn.qkv.weight"] is qkv
    with torch.no_grad():
        want = decode(x, torch.arange(4).expand(2, 4), model.new_cache(2, 4))
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                # (out, in), as nn.Linear makes it
                m.weight = torch.nn.Parameter(m.weight.detach().contiguous())
        other = Decoder(model.weights())
        assert (
            other(x, torch.arange(4).expand(2, 4), model.new_cache(2, 4)) - want
        ).abs().max() < 1e-12


call = Decoder.__call__  # the original, for the spy below


@pytest.mark.parametrize(
    "rows", [[0, 1, 2, 3], [2, 2, 0, 1, 1, 1, 2], [2, 0, 2, 1, 0, 2], [1, 1, 1]]
)
def test_prefill_computes_each_run_of_one_prompt_once_and_fills_every_row(rows, monkeypatch):
    """sampling.prefill shares a prompt repeated in a member's neighbouring rows (a GRPO group):
    logits and cache per row equal a prefill of every row by the member's own model, in the rows'
    own order, and each member's rows ran once per run of equal rows (as many as the member of
    most runs): one model's weights (P = 1), and two models' stacked, the second's rows in another
    order."""
    models = [model_of(), model_of(seed=1)]
    ids, mask = left_padded([3, 5, 2, 5], 5, seed=1)
    orders = [rows, rows[1:] + rows[:1]]
    runs = lambda r: 1 + sum(a != b for a, b in zip(r[1:], r[:-1]))
    stacked = Weights(
        models[0].cfg,
        {
            n: torch.stack([m.get_parameter(n) for m in models])
            for n, _ in models[0].named_parameters()
        },
    )
    for weights, P in ((models[0].weights(), 1), (stacked, 2)):
        at = torch.tensor(orders[:P])
        x, km = ids[at], mask[at]  # (P, B, L)
        pos, km = positions(km.flatten(0, 1)).view(x.shape), km.flatten(0, 1)
        km = None if bool(km.all()) else km
        decode, seen = Decoder(weights), []
        monkeypatch.setattr(
            Decoder, "__call__", lambda self, x, *a: seen.append(x.size(-2)) or call(self, x, *a)
        )
        with torch.no_grad():
            got, cache = prefill(decode, x, pos, km, 9)
            assert seen == [max(runs(r) for r in orders[:P])]
            assert cache.k.shape == (2, P * len(rows), 2, 9, 8) and cache.length == 5
            for p in range(P):
                want_cache = models[p].new_cache(len(rows), 9)
                rows_p = slice(p * len(rows), (p + 1) * len(rows))
                want = models[p](x[p], pos[p], None if km is None else km[rows_p], want_cache)
                assert (got[p] - want[:, -1]).abs().max() < 1e-10
                for mine, its in ((cache.k, want_cache.k), (cache.v, want_cache.v)):
                    assert (mine[:, rows_p] - its).abs().max() < 1e-10
        monkeypatch.undo()
