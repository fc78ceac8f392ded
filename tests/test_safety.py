"""Nothing a user types or does loses work or shows a traceback: the output folder (refusals, lock,
stale temp files, --overwrite), a full disk, bad pretrain and sample flags, and Ctrl-C at
start-up."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import one_line_error

import minigrpo
from minigrpo import pretrain, sample
from minigrpo.lm.checkpoint import read_checkpoint, save_checkpoint
from minigrpo.lm.model import GPT, GPTConfig
from minigrpo.lm.tokenizer import CharTokenizer
from minigrpo.util.cli import UsageError, main_guard
from minigrpo.util.outputs import MARK, prepare_out, release_out, write_json

TINY = [
    "--steps",
    "2",
    "--n-lines",
    "200",
    "--n-embd",
    "8",
    "--n-head",
    "1",
    "--n-layer",
    "1",
    "--batch-size",
    "8",
    "--eval-every",
    "1",
    "--ckpt-every",
    "1",
    "--warmup",
    "1",
]


def old_run(folder):
    prepare_out(str(folder))  # a run of ours claimed the folder (and marked it) ...
    release_out(folder)  # ... and ended
    for name in (
        "model.pt",
        "metrics.jsonl",
        "summary.json",
        "config.json",
        "loss.png",
        "samples.txt",
        "notes.txt",
    ):
        (folder / name).write_text("old " + name)
    return folder


# --- the output folder ----------------------------------------------------------------------------


def test_an_existing_run_is_refused_and_kept(tmp_path):
    run = old_run(tmp_path / "run")
    with pytest.raises(UsageError, match="already holds a run") as e:
        prepare_out(str(run))
    assert str(run) in str(e.value) and "--overwrite" in str(e.value) and "\n" not in str(e.value)
    assert (run / "model.pt").read_text() == "old model.pt", "a refusal touches nothing"
    assert prepare_out(str(run), resume=True) == run and (run / "model.pt").exists()
    release_out(run)


def test_compare_and_bench_refuse_a_run_folder_without_asking_for_an_overwrite_they_ignore(
    tmp_path, capsys, tiny_pretrained
):
    """`compare --out <a run's folder> --overwrite` said "pass --overwrite to replace it": compare
    and bench write folders of runs and no flag of theirs replaces a run, so the line says so and
    what to do instead, with or without --overwrite; the run is kept."""
    from minigrpo import compare
    from minigrpo.bench.suite import main as bench

    run = old_run(tmp_path / "run")
    init = ["--init", str(tiny_pretrained[0])]  # a clean clone has no runs/pretrain/model.pt
    for main, argv in (
        (compare.main, ["--out", str(run), "--overwrite", "--seeds", "1", "--algos", "default"]),
        (compare.main, ["--out", str(run), "--seeds", "1", "--algos", "default"]),
        (bench, ["--out", str(run), "--only", "sampling"]),
    ):
        argv = argv + init if main is compare.main else argv
        err = one_line_error(main, argv, capsys)
        assert str(run) in err and "give another --out" in err and "pass --overwrite" not in err
        assert (run / "model.pt").read_text() == "old model.pt", err
    with pytest.raises(UsageError, match="holds a run's own files"):
        prepare_out(str(run), overwrite=True, runs_inside="compare")
    assert sorted(p.name for p in run.iterdir()) == sorted(
        [".lock", "model.pt", "metrics.jsonl", "summary.json", "config.json", "loss.png"]
        + ["samples.txt", "notes.txt"]
    )


def test_a_run_refuses_a_folder_of_runs_and_writes_nothing_there(tmp_path):
    """`grpo --out <compare's folder>` wrote a run beside compare's run folders, and compare then
    refused its own folder: a folder claimed by compare or bench is marked as a folder of runs, and
    a run's --out there is one line naming a folder inside instead; nothing is written."""
    folder = prepare_out(str(tmp_path / "sweep"), runs_inside="compare")
    release_out(folder)
    before = (folder / ".lock").read_text()
    for flags in ({}, {"overwrite": True}, {"resume": True}):
        with pytest.raises(UsageError, match="is a folder of compare's runs") as e:
            prepare_out(str(folder), **flags)
        assert str(folder / "my-run") in str(e.value) and "\n" not in str(e.value)
    assert [p.name for p in folder.iterdir()] == [".lock"] and (
        folder / ".lock"
    ).read_text() == before
    # compare claims it again; a run claims a folder inside it
    release_out(prepare_out(str(folder), runs_inside="compare"))
    assert prepare_out(str(folder / "grpo-s0")) == folder / "grpo-s0"
    # a folder of runs from before the mark (a run's mark, no run's files) is marked when claimed
    old = tmp_path / "old-sweep"
    old.mkdir()
    (old / ".lock").write_text(MARK)
    release_out(prepare_out(str(old), runs_inside="bench"))
    with pytest.raises(UsageError, match="is a folder of bench's runs"):
        prepare_out(str(old))


