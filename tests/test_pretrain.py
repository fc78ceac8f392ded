"""Pretraining's full-batch step: every distinct line once, weighted by its count, is the loss (and
the gradient) of the whole corpus. What it logs: from step 0, densely early, without changing the
training."""

import math

import pytest
import torch

from minigrpo import pretrain
from minigrpo.lm.model import GPT, GPTConfig
from minigrpo.lm.tokenizer import CharTokenizer
from minigrpo.pretrain import distinct_lines, encode_lines, eval_loss, lm_loss
from toy_tasks import food


def test_distinct_lines_count_every_line_of_the_corpus():
    corpus = food.make_corpus(1600, seed=3)
    lines, counts = distinct_lines(corpus)
    assert len(lines) == len(set(corpus)) == len(food.PEOPLE) * len(food.FOODS)
    assert sum(counts) == len(corpus)
    assert all(corpus.count(line) == n for line, n in zip(lines, counts))


def test_weighted_distinct_lines_give_the_whole_corpus_loss_and_gradient():
    torch.manual_seed(0)
    tok = CharTokenizer(food.ALPHABET)
    model = GPT(
        GPTConfig(
            vocab_size=tok.vocab_size, block_size=food.BLOCK_SIZE, n_layer=1, n_head=2, n_embd=16
        )
    )
    # unequal lengths
    corpus = ["ravin likes pizza"] * 3 + ["jo likes apple pie"] + ["bob likes tacos"] * 2
    lines, counts = distinct_lines(corpus)
    full = lm_loss(model, encode_lines(tok, corpus, food.BLOCK_SIZE), tok.pad_id)
    g_full = torch.autograd.grad(full, list(model.parameters()))
    weighted = lm_loss(
        model,
        encode_lines(tok, lines, food.BLOCK_SIZE),
        tok.pad_id,
        torch.tensor(counts, dtype=torch.float),
    )
    g_weighted = torch.autograd.grad(weighted, list(model.parameters()))
    assert torch.allclose(full, weighted, atol=1e-6), (full.item(), weighted.item())
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g_full, g_weighted)), (
        "the gradients differ"
    )
    unweighted = lm_loss(model, encode_lines(tok, lines, food.BLOCK_SIZE), tok.pad_id)
    assert not torch.allclose(full, unweighted, atol=1e-4), (
        "counts must matter: the corpus is not uniform over lines"
    )


@pytest.mark.slow
def test_a_large_evaluation_in_parts_is_the_whole_mean(monkeypatch):
    """eval_loss over more than EVAL_ROWS rows (a large --n-lines, which held every row's
    activations at once) is the mean of the whole, weighted by counts too, to float rounding."""
    torch.manual_seed(0)
    tok = CharTokenizer(food.ALPHABET)
    model = GPT(
        GPTConfig(
            vocab_size=tok.vocab_size, block_size=food.BLOCK_SIZE, n_layer=1, n_head=2, n_embd=16
        )
    )
    lines, counts = distinct_lines(food.make_corpus(800, seed=0))
    data, counts = encode_lines(tok, lines, food.BLOCK_SIZE), torch.tensor(counts).float()
    whole = [eval_loss(model, data, tok.pad_id), eval_loss(model, data, tok.pad_id, counts)]
    monkeypatch.setattr(pretrain, "EVAL_ROWS", 7)  # parts of unequal lengths and weights
    parts = [eval_loss(model, data, tok.pad_id), eval_loss(model, data, tok.pad_id, counts)]
    assert len(data) > 7 and parts == pytest.approx(whole, rel=1e-6), (parts, whole)
    assert parts[0] != pytest.approx(parts[1], rel=1e-6)  # the counts weigh the parts


def test_pretraining_logs_from_step_0_densely_early_and_its_evaluations_change_nothing(tmp_path):
    """loss.png had 5 points from step 100 on: none of the learning. metrics.jsonl now holds step 0
    (the initial model) and steps 1, 2, 4, 8, ... below --eval-every, then every --eval-every; each
    row has the same fields. The extra evaluations draw no random numbers: the weights are those of
    a run that evaluates less."""
    from minigrpo.pretrain import PretrainConfig, train
    from minigrpo.util.jsonl import read_jsonl

    def pretrain(name, every):
        out = tmp_path / name
        train(
            PretrainConfig(
                out=str(out),
                device="cpu",
                steps=20,
                batch_size=64,
                n_embd=16,
                n_head=2,
                n_layer=1,
                n_lines=800,
                eval_every=every,
                ckpt_every=20,
            ),
            log=lambda *a: None,
        )
        return read_jsonl(out / "metrics.jsonl"), torch.load(out / "model.pt", weights_only=False)[
            "model"
        ]

    rows, weights = pretrain("dense", 10)
    assert [r["step"] for r in rows] == [0, 1, 2, 4, 8, 10, 20]
    assert all(set(r) == set(rows[-1]) for r in rows), [sorted(r) for r in rows]
    assert rows[0]["val_loss"] > rows[-1]["val_loss"] and math.isfinite(rows[0]["train_loss"])
    sparse_rows, sparse_weights = pretrain("sparse", 20)
    assert [r["step"] for r in sparse_rows] == [0, 1, 2, 4, 8, 16, 20]
    assert weights.keys() == sparse_weights.keys()
    assert all(torch.equal(weights[k], sparse_weights[k]) for k in weights), (
        "evaluations changed the training"
    )
    shared = {r["step"]: r for r in sparse_rows}
    assert all(r["val_loss"] == shared[r["step"]]["val_loss"] for r in rows if r["step"] in shared)
