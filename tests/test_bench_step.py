"""bench's `step` section (minigrpo/bench/step.py), our side only, on a tiny model for a few steps:
it must run without trl, print our three rows with positive finite times, leave the shared-prefix
forward in place afterwards, and copy our weights into GPT-2's layout exactly when transformers is
there. No timed asserts."""

import math
import re

import pytest
import torch

from minigrpo.bench.step import (
    NO_KL,
    OURS,
    PLAIN,
    RECORDED,
    TRL,
    as_gpt2,
    bench_step,
    fresh_gpt,
    plain_forward,
)
from minigrpo.lm import logprobs, sampling


def test_our_rows_have_positive_finite_times_without_trl():
    text = bench_step(steps=3, rounds=1, n_layer=1, n_head=2, n_embd=16, use_trl=False)
    rows = {r.split("|")[1].strip(): r for r in text.splitlines() if r.startswith("| minigrpo")}
    assert set(rows) == {OURS, PLAIN, NO_KL}, text  # β = 0 without trl: the --no-rollout-kl row too
    assert TRL not in text and f"via the recorded plain/TRL {RECORDED}" in text, text
    for row in rows.values():
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert cells[1] == "3", row
        median, low, high = map(
            float, re.fullmatch(r"([\d.]+) \(([\d.]+)–([\d.]+)\)", cells[2]).groups()
        )
        assert (
            all(math.isfinite(x) and x > 0 for x in (median, low, high)) and low <= median <= high
        ), row
        assert 0 < float(cells[3].split()[0]) and 0 < float(cells[4]) <= 12, row


def test_plain_forward_is_patched_only_inside():
    before = (logprobs.shifted_forward, sampling.Generation.prefix_tree)
    with plain_forward():
        assert logprobs.shifted_forward is not before[0]
    assert (logprobs.shifted_forward, sampling.Generation.prefix_tree) == before


def test_gpt2_copy_is_the_same_function():
    transformers = pytest.importorskip("transformers")
    ours = fresh_gpt(2, 2, 16)
    x = torch.randint(3, ours.cfg.vocab_size, (3, 10))
    with torch.no_grad():
        assert (as_gpt2(ours, transformers)(x).logits - ours(x)).abs().max() < 1e-5