def test_overwrite_removes_the_old_runs_files_only(tmp_path):
    run = old_run(tmp_path / "run")
    prepare_out(str(run), overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == [".lock", "notes.txt"]
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.png").write_text("no run here: nothing to overwrite")
    prepare_out(tmp_path / "photos", overwrite=True)
    assert (tmp_path / "photos" / "cat.png").exists()
    release_out(run)


def test_overwrite_touches_no_folder_that_no_run_of_ours_wrote(tmp_path):
    """A user's folder with a config.json and figures of their own is not a run: --overwrite refuses
    it, one line."""
    mine = tmp_path / "mine"
    mine.mkdir()
    for name, text in (
        ("config.json", '{"lr": 1}'),
        ("figure.png", "a user's figure"),
        ("model.pt", "theirs"),
    ):
        (mine / name).write_text(text)
    with pytest.raises(UsageError, match="no minigrpo run wrote") as e:
        prepare_out(str(mine), overwrite=True)
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in mine.iterdir() if p.name != ".lock") == [
        "config.json",
        "figure.png",
        "model.pt",
    ]
    assert (mine / "config.json").read_text() == '{"lr": 1}' and (
        mine / "figure.png"
    ).read_text() == "a user's figure"


def test_overwrite_of_our_run_keeps_the_files_a_run_does_not_write(tmp_path):
    run = old_run(tmp_path / "run")
    (run / "my-figure.png").write_text("a user's figure beside the run")
    (run / "metrics.png").write_text("old metrics.png")
    prepare_out(str(run), overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == [".lock", "my-figure.png", "notes.txt"]
    release_out(run)


def test_a_run_of_a_minigrpo_before_the_mark_can_still_be_overwritten(tmp_path):
    run = tmp_path / "older"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"algo": "grpo", "task": "food"}))
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (run / ".lock").write_text("")  # older minigrpo left its lock empty
    prepare_out(str(run), overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == [".lock"]
    release_out(run)


def test_impossible_folders_are_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("keep me")
    for bad in ("", "   ", "/proc/minigrpo/x", str(tmp_path / "file" / "sub")):
        with pytest.raises(UsageError) as e:
            prepare_out(bad)
        assert "\n" not in str(e.value)
    assert "cannot be created" in one_line_error(
        pretrain.main, ["--out", "/proc/minigrpo/x", *TINY], capsys
    )
    assert (tmp_path / "file").read_text() == "keep me"


def test_stale_temp_files_of_a_killed_write_are_removed(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in (
        ".model.pt.tmp12345",
        ".config.json.tmp999",
        "summary.json.tmp",
        "keep.txt",
        "other.tmp",
    ):
        (run / name).write_text("x")
    prepare_out(str(run))
    assert sorted(p.name for p in run.iterdir()) == [".lock", "keep.txt", "other.tmp"], (
        "only our temp files go"
    )
    release_out(run)


def test_a_second_writer_is_refused_until_the_first_dies(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from minigrpo.util.outputs import prepare_out; "
            f"prepare_out({str(run)!r}); print('locked', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UsageError, match="another process is writing to") as e:
            prepare_out(str(run))
        assert str(run) in str(e.value)
    finally:
        holder.kill()  # SIGKILL: no clean-up runs, yet the kernel drops the lock
        holder.wait()
    assert prepare_out(str(run)) == run
    release_out(run)


# --- a full disk ----------------------------------------------------------------------------------


def no_space(*args):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_keeps_the_previous_checkpoint_and_json(tmp_path, monkeypatch):
    model = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=1, n_embd=8))
    ckpt, tok = tmp_path / "model.pt", CharTokenizer("abc")
    save_checkpoint(ckpt, model, tok, task="food", step=1)
    write_json(tmp_path / "config.json", {"a": 1})
    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(
        UsageError,
        match="the disk is full while writing .*model.pt; the previous checkpoint is kept",
    ):
        save_checkpoint(ckpt, model, tok, task="food", step=2)
    with pytest.raises(UsageError, match="the disk is full while writing .*config.json"):
        write_json(tmp_path / "config.json", {"a": 2})
    monkeypatch.undo()
    assert read_checkpoint(ckpt)["step"] == 1 and json.loads(
        (tmp_path / "config.json").read_text()
    ) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.pt"], (
        "no temp file left"
    )


