"""Properties of minigrpo/lm/logprobs.py's pure piece: completion_token_logprobs, the masked
log-probs of a completion (the shift by one, where the completion starts, and nothing after the
first EOS)."""

import torch
from conftest import SET, call, right_padded
from hypothesis import given
from hypothesis import strategies as st

from minigrpo.lm.logprobs import completion_token_logprobs, pad_left

V = 7


def case(seed, B, P, N, lengths):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, P + N - 1, V, generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (B, P + N), generator=g)
    return logits, ids, right_padded(lengths, N)


@st.composite
def cases(draw):
    B, P, N = draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, N), min_size=B, max_size=B))
    return draw(st.integers(0, 10**6)), B, P, N, lengths


@SET
@given(cases())
def test_each_completion_token_is_scored_by_the_logits_one_slot_before_it(c):
    seed, B, P, N, lengths = c
    logits, ids, mask = case(seed, B, P, N, lengths)
    out = call(completion_token_logprobs, logits, ids, P, mask, shape=(B, N))
    for b in range(B):
        for j in range(N):
            want = (
                torch.log_softmax(logits[b, P - 1 + j], -1)[ids[b, P + j]].item()
                if mask[b, j]
                else 0.0
            )
            assert abs(out[b, j].item() - want) < 1e-5, (
                f"row {b}, completion token {j}: got {out[b, j].item():.6f}, want {want:.6f} = "
                "log_softmax(logits"
                f"[{b}, P-1+{j}])[ids[{b}, P+{j}]] (logits[:, t] predicts ids[:, t+1]; 0 after "
                "the first EOS)"
            )


@SET
@given(cases())
def test_tokens_after_the_end_count_nothing_and_get_no_gradient(c):
    seed, B, P, N, lengths = c
    logits, ids, mask = case(seed, B, P, N, lengths)
    logits.requires_grad_(True)
    out = call(completion_token_logprobs, logits, ids, P, mask, shape=(B, N))
    assert (out[~mask] == 0).all(), (
        "slots after the first EOS must be exactly 0 (they are PAD, not completion)"
    )
    out.sum().backward()
    # prompt positions + masked ones
    after_end = ~torch.cat([torch.zeros(B, P - 1, dtype=torch.bool), mask], 1)
    assert (logits.grad[after_end] == 0).all(), (
        "only the logits that predict valid completion tokens get gradient"
    )


def test_the_prompt_logits_change_nothing():
    logits, ids, mask = case(0, 3, 4, 5, [5, 2, 0])
    other = logits.clone()
    # the logits that predict prompt tokens
    other[:, :3] = torch.randn(3, 3, V, dtype=torch.float64)
    ids2 = ids.clone()
    ids2[:, :4] = 0  # the prompt itself does not enter either
    a = call(completion_token_logprobs, logits, ids, 4, mask)
    b = call(completion_token_logprobs, other, ids2, 4, mask)
    assert torch.equal(a, b), "completion log-probs depend on the prompt's logits or ids"


@SET
@given(st.lists(st.lists(st.integers(1, 30), max_size=6), min_size=1, max_size=5))
def test_pad_left_right_aligns_every_row_and_masks_exactly_its_tokens(rows):
    ids, mask = pad_left(rows, 0)
    width = max(len(r) for r in rows)
    assert (
        ids.shape == mask.shape == (len(rows), width)
        and ids.dtype == torch.long
        and mask.dtype == torch.bool
    )
    for i, r in enumerate(rows):
        pad = width - len(r)
        assert ids[i, pad:].tolist() == r and mask[i].tolist() == [False] * pad + [True] * len(r), (
            rows,
            ids,
            mask,
        )
        assert (ids[i, :pad] == 0).all(), (rows, ids)
