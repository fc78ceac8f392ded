"""Command lines: --help, one-line errors with exit code 2, and (slow) each CLI end to end."""

import json
import pkgutil
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from conftest import one_line_error

import minigrpo
from minigrpo import dpo, grpo, ppo, pretrain, sample


def commands() -> list[str]:
    """Every `python -m minigrpo.<cli>`: a module of the package's root with a __main__ block, or a
    subpackage with a __main__.py."""
    root = Path(minigrpo.__file__).parent
    runs_as_main = lambda m: (
        (root / m.name / "__main__.py").is_file()
        if m.ispkg
        else 'if __name__ == "__main__":' in (root / f"{m.name}.py").read_text()
    )
    return sorted(m.name for m in pkgutil.iter_modules([str(root)]) if runs_as_main(m))


def help_of(command: str, monkeypatch, capsys, columns: int = 100) -> str:
    """`python -m minigrpo.<command> --help`, run in this process as `python -m` runs it: -> its
    stdout."""
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setattr(sys, "argv", [command, "--help"])
    with warnings.catch_warnings(), pytest.raises(SystemExit) as e:
        # runpy: the module is already imported (by other tests)
        warnings.simplefilter("ignore", RuntimeWarning)
        runpy.run_module(f"minigrpo.{command}", run_name="__main__", alter_sys=True)
    out, err = capsys.readouterr()
    assert e.value.code == 0 and out.startswith("usage: ") and "--" in out and not err, (
        command,
        e.value.code,
        err,
    )
    return out


def test_the_commands_are_found():
    assert {
        "pretrain",
        "grpo",
        "ppo",
        "dpo",
        "sample",
        "compare",
        "optimum",
        "metrics",
        "bench",
        "learn",
    } <= set(commands())


@pytest.mark.parametrize("command", commands())
def test_every_command_has_help(command, monkeypatch, capsys):
    out = help_of(command, monkeypatch, capsys, columns=100)
    assert f"python -m minigrpo.{command}" in out.splitlines()[0], (
        "usage names the command as it is typed"
    )
    assert all(len(line) <= 100 for line in out.splitlines()), [
        line for line in out.splitlines() if len(line) > 100
    ]


@pytest.mark.parametrize("columns", [60, 80, 100, 120])
def test_help_never_breaks_a_word_of_a_list_of_choices(columns, monkeypatch, capsys):
    """compare's --algos and bench's --only listed their choices with bare commas: argparse broke
    them mid-word ("pre fix"). Joined with ", ", the lines break between choices."""
    from minigrpo.bench.suite import SECTIONS
    from minigrpo.compare import ALGOS

    for command, choices in (("compare", ALGOS), ("bench", SECTIONS)):
        # a line break becomes a space
        flat = " ".join(help_of(command, monkeypatch, capsys, columns).split())
        assert ", ".join(choices) in flat, (command, columns, flat)


@pytest.mark.parametrize("module", [grpo, ppo, dpo])
def test_reward_help_shows_the_functions_signature_and_an_example_file(module, capsys):
    with pytest.raises(SystemExit):
        module.main(["--help"])
    text = capsys.readouterr().out
    reward = text[text.index("  --reward ") : text.index("  --person ")]
    lines = [line.strip() for line in reward.splitlines()]
    assert "(prompt, completion) -> float" in " ".join(reward.split()), reward
    assert (
        "def reward(prompt, completion):" in lines
        and 'return float(completion == "pizza")' in lines
    ), reward
    assert any(line.endswith("--reward my.py:reward") for line in lines), reward
    assert " ".join(reward.split()).count("(default: pizza)") == 1, reward


def test_help_shows_each_default_once(capsys):
    texts = {}
    for module in (pretrain, grpo, ppo):
        with pytest.raises(SystemExit):
            module.main(["--help"])
        # undo argparse's line wrapping
        texts[module] = text = " ".join(capsys.readouterr().out.split())
        assert "(default: None)" not in text, text
        for flag_help in text.split(" --")[1:]:
            assert flag_help.count("default") <= 1, flag_help
    assert "optimiser steps (default: 500)" in texts[pretrain]
    assert "(default runs/<algo>-<reward>) --" in texts[grpo]


