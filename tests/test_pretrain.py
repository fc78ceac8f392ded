"""Pretraining's full-batch step: every distinct line once, weighted by its count, is the loss (and the
gradient) of the whole corpus."""

import torch

from minigrpo.lm.model import GPT, GPTConfig
from minigrpo.pretrain import distinct_lines, encode_lines, lm_loss
from minigrpo.lm.tokenizer import CharTokenizer
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
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=food.BLOCK_SIZE, n_layer=1, n_head=2, n_embd=16))
    corpus = ["ravin likes pizza"] * 3 + ["jo likes apple pie"] + ["bob likes tacos"] * 2  # unequal lengths
    lines, counts = distinct_lines(corpus)
    full = lm_loss(model, encode_lines(tok, corpus, food.BLOCK_SIZE), tok.pad_id)
    g_full = torch.autograd.grad(full, list(model.parameters()))
    weighted = lm_loss(model, encode_lines(tok, lines, food.BLOCK_SIZE), tok.pad_id, torch.tensor(counts, dtype=torch.float))
    g_weighted = torch.autograd.grad(weighted, list(model.parameters()))
    assert torch.allclose(full, weighted, atol=1e-6), (full.item(), weighted.item())
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g_full, g_weighted)), "the gradients differ"
    unweighted = lm_loss(model, encode_lines(tok, lines, food.BLOCK_SIZE), tok.pad_id)
    assert not torch.allclose(full, unweighted, atol=1e-4), "counts must matter: the corpus is not uniform over lines"
