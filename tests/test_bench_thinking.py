"""bench's thinking section (minigrpo/bench/thinking.py): its writer on fabricated run folders and
untrained checkpoints (no training): four experiments, each question → setup → table → conclusion,
the differences called only as compare calls them, and the block's place in docs/experiments.md."""

import json

import pytest
import torch

from minigrpo.bench import pages, thinking
from minigrpo.bench.thinking import ALGOS, CONSTANT, DEFAULT, STEPS, crossing, thinking_block
from minigrpo.lm.checkpoint import save_checkpoint
from minigrpo.lm.model import GPT, GPTConfig
from minigrpo.lm.tokenizer import CharTokenizer
from toy_tasks import sums

KEYS = (
    "exact_think_rate",
    "exact_len_mean",
    "exact_len_mean_correct",
    "exact_accuracy",
    "exact_think_rate_heldout",
    "exact_entropy",
)


def fabricated_run(folder, checkpoint, seed, wrong_length):
    """A finished 30-step run whose think rate rises 0.2 → 0.9 (passing 0.5 at step 13) and whose
    wrong answers' length moves to `wrong_length` + a seed's jitter."""
    folder.mkdir(parents=True)
    rows = []
    for s in range(STEPS + 1):
        think = 0.2 + 0.7 * s / STEPS
        row = {k: think for k in KEYS} | {"step": s, "target_rate": think}
        row["exact_len_mean_wrong"] = 8 + (wrong_length - 8) * s / STEPS + 0.01 * seed
        rows.append(row)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "summary.json").write_text(json.dumps({"step": STEPS, "stop_reason": "steps"}))
    (folder / "model.pt").write_bytes(checkpoint.read_bytes())
    return folder


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("thinking")
    tok = CharTokenizer(sums.ALPHABET)
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=tok.vocab_size, block_size=sums.BLOCK_SIZE, n_layer=1, n_head=1, n_embd=8
    )
    init = root / "pretrain-sums" / "model.pt"
    init.parent.mkdir()
    save_checkpoint(init, GPT(cfg), tok, "sums", 1)
    for a in ALGOS:
        for s in range(10):
            fabricated_run(root / "thinking" / f"{a}-s{s}", init, s, 20 if a == CONSTANT else 14)
    return root / "thinking", init


@pytest.mark.slow  # its bootstraps take seconds
def test_the_four_experiments_are_written_with_their_tables_and_calls(sweep, monkeypatch):
    """The policies' per-prompt figures stand in for the checkpoints' (test_policies_... computes
    them): every policy right with probability 0.5 on every prompt."""
    folder, init = sweep
    half = torch.full((11, len(sums.PROMPTS)), 0.5, dtype=torch.float64)
    monkeypatch.setattr(thinking, "policies", lambda runs, init: (half, half))
    block = thinking_block(folder, init)
    for question in ("### (a)", "### (b)", "### (c)", "### (d)"):
        assert question in block
    assert block.index("### (a)") < block.index("### (b)") < block.index("### (c)")
    assert "the think rate passes 0.5 at step 13 (seeds 13–13; NaN: never)" in block
    # constant normalisation: wrong answers 6 tokens longer on every seed, n = 10: called
    assert "constant − per-sequence 6.00 [" in block and ": higher." in block
    # every algorithm's entropy is the same curve: no difference shown
    assert block.count("(no difference shown)") == 3
    # pass@k of π_ref and of the final policies (all alike here): 1 − 0.5^k, no prompt lowered
    assert (
        "| 4 | 0.9375 | 0.938 (0.938–0.938) | 0.000 (0.000–0.000) | 0.000 (0.000–0.000) |" in block
    )
    assert "The most any run lowered a prompt's pass@k: 0 at k = 1," in block
    assert "final entropy lies +0.000 to +0.000 nats" in block
    assert "| 3 | " in block and "| 4 | " in block, "by number of operands"
    assert (folder / "thinking.png").read_bytes()[:4] == b"\x89PNG" and "thinking.png" in block


@pytest.mark.slow
def test_policies_are_pi_ref_then_each_runs_final_checkpoint(sweep):
    folder, init = sweep
    accuracy, think = thinking.policies([folder / f"{DEFAULT}-s0"], init)
    assert accuracy.shape == think.shape == (2, len(sums.PROMPTS))
    assert torch.equal(accuracy[0], accuracy[1]) and torch.equal(think[0], think[1])
    assert (0 < accuracy).all() and (accuracy + think <= 2).all() and (think < 1).all()


def test_a_run_that_never_thinks_has_no_crossing(tmp_path, sweep):
    folder, _ = sweep
    assert crossing(folder / f"{DEFAULT}-s0") == 13
    assert crossing(folder / f"{DEFAULT}-s0", level=2.0) != crossing(folder / f"{DEFAULT}-s0")


def test_the_block_goes_to_experiments_md():
    assert pages.page_of("thinking-sums") == pages.EXPERIMENTS