def test_a_parser_is_made_once_for_each_config_and_defaults_and_parses_as_a_new_one():
    from dataclasses import dataclass, field

    from minigrpo.util import cli

    cli._parser.cache_clear()
    runs = [grpo.parse(["--seed", str(s), "--out", f"o{s}"]) for s in range(3)]
    assert [(c.seed, c.out) for c in runs] == [(0, "o0"), (1, "o1"), (2, "o2")]
    assert (cli._parser.cache_info().misses, cli._parser.cache_info().hits) == (1, 2)
    dapo = grpo.parse(["--preset", "dapo"])  # other defaults: a parser of their own
    assert cli._parser.cache_info().misses == 2 and dapo.loss_agg != runs[0].loss_agg
    assert grpo.parse([]) == grpo.parse([]) and grpo.parse([]).loss_agg == runs[0].loss_agg
    for _ in range(2):  # a made parser still says a bad flag in one line
        with pytest.raises(cli.UsageError, match="--steps: invalid int value"):
            grpo.parse(["--steps", "x"])

    @dataclass
    class Listed:
        names: str = field(default="a", metadata=cli.meta("names"))

    # no key: made anew
    assert cli.parse_config(Listed, [], defaults={"names": ["b", "c"]})[0].names == ["b", "c"]


def test_pretrain_bad_input(tmp_path, capsys):
    assert "unknown task 'chess'" in one_line_error(
        pretrain.main, ["--task", "chess", "--out", str(tmp_path / "a")], capsys
    )
    assert "--steps must be > 0" in one_line_error(
        pretrain.main, ["--steps", "0", "--out", str(tmp_path / "b")], capsys
    )
    f = tmp_path / "file.txt"
    f.write_text("keep me")
    assert "existing file" in one_line_error(
        pretrain.main, ["--out", str(f), "--steps", "1"], capsys
    )
    assert f.read_text() == "keep me", "nothing already written may be lost"
    assert "invalid int value" in one_line_error(pretrain.main, ["--steps", "many"], capsys)


def test_sample_bad_input(tmp_path, tiny_pretrained, capsys):
    ckpt, _, _ = tiny_pretrained
    assert "does not exist" in one_line_error(
        sample.main, ["--checkpoint", str(tmp_path / "no.pt")], capsys
    )
    err = one_line_error(
        sample.main, ["--checkpoint", str(ckpt), "--prompt", "Ravin likes "], capsys
    )
    assert "'R'" in err and "allowed" in err
    assert "--num must be > 0" in one_line_error(
        sample.main, ["--checkpoint", str(ckpt), "--num", "0"], capsys
    )


