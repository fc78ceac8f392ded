import pytest
import torch

from minigrpo.lm.draws import exponential_race, process_logits
from minigrpo.lm.logprobs import sequence_logprobs
from minigrpo.lm.model import GPT, GPTConfig, positions
from minigrpo.lm.sampling import encode_prompts, generate, read_completions
from minigrpo.lm.tokenizer import EOS_ID, PAD_ID

PROMPTS = ["ravin likes ", "jo likes ", "dmitri likes ", "bob likes "]  # different lengths


def _gen(model, tok, use_cache, seed=0, n=4, prompts=PROMPTS, **kw):
    ids, mask = encode_prompts(tok, prompts * n)
    return generate(
        model,
        ids,
        mask,
        max_new_tokens=14,
        generator=torch.Generator().manual_seed(seed),
        use_cache=use_cache,
        **kw,
    )


def test_kv_cache_logprobs_equal_the_slow_path_for_prompts_of_different_lengths(tiny_pretrained):
    _, model, tok = tiny_pretrained
    # the prefill computes each distinct prompt once (sampling.prefill)
    mixed = PROMPTS[2:] + PROMPTS + PROMPTS[:1]
    for kw in ({}, {"temperature": 0.7, "top_k": 5}, {"n": 1}, {"n": 1, "prompts": mixed}):
        fast, slow = _gen(model, tok, True, **kw), _gen(model, tok, False, **kw)
        assert torch.equal(fast.ids, slow.ids), "cache and slow path sampled different tokens"
        assert torch.equal(fast.completion_mask, slow.completion_mask)
        assert (fast.logprobs - slow.logprobs).abs().max() < 1e-5


def test_sampled_logprobs_equal_one_teacher_forced_forward(tiny_pretrained):
    _, model, tok = tiny_pretrained
    g = _gen(model, tok, True)
    with torch.no_grad():
        lp = sequence_logprobs(model, g.ids, g.key_mask)[:, g.prompt_len - 1 :]
    diff = torch.where(g.completion_mask, lp - g.logprobs, torch.zeros_like(lp)).abs().max()
    assert diff < 1e-5, f"sampler log-probs differ from a full forward by {diff}"


def test_completion_mask_covers_up_to_and_including_the_first_eos(tiny_pretrained):
    _, model, tok = tiny_pretrained
    g = _gen(model, tok, True, n=8)
    comp = g.completion_ids
    for row, mask, fin in zip(comp, g.completion_mask, g.finished):
        n_valid = int(mask.sum())
        assert mask[:n_valid].all() and not mask[n_valid:].any(), "mask is not a prefix"
        eos_at = (row == EOS_ID).nonzero().flatten().tolist()
        if fin:
            assert eos_at and eos_at[0] == n_valid - 1, (
                "the first EOS must be the last masked token"
            )
            assert (row[n_valid:] == PAD_ID).all(), "slots after the end must be PAD"
        else:
            assert not eos_at and n_valid == len(row), "an unfinished row keeps every token"
    assert (g.logprobs[~g.completion_mask] == 0).all()


def test_unfinished_rows_are_masked_and_flagged(tiny_pretrained):
    _, model, tok = tiny_pretrained
    ids, mask = encode_prompts(tok, PROMPTS)
    g = generate(model, ids, mask, max_new_tokens=2, generator=torch.Generator().manual_seed(0))
    assert not g.finished.any() and g.completion_mask.all() and g.completion_ids.shape == (4, 2)


def test_sampling_is_reproducible_with_a_fixed_generator(tiny_pretrained):
    _, model, tok = tiny_pretrained
    a, b, c = (
        _gen(model, tok, True, seed=3),
        _gen(model, tok, True, seed=3),
        _gen(model, tok, True, seed=4),
    )
    assert torch.equal(a.ids, b.ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.ids, c.ids)


def test_loop_stops_early_when_every_row_has_ended(tiny_pretrained):
    _, model, tok = tiny_pretrained
    g = _gen(model, tok, True)
    assert g.finished.all(), "a pretrained model should end every food line within 14 tokens"
    assert g.completion_ids.shape[1] == int(g.completion_mask.sum(1).max())
    assert all(t.strip() for t in read_completions(tok, [g])[0][0])


def test_top_k_one_is_greedy_and_top_p_keeps_the_smallest_nucleus():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    k1 = process_logits(logits, top_k=1)
    assert torch.isfinite(k1).sum() == 1 and k1.argmax() == 0
    p = logits.softmax(-1)[0]  # [0.61, 0.22, 0.14, 0.03]
    kept = torch.isfinite(process_logits(logits, top_p=0.7))[0]
    assert kept.tolist() == [True, True, False, False], f"probs {p.tolist()}"
    assert torch.isfinite(process_logits(logits, top_p=0.5))[0].tolist() == [
        True,
        False,
        False,
        False,
    ]