# --- pretrain -------------------------------------------------------------------------------------


def test_pretrain_refuses_bad_lr_and_warmup(tmp_path, capsys):
    for lr in ("nan", "inf", "0", "-1", "2"):
        err = one_line_error(
            pretrain.main, ["--out", str(tmp_path / "a"), *TINY, "--lr", lr], capsys
        )
        assert "--lr must be a number in (0, 1]" in err and lr in err
    assert "--warmup must be >= 0" in one_line_error(
        pretrain.main, ["--out", str(tmp_path), *TINY, "--warmup", "-1"], capsys
    )


@pytest.mark.slow
def test_pretrain_refuses_to_mix_runs_unless_overwrite(tmp_path, capsys):
    out = str(tmp_path / "p")
    pretrain.main(["--out", out, *TINY])
    before = (tmp_path / "p" / "model.pt").read_bytes()
    assert "--overwrite" in one_line_error(pretrain.main, ["--out", out, *TINY], capsys)
    assert (tmp_path / "p" / "model.pt").read_bytes() == before
    pretrain.main(["--out", out, *TINY, "--overwrite", "--seed", "1"])
    assert (tmp_path / "p" / "model.pt").read_bytes() != before


def test_pretrain_stops_on_a_non_finite_loss_naming_the_step(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        pretrain, "lm_loss", lambda *a: torch.tensor(float("nan"), requires_grad=True)
    )
    err = one_line_error(pretrain.main, ["--out", str(tmp_path / "n"), *TINY], capsys)
    assert "loss became nan at step 1" in err and "none written yet" in err


def test_ctrl_c_reports_the_checkpoint_really_on_disk(tmp_path, monkeypatch):
    real_save = pretrain.save_checkpoint

    def save_then_ctrl_c(path, model, tok, task, step, **kw):  # Ctrl-C right after the rename
        real_save(path, model, tok, task, step, **kw)
        if step == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(pretrain, "save_checkpoint", save_then_ctrl_c)
    lines = []
    cfg = pretrain.PretrainConfig(
        out=str(tmp_path / "c"),
        steps=3,
        n_lines=200,
        n_embd=8,
        n_head=1,
        n_layer=1,
        batch_size=8,
        eval_every=1,
        ckpt_every=1,
        warmup=1,
    )
    with pytest.raises(SystemExit) as e:
        pretrain.train(cfg, log=lines.append)
    assert (
        e.value.code == 130 and "last complete checkpoint" in lines[-1] and "(step 2)" in lines[-1]
    ), lines


# --- sample ---------------------------------------------------------------------------------------