def test_sample_json_lines(tiny_pretrained, capsys):
    ckpt, _, _ = tiny_pretrained
    sample.main(["--checkpoint", str(ckpt), "--num", "5", "--json", "--seed", "1"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 5 and all(set(r) == {"completion", "finished"} for r in rows)
    assert all(isinstance(r["completion"], str) and isinstance(r["finished"], bool) for r in rows)


def run_cli(*args, cwd):
    p = subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.slow
def test_each_cli_end_to_end_for_a_few_steps(tmp_path):
    run_cli(
        "minigrpo.pretrain",
        "--steps",
        "30",
        "--eval-every",
        "10",
        "--out",
        "runs/pretrain",
        cwd=tmp_path,
    )
    assert {"model.pt", "config.json", "metrics.jsonl", "loss.png"} <= {
        p.name for p in (tmp_path / "runs/pretrain").iterdir()
    }
    out = run_cli(
        "minigrpo.sample", "--checkpoint", "runs/pretrain/model.pt", "--num", "5", cwd=tmp_path
    )
    assert "completion" in out and "share" in out
    for cli in ("minigrpo.grpo", "minigrpo.ppo"):
        run_cli(cli, "--reward", "pizza", "--steps", "3", cwd=tmp_path)
    for name in ("grpo-pizza", "ppo-pizza"):
        assert {"model.pt", "config.json", "metrics.jsonl", "metrics.png", "samples.txt"} <= {
            p.name for p in (tmp_path / "runs" / name).iterdir()
        }
    assert "speed-up" in run_cli("minigrpo.bench", "--quick", cwd=tmp_path)
    assert not (tmp_path / "docs").exists()  # --quick alone: printed only
    run_cli("minigrpo.bench", "--quick", "--docs", "docs", cwd=tmp_path)
    # the cwd's docs/, never the repository's
    page = (tmp_path / "docs" / "performance.md").read_text()
    assert (
        "<!-- bench:sampling -->" in page
        and "<!-- /bench:threads -->" in page
        and "speed-up" in page
    )


def interrupt_when(path, args, cwd):
    """Start a CLI, send Ctrl-C (SIGINT) once `path` exists, and return (exit code, output)."""
    import signal
    import time

    p = subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 300
    while not path.exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=120)
    return p.returncode, out


@pytest.mark.slow
def test_ctrl_c_keeps_the_last_checkpoint_and_rl_resumes_from_it(tmp_path):
    from minigrpo.lm.checkpoint import load_checkpoint, read_checkpoint

    ckpt = tmp_path / "runs/pretrain/model.pt"
    code, out = interrupt_when(
        ckpt,
        ["minigrpo.pretrain", "--steps", "100000", "--ckpt-every", "20", "--out", "runs/pretrain"],
        tmp_path,
    )
    assert (
        code == 130 and "last complete checkpoint" in out and str(ckpt.relative_to(tmp_path)) in out
    ), out
    load_checkpoint(ckpt)  # intact
    rl = tmp_path / "runs/grpo-pizza/model.pt"
    code, out = interrupt_when(
        rl, ["minigrpo.grpo", "--steps", "100000", "--ckpt-every", "2"], tmp_path
    )
    step = read_checkpoint(rl)["step"]
    assert (
        code == 130
        and out.strip().splitlines()[-1]
        == f"interrupted: checkpoint at step {step} written to "
        f"runs/grpo-pizza/model.pt; continue with --resume runs/grpo-pizza"
    ), out
    run_cli("minigrpo.grpo", "--resume", "runs/grpo-pizza", "--steps", str(step + 2), cwd=tmp_path)
    assert read_checkpoint(rl)["step"] == step + 2


@pytest.mark.slow
def test_a_closed_pipe_ends_a_cli_quietly(tiny_pretrained):
    """`python -m minigrpo.sample ... | head -2`: the reader goes away; no traceback, exit code 141
    (SIGPIPE)."""
    init, _, _ = tiny_pretrained
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "minigrpo.sample",
            "--checkpoint",
            str(init),
            "--num",
            "5000",
            "--threads",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.readline()
    p.stdout.close()  # like `head` exiting after the lines it wanted
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and "Traceback" not in err, err


@pytest.mark.parametrize("command", ["minigrpo.grpo", "minigrpo.pretrain"])
@pytest.mark.slow
def test_a_closed_pipe_stops_a_runs_printing_not_the_run(tmp_path, tiny_pretrained, command):
    """`python -m minigrpo.grpo | head -1`: the run goes on silent to its end, writes every file and
    exits 0."""
    init, _, _ = tiny_pretrained
    args = {
        "minigrpo.grpo": [
            "--init",
            str(init),
            "--steps",
            "3",
            "--goal",
            "0",
            "--group-size",
            "4",
            "--max-new-tokens",
            "8",
        ],
        "minigrpo.pretrain": [
            "--steps",
            "3",
            "--n-embd",
            "16",
            "--n-head",
            "2",
            "--eval-every",
            "1",
        ],
    }[command]
    out = tmp_path / "run"
    p = subprocess.Popen(
        [sys.executable, "-m", command, *args, "--threads", "1", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.readline()
    p.stdout.close()  # like `head -1` exiting
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 0 and "Traceback" not in err, err
    assert json.loads((out / "summary.json").read_text())[
        "step" if command == "minigrpo.grpo" else "val_loss"
    ]
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert (out / "model.pt").is_file() and json.loads(rows[-1])["step"] == 3


def test_a_finished_command_leaves_every_output_whole_and_exits_0(tmp_path, tiny_pretrained):
    """The CLIs end with cli.exit_now (no interpreter teardown): every file and the last printed
    line are complete."""
    import torch

    from minigrpo.util.jsonl import read_jsonl

    init, _, _ = tiny_pretrained
    out = tmp_path / "run"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "minigrpo.grpo",
            "--init",
            str(init),
            "--reward",
            "pizza",
            "--steps",
            "2",
            "--goal",
            "0",
            "--group-size",
            "4",
            "--max-new-tokens",
            "8",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    # the last line printed arrived whole
    assert p.stdout.rstrip().endswith("--num 1000"), p.stdout[-300:]
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [0, 1, 2]
    assert json.loads((out / "summary.json").read_text())["step"] == 2
    assert (out / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (
        out / "samples.txt"
    ).stat().st_size > 0
    # the run may have trained on a GPU that this process does not see: load it onto the CPU
    assert torch.load(out / "model.pt", map_location="cpu", weights_only=False)["step"] == 2


@pytest.mark.slow
def test_under_a_profiler_a_command_exits_the_ordinary_way_so_the_profile_is_written(
    tmp_path, tiny_pretrained
):
    """cli.exit_now leaves the exit to a watching profiler (`python -m cProfile -o F -m
    minigrpo.grpo ...`)."""
    init, _, _ = tiny_pretrained
    prof = tmp_path / "grpo.prof"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "cProfile",
            "-o",
            str(prof),
            "-m",
            "minigrpo.grpo",
            "--init",
            str(init),
            "--reward",
            "pizza",
            "--steps",
            "1",
            "--goal",
            "0",
            "--group-size",
            "4",
            "--max-new-tokens",
            "8",
            "--no-plot",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    import pstats

    assert pstats.Stats(str(prof)).total_calls > 0