def test_prompt_too_long_for_block_size_is_an_error():
    model = GPT(GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=8))
    try:
        generate(model, torch.ones(1, 4, dtype=torch.long), max_new_tokens=3)
    except ValueError as e:
        assert "block_size" in str(e)
    else:
        raise AssertionError("expected ValueError")


def test_exponential_race_draws_what_multinomial_draws_and_follows_the_probabilities():
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2], [0.0, 0.0, 1.0, 0.0], [0.1, 0.1, 0.1, 0.7]])
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    draws = torch.stack([exponential_race(probs, g1) for _ in range(20000)])  # (20000, 3)
    same = torch.stack([torch.multinomial(probs, 1, generator=g2).squeeze(1) for _ in range(20000)])
    assert torch.equal(draws, same), (
        "the race no longer draws what torch.multinomial draws (a torch change?)"
    )
    freq = torch.stack([(draws == v).float().mean(0) for v in range(4)], 1)  # (3, 4)
    assert (freq - probs).abs().max() < 0.015 and (freq[probs == 0] == 0).all()


def test_with_the_noise_drawn_ahead_each_token_races_its_slice_of_one_draw(
    tiny_pretrained, monkeypatch
):
    """NOISE_AHEAD (a GPU's; here on the CPU): a call draws Exp(1) noise (n_max, B, V) once, from
    its generator, and token n of every row is argmax p_n / E[n], p_n its distribution after the
    tokens before (one teacher-forced forward: the oracle)."""
    from minigrpo.lm import sampling

    _, model, tok = tiny_pretrained
    monkeypatch.setattr(sampling, "NOISE_AHEAD", ("cpu",))
    ids, mask = encode_prompts(tok, PROMPTS * 4)
    drawn = torch.Generator().manual_seed(5)
    g = generate(model, ids, mask, max_new_tokens=14, generator=drawn)
    ahead = torch.Generator().manual_seed(5)
    # (n_max, B, V)
    noise = torch.empty(14, ids.size(0), model.cfg.vocab_size).exponential_(generator=ahead)
    assert torch.equal(drawn.get_state(), ahead.get_state()), (
        "the call drew other than its noise at once"
    )
    with torch.no_grad():
        # (B, N, V)
        logits = model(g.ids, pos=positions(g.key_mask), key_mask=g.key_mask)[
            :, g.prompt_len - 1 : -1
        ]
    # (B, N)
    race = (logits.softmax(-1) / noise[: g.completion_ids.size(1)].transpose(0, 1)).argmax(-1)
    assert torch.equal(race[g.completion_mask], g.completion_ids[g.completion_mask])
    # a token at a time: it stops drawing with the call's last token
    monkeypatch.setattr(sampling, "NOISE_AHEAD", ())
    alone = torch.Generator().manual_seed(5)
    generate(model, ids, mask, 14, generator=alone)
    assert g.completion_ids.size(1) < 14 and not torch.equal(alone.get_state(), drawn.get_state())


def test_a_model_with_nan_weights_is_an_error_not_silent_samples():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=2, n_embd=8)).eval()
    with torch.no_grad():
        model.blocks[0].mlp[0].weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        generate(
            model,
            torch.full((2, 3), 4),
            max_new_tokens=4,
            generator=torch.Generator().manual_seed(0),
        )


@pytest.mark.cuda
def test_a_decoding_step_on_a_gpu_equals_the_cpus():
    """On a GPU, attention() computes one query by one_query_attention; a cached decoding step's
    logits there equal the CPU's (SDPA's) to float32 rounding."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=4, n_embd=32)).eval()
    idx = torch.randint(11, (6, 9))
    key_mask = torch.ones(6, 9, dtype=torch.bool)
    key_mask[:3, :4] = False  # left padding
    logits = {}
    for device in ("cpu", "cuda"):
        m, ids, km = model.to(device), idx.to(device), key_mask.to(device)
        cache = m.new_cache(6, 16)
        with torch.no_grad():
            pos = positions(km)
            m(ids[:, :8], pos=pos[:, :8], key_mask=km[:, :8], cache=cache)
            logits[device] = m(ids[:, 8:], pos=pos[:, 8:], key_mask=km, cache=cache).cpu()
    assert torch.allclose(logits["cpu"], logits["cuda"], atol=1e-4), (
        "a decoding step on the GPU must give the CPU's logits to float32 rounding"
    )