def test_sample_generates_a_large_num_in_batches(tiny_pretrained, monkeypatch, capsys):
    ckpt, _, _ = tiny_pretrained
    sizes, real_generate = [], sample.generate

    def recording_generate(model, ids, *a, **kw):
        sizes.append(len(ids))
        return real_generate(model, ids, *a, **kw)

    monkeypatch.setattr(sample, "BATCH_SIZE", 3)
    monkeypatch.setattr(sample, "generate", recording_generate)
    sample.main(["--checkpoint", str(ckpt), "--num", "10", "--json"])
    assert len(capsys.readouterr().out.splitlines()) == 10 and sizes == [3, 3, 3, 1]
    sample.main(["--checkpoint", str(ckpt), "--num", "10"])
    table = capsys.readouterr().out.split("share\n")[1].splitlines()
    assert sum(int(line.split()[-2]) for line in table) == 10


def test_sample_bad_prompt_temperature_and_length(tiny_pretrained, capsys):
    ckpt, model, _ = tiny_pretrained
    block = model.cfg.block_size
    long = "ravin likes " * (block // 12 + 1)
    err = one_line_error(sample.main, ["--checkpoint", str(ckpt), "--prompt", long], capsys)
    assert f"{len(long)} characters" in err and f"at most {block - 2}" in err
    for t in ("1e-4", "0", "nan", "inf", "-1"):
        err = one_line_error(sample.main, ["--checkpoint", str(ckpt), "--temperature", t], capsys)
        assert "--temperature must be a finite number >= 0.001" in err
    sample.main(["--checkpoint", str(ckpt), "--num", "5", "--json", "--max-new-tokens", "1000"])
    captured = capsys.readouterr()
    room = block - len("ravin likes ") - 1
    assert (
        captured.err.count("\n") == 1 and f"--max-new-tokens 1000 is cut to {room}" in captured.err
    )
    assert len(captured.out.splitlines()) == 5


# --- Ctrl-C while a command is still starting -----------------------------------------------------


def test_ctrl_c_while_importing_torch_is_one_line_and_130(tmp_path):
    # a stand-in torch that announces it is importing and then takes its time, as the real one does
    (tmp_path / "torch.py").write_text(
        "import pathlib, time\npathlib.Path('importing').touch()\ntime.sleep(60)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-m", "minigrpo.pretrain", "--steps", "1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while not (tmp_path / "importing").exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err.strip() == "interrupted" and out == "", err


def test_library_use_keeps_pythons_ctrl_c():
    code = (
        "import signal, minigrpo.util.cli; assert signal.getsignal(signal.SIGINT) is "
        "signal.default_int_handler"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_main_guard_hands_ctrl_c_back_to_python(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["-m"])
    monkeypatch.setattr(
        sys, "orig_argv", ["python", "-X", "utf8", "-m", "minigrpo.grpo", "--steps", "3"]
    )
    assert minigrpo._started_as_cli()
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "pytest"])
    assert not minigrpo._started_as_cli()
    previous = signal.signal(signal.SIGINT, minigrpo._interrupted_at_startup)
    try:
        assert (
            main_guard(lambda argv: signal.getsignal(signal.SIGINT))() is signal.default_int_handler
        )
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_full_disk_anywhere_else_is_one_line(capsys):
    def writes_metrics(argv):
        raise OSError(errno.ENOSPC, "No space left on device", "runs/x/metrics.jsonl")

    err = one_line_error(main_guard(writes_metrics), [], capsys)
    assert "the disk is full while writing runs/x/metrics.jsonl" in err


# ---- RL: every harmful value is refused in one line before anything runs -------------------------

RL_BAD = [
    ("grpo", ["--warmup", "-1"], "--warmup must be >= 0"),
    ("grpo", ["--beta", "-1"], "--beta must be"),
    ("grpo", ["--clip-low", "2"], "--clip-low must be"),
    ("grpo", ["--clip-low", "-3"], "--clip-low must be"),
    ("grpo", ["--grad-clip", "-1"], "--grad-clip must be"),
    ("grpo", ["--ref-update-every", "-1"], "must be >= 0"),
    ("grpo", ["--preserve-coef", "-1"], "--preserve-coef must be"),
    ("grpo", ["--adv-eps", "-1"], "--adv-eps"),
    ("grpo", ["--unfinished-reward", "nan"], "--unfinished-reward must be"),
    ("grpo", ["--lr", "nan"], "--lr"),
    ("grpo", ["--lr", "inf"], "--lr"),
    ("grpo", ["--lr", "1e9"], "--lr"),
    ("grpo", ["--goal", "2"], "--goal"),
    ("grpo", ["--task", "arithmetic", "--person", "bob"], "--person is the food task's"),
    ("grpo", ["--person", "zed"], "unknown --person 'zed'"),
    ("grpo", ["--out", ""], "--out"),
    ("ppo", ["--kl-target", "-1"], "--kl-target must be"),
    ("ppo", ["--gamma", "2"], "--gamma must be"),
    ("ppo", ["--beta", "-0.1"], "--beta must be"),
]


@pytest.mark.parametrize("cli, argv, message", RL_BAD, ids=[" ".join(a) for _, a, _ in RL_BAD])
def test_rl_refuses_a_harmful_value_in_one_line(
    cli, argv, message, tmp_path, tiny_pretrained, capsys
):
    import importlib

    init, _, _ = tiny_pretrained
    main = importlib.import_module(f"minigrpo.{cli}").main
    args = ["--init", str(init), "--out", str(tmp_path / "r"), "--quiet", "--steps", "1"]
    with pytest.raises(SystemExit) as e:
        main(args + argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "r" / "model.pt").exists(), "nothing is written for a refused command"


def test_a_slow_reward_shows_a_sign_of_life(tmp_path, tiny_pretrained, capsys, monkeypatch):
    import toy_tasks.rewards as rewards
    from minigrpo.grpo import main

    init, _, _ = tiny_pretrained
    monkeypatch.setattr(rewards, "SLOW_SECONDS", 0.0)  # every completion counts as slow
    main(
        [
            "--init",
            str(init),
            "--out",
            str(tmp_path / "r"),
            "--steps",
            "1",
            "--group-size",
            "2",
            "--prompts-per-step",
            "1",
            "--preserve-per-prompt",
            "4",
            "--goal",
            "0",
            "--no-plot",  # drawing metrics.png would be most of this run's time
        ]
    )
    out = capsys.readouterr().out
    assert "scored 1/2 completions (the reward is slow)" in out
    assert out.index(
        "before step 1: scored the reward on 1/14 of the task's completions"
    ) < out.index("scored 1/2")


def test_bench_refuses_an_impossible_out_in_one_line(capsys):
    from minigrpo.bench.suite import main

    with pytest.raises(SystemExit) as e:
        main(["--out", "/proc/x", "--quick"])
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("content", ['{"algo": "grpo", "steps": 3', "[1, 2]", "\xff\xfe"])
def test_resume_of_a_folder_whose_config_json_is_corrupt_is_one_line(tmp_path, capsys, content):
    """A torn or foreign config.json on --resume: one line naming it, exit 2, and the folder left as
    it was."""
    from minigrpo import grpo

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_bytes(content.encode("latin-1"))
    err = one_line_error(grpo.main, ["--resume", str(run)], capsys)
    assert "config.json" in err, err
    assert (run / "config.json").read_bytes() == content.encode("latin-1") and sorted(
        os.listdir(run)
    ) == ["config.json"]


def test_resume_of_a_folder_whose_config_json_cannot_be_read_is_one_line(
    tmp_path, capsys, monkeypatch
):
    """A config.json the user may not read (mode 000 as anyone but root; denied here by a stand-in
    for Path.read_text, as the tests may run as root) on --resume: one line naming it, exit 2."""
    from pathlib import Path

    from minigrpo import grpo

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    read_text = Path.read_text

    def denied(path, *args, **kwargs):
        if path.name == "config.json":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    err = one_line_error(grpo.main, ["--resume", str(run)], capsys)
    assert f"--resume {str(run)!r}: its config.json cannot be read (Permission denied)" in err, err


@pytest.mark.parametrize("only", ["", " ", "grpo,", "grpo,nope"])
def test_bench_refuses_an_empty_or_unknown_only_section_instead_of_running_everything(
    only, capsys, tmp_path, monkeypatch
):
    from minigrpo.bench.suite import main

    monkeypatch.chdir(tmp_path)
    err = one_line_error(main, ["--only", only], capsys)
    assert "unknown --only section" in err, err
    assert not (tmp_path / "runs").exists(), "nothing ran"


@pytest.mark.parametrize(
    "module, flags",
    [("minigrpo.ppo", ["--vf-coef", "1e30"]), ("minigrpo.grpo", ["--preserve-coef", "1e30"])],
)
def test_a_loss_weight_too_large_for_float32_stops_the_run_in_one_line(
    tmp_path, tiny_pretrained, capsys, module, flags
):
    """An inf gradient norm, clipped, zeroes every step: the run froze with grad_norm null and exit
    code 0."""
    import importlib

    init, _, _ = tiny_pretrained
    argv = [
        "--init",
        str(init),
        "--out",
        str(tmp_path / "r"),
        "--steps",
        "2",
        "--group-size",
        "4",
        "--quiet",
        *flags,
    ]
    err = one_line_error(importlib.import_module(module).main, argv, capsys)
    assert "the gradient became inf at step 1" in err and "--vf-coef" in err, err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_pretrained):
    """A 2-step GRPO run's folder at lr 0.001 (copied by each test that damages it)."""
    from minigrpo import grpo

    init, _, _ = tiny_pretrained
    run = tmp_path_factory.mktemp("resume") / "run"
    flags = ["--init", str(init), "--steps", "2", "--group-size", "4", "--prompts-per-step", "2"]
    grpo.main([*flags, "--reward", "food:curry", "--lr", "0.001", "--out", str(run), "--quiet"])
    return run


