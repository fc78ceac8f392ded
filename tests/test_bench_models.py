"""bench/models.py: the default recipes from each pretrained model, a row a model."""

import json

import pytest

from minigrpo.bench.models import bench_models
from minigrpo.pretrain import PretrainConfig, train

SHORT = (
    "--steps",
    "3",
    "--group-size",
    "4",
    "--prompts-per-step",
    "2",
    "--preserve-per-prompt",
    "2",
)


@pytest.mark.slow
def test_a_row_per_model_from_compare_runs_that_start_from_it(tmp_path, tiny_pretrained):
    first, _, _ = tiny_pretrained
    train(
        PretrainConfig(
            out=str(tmp_path / "second"),
            device="cpu",
            steps=250,
            batch_size=64,
            n_embd=32,
            n_head=2,
            lr=1e-2,
            n_lines=1600,
            eval_every=250,
            ckpt_every=250,
            seed=1,
        ),
        log=lambda *a: None,
    )
    second = tmp_path / "second" / "model.pt"
    text = bench_models(
        tmp_path, [first, second], seeds=2, jobs=2, rewards={"pizza": "pizza"}, extra=SHORT
    )
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == [
        "pretrained model (seed): its malformed mass",
        "default GRPO, pizza",
        "PPO, pizza",
        "peak drift, most",
        "peak malformed, most",
        "steps the trust region shrank (GRPO)",
    ], header
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert len(rows) == 2, text
    for k, (model, row) in enumerate(zip((first, second), rows)):
        folder = tmp_path / "models" / f"m{k}-pizza"
        command = json.loads((folder / "ppo-s1" / "compare_command.json").read_text())["command"]
        # each row's runs start from its model
        assert command[command.index("--init") + 1] == str(model), command
        start = json.loads((folder / "default-s0" / "metrics.jsonl").read_text().splitlines()[0])[
            "malformed"
        ]
        assert row[0] == f"{k}: {start:.4f}", row
        for cell in row[1:3]:  # 3 steps of a tiny model: no run reaches 0.95, each within or not
            within, steps = cell.split(", ", 1)
            assert within in ("0/2", "1/2", "2/2") and steps == "never", row
        assert 0 <= float(row[3]) <= 1 and 0 <= float(row[4]) <= 1, row
        assert row[5].endswith(" of 3"), row
