"""Shared fixtures. Tests run on one thread with tiny models so the default run stays fast."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_pretrained(tmp_path_factory):
    """A tiny food model pretrained for a few seconds: (checkpoint path, model, tokenizer)."""
    from minigrpo.checkpoint import load_checkpoint
    from minigrpo.pretrain import PretrainConfig, train

    out = tmp_path_factory.mktemp("pretrain")
    train(PretrainConfig(out=str(out), steps=250, batch_size=64, n_embd=32, n_head=2, lr=1e-2,
                         n_lines=1600, eval_every=250, ckpt_every=250), log=lambda *a: None)
    model, tok, _ = load_checkpoint(out / "model.pt")
    return out / "model.pt", model, tok