@pytest.mark.parametrize(
    "damage, said",
    [
        (lambda c: c.pop("lr"), "'lr' is missing"),
        (lambda c: c.pop("reward"), "'reward' is missing"),
        (lambda c: c.update(lr="abc"), "'lr' is 'abc', not float"),
        (lambda c: c.update(group_size=4.5), "'group_size' is 4.5, not int"),
        (lambda c: c.update(preserve="yes"), "'preserve' is 'yes', not bool"),
    ],
    ids=["no-lr", "no-reward", "lr-abc", "group-size-float", "preserve-str"],
)
@pytest.mark.slow
def test_resume_refuses_a_config_json_that_lost_a_setting_or_holds_another_type(
    finished_run, tmp_path, capsys, damage, said
):
    """A config.json that lost a key is never filled in with the default (a curry run at lr 0.001
    would carry on as a pizza run at lr 6e-4), and a value of another type is named in its file,
    not blamed on a flag the user never passed; the folder stays as it was."""
    from minigrpo import grpo

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    config = json.loads((run / "config.json").read_text())
    damage(config)
    (run / "config.json").write_text(json.dumps(config))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    err = one_line_error(grpo.main, ["--resume", str(run), "--steps", "3"], capsys)
    assert str(run / "config.json") in err and said in err, err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


@pytest.mark.slow
def test_resume_of_a_run_whose_metrics_jsonl_is_gone_is_refused_not_restarted(
    finished_run, tmp_path, capsys
):
    from minigrpo import grpo

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "metrics.jsonl").unlink()
    err = one_line_error(grpo.main, ["--resume", str(run), "--steps", "3"], capsys)
    assert "metrics.jsonl is gone" in err, err
    assert not (run / "metrics.jsonl").exists()
