import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import one_line_error

from minigrpo import metrics
from minigrpo.compare import main
from minigrpo.tools import pool, stamps
from minigrpo.util import jsonl
from toy_tasks.rewards import module_file

TINY = [
    "--steps",
    "3",
    "--group-size",
    "4",
    "--prompts-per-step",
    "2",
    "--preserve-per-prompt",
    "2",
]


@pytest.mark.slow
def test_compare_smoke_writes_all_outputs_reports_failures_and_resumes(
    tmp_path, tiny_pretrained, capsys, monkeypatch
):
    init, _, _ = tiny_pretrained
    out = tmp_path / "cmp"
    args = [
        "--algos",
        "grpo,ppo",
        "--seeds",
        "1",
        "--out",
        str(out),
        "--init",
        str(init),
        *TINY,
        "--jobs",
        "2",
    ]
    main(args)
    assert {"curves.png", "frontier.png", "table.md"} <= {p.name for p in out.iterdir()}
    table = (out / "table.md").read_text()
    assert "| grpo | 1 ok" in table and "| ppo | 1 ok" in table
    # the tiny model's 3 steps
    assert "Runs outside the bars (2):" in table and "- grpo-s0: final target 0." in table
    printed = capsys.readouterr().out  # the short table; table.md holds the full one
    assert "outside the bars (2):\n  grpo-s0: final target 0." in printed, printed
    assert (
        "within bars" in printed
        and "exact KL/token" not in printed
        and str(out / "table.md") in printed
    )
    assert all(len(line) <= 120 for line in printed.splitlines() if str(out) not in line), printed
    config = json.loads((out / "grpo-s0" / "config.json").read_text())
    # one checkpoint, the last: an unfinished run is made again
    assert config["ckpt_every"] == config["steps"] == 3
    stamp = (out / "grpo-s0" / "metrics.jsonl").stat().st_mtime_ns
    main(args)  # a rerun keeps finished runs
    assert (out / "grpo-s0" / "metrics.jsonl").stat().st_mtime_ns == stamp
    # a subset with the same flags: ppo's finished run stays in the table
    main(args[:1] + ["grpo"] + args[2:])
    table = (out / "table.md").read_text()
    assert "| grpo | 1 ok" in table and "| ppo | 1 ok" in table
    code = json.loads((out / "grpo-s0" / "compare_command.json").read_text())["code"]
    assert code == stamps.code_version() and len(code) == 16
    # other code: finished runs made again
    monkeypatch.setattr(stamps, "code_version", lambda: "an edited library")
    main(args[:1] + ["grpo"] + args[2:])
    again = (out / "grpo-s0" / "metrics.jsonl").stat().st_mtime_ns
    assert again != stamp
    # another command into the same --out ...
    other = args[:1] + ["grpo"] + args[2:] + ["--group-size", "2"]
    # ... is refused in one line
    assert "another compare command" in one_line_error(main, other, capsys)
    assert (out / "grpo-s0" / "metrics.jsonl").stat().st_mtime_ns == again, (
        "a refusal touches nothing"
    )
    main(other + ["--overwrite"])  # ... and replaces the other command's runs only when asked
    assert (out / "grpo-s0" / "metrics.jsonl").stat().st_mtime_ns != again
    assert not (out / "ppo-s0").exists(), (
        "the other command's finished runs are replaced, never left beside"
    )
    with pytest.raises(SystemExit) as e:  # --updates is GRPO's only: refused before any run starts
        main(args[:-2] + ["--updates", "2", "--out", str(tmp_path / "bad"), "--jobs", "2"])
    assert e.value.code == 2 and "unrecognized arguments: --updates 2" in capsys.readouterr().err
    assert not (tmp_path / "bad" / "grpo-s0").exists()
    # fine on the 12 foods and 2 malformed probes scored at start, raises later
    flaky = tmp_path / "flaky.py"
    flaky.write_text(
        "n = 0\ndef f(prompt, completion):\n    global n\n    n += 1\n"
        "    if n > 14:\n        raise RuntimeError('boom')\n    return 0.0\n"
    )
    with pytest.raises(SystemExit) as e:
        main(args + ["--reward", f"{flaky}:f", "--out", str(tmp_path / "fail")])
    table = (tmp_path / "fail" / "table.md").read_text()
    assert (
        e.value.code == 1
        and "failed: grpo seed 0" in table
        and "failed: ppo seed 0" in table
        and "boom" in table
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--algos", "grpo,sac"], "unknown algorithm 'sac'"),
        (["--algos", "default@seed=3"], "may not set --seed"),
        (["--algos", "default@nonsense=1"], "unrecognized arguments: --nonsense 1"),
        (["--algos", "grpo@critic=head"], "--critic only in a variant of ppo"),
        (["--seeds", "0"], "--seeds must be >= 1"),
        (["--seed", "3"], "set by compare itself"),
        (["--jobs", "-1"], "--jobs must be >= 0"),
        (["--task", "chess"], "unknown task 'chess'"),
        (["--reward", "nonsense"], "unknown reward 'nonsense'"),
        (["--init", "/nope.pt"], "'/nope.pt' does not exist"),
        (["--algos", "grpo,ppo,grpo"], "names grpo more than once"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--mps", "off"], "unrecognized arguments: --mps off"),  # compare starts no daemon
        (["--algos", "dpo", "--online"], "online_dpo"),
        (["--algos", "ppo_oracle", "--critic", "head"], "relabel"),
        (["--algos", "dapo@beta=-1"], "--beta must be a finite number >= 0"),
        (["--algos", "ppo@minibatches=999"], "exceeds the rollout's"),
        (["--algos", "online_dpo@beta=0"], "--beta must be a finite number"),
    ],
)
def test_compare_bad_input(argv, message, capsys, tmp_path):
    """One line, exit 2, before any run (a trainer's own checks too: its run would fail each
    seed)."""
    with pytest.raises(SystemExit) as e:
        main([*argv, "--out", str(tmp_path / "x")])
    assert (
        e.value.code == 2 and message in capsys.readouterr().err and not (tmp_path / "x").exists()
    )


@pytest.mark.slow
def test_a_pooled_run_is_the_separate_process_run(tmp_path, tiny_pretrained):
    """One worker runs ppo s0, ppo s1, grpo s0, grpo s1 in turn, in process (pool.py); each of its
    last runs writes the same metrics (all but the timings) and summary as its command run as a
    process of its own."""
    init, _, _ = tiny_pretrained
    out = tmp_path / "cmp"
    main(
        [
            "--algos",
            "ppo,grpo",
            "--seeds",
            "2",
            "--jobs",
            "1",
            "--out",
            str(out),
            "--init",
            str(init),
            *TINY,
        ]
    )
    untimed = lambda folder: [
        {k: v for k, v in row.items() if k not in ("step_time", "tokens_per_s")}  # noqa: E731
        for row in jsonl.read_jsonl(folder / "metrics.jsonl")
    ]
    for run in ("ppo-s1", "grpo-s1"):
        # ["-m", module, …, folder]
        cmd = json.loads((out / run / "compare_command.json").read_text())["command"]
        alone = tmp_path / f"alone-{run}"
        subprocess.run(
            [sys.executable, *cmd[:-1], str(alone)],
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert untimed(out / run) == untimed(alone) and len(untimed(alone)) == 4
        assert (out / run / "summary.json").read_text() == (alone / "summary.json").read_text()
    # compare skips the runs' figures (--no-plot) ...
    assert not (out / "grpo-s1" / "metrics.png").exists()
    metrics.main([str(out / "grpo-s1")])  # ... and draws one on request
    assert (out / "grpo-s1" / "metrics.png").stat().st_size > 0


@pytest.mark.slow
def test_compare_survives_a_dying_worker(tmp_path, tiny_pretrained, capsys):
    """A run that kills its worker process fails alone (a fresh worker takes the next run); exit
    code 1."""
    init, _, _ = tiny_pretrained
    deadly = tmp_path / "deadly.py"
    deadly.write_text(
        f"import os\ndef f(prompt, completion):\n    if os.getpid() != {os.getpid()}:  # a worker\n"
        f"        os._exit(3)\n    return 0.0\n"
    )
    with pytest.raises(SystemExit) as e:
        main(
            [
                "--algos",
                "grpo",
                "--seeds",
                "2",
                "--jobs",
                "1",
                "--out",
                str(tmp_path / "cmp"),
                "--init",
                str(init),
                *TINY,
                "--reward",
                f"{deadly}:f",
            ]
        )
    assert e.value.code == 1
    assert capsys.readouterr().out.count("FAILED: the worker process died (exit code 3)") == 2


def test_dpo_and_online_dpo_map_to_minigrpo_dpo(tmp_path, tiny_pretrained):
    from minigrpo.compare import ALGOS, CompareConfig, check_all, command

    init, _, _ = tiny_pretrained
    cfg = CompareConfig(seeds=1, reward="pizza")
    for algo, flags in (
        ("dpo", []),
        ("online_dpo", ["--online"]),
        ("ppo_oracle", ["--critic", "oracle"]),
    ):
        cmd = command(algo, 2, cfg, ["--beta", "0.2"], "food", tmp_path)
        module = "minigrpo.ppo" if algo.startswith("ppo") else "minigrpo.dpo"
        assert (
            algo in ALGOS and cmd[1:3] == ["-m", module] and cmd[-1] == str(tmp_path / f"{algo}-s2")
        )
        assert (
            cmd[3 : 3 + len(flags)] == flags
            and "--preset" not in cmd
            and cmd[cmd.index("--beta") + 1] == "0.2"
        )
        assert ("--online" in cmd) == (algo == "online_dpo")
    # DPOConfig's flags
    check_all(["dpo", "online_dpo"], cfg, ["--init", str(init), "--offline-samples", "32"], "food")


def test_a_variant_is_a_row_of_its_own_with_its_own_flags(tmp_path, tiny_pretrained, capsys):
    """--algos NAME@flag=value: its runs are NAME's with the flag given last (it wins over one
    passed to every run), in folders of its own, a row of its own in the table."""
    from minigrpo.compare import CompareConfig, command

    cmd = command(
        "grpo@beta=0.1@no_preserve", 2, CompareConfig(seeds=1), ["--beta", "0.2"], "food", tmp_path
    )
    assert cmd[1:5] == ["-m", "minigrpo.grpo", "--preset", "grpo"]
    assert cmd[-1] == str(tmp_path / "grpo@beta=0.1@no_preserve-s2")
    betas = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--beta"]
    # argparse keeps the last: the variant's
    assert betas == ["0.2", "0.1"] and "--no-preserve" in cmd
    init, _, _ = tiny_pretrained
    out = tmp_path / "cmp"
    main(
        [
            "--algos",
            "grpo,grpo@lr=0.003",
            "--seeds",
            "1",
            "--out",
            str(out),
            "--init",
            str(init),
            *TINY,
            "--jobs",
            "1",
        ]
    )
    lrs = [
        json.loads((out / f"{a}-s0" / "config.json").read_text())["lr"]
        for a in ("grpo", "grpo@lr=0.003")
    ]
    assert lrs[1] == 0.003 and lrs[0] != 0.003
    table = (out / "table.md").read_text()
    assert "| grpo | 1 ok" in table and "| grpo@lr=0.003 | 1 ok" in table


def test_variants_and_presets_of_one_mu_share_one_population(tmp_path):
    """--engine population: NAME@lr=... and NAME@beta=... runs train in NAME's lockstep population
    (each member its own rate and β), and so do GRPO's presets of the same μ (each its recipe:
    population/grpo_update.py), β = 0 too; a preset of another μ (remax's 1) makes a population of
    its own. Over --members, a group's runs split in order: a preset to a part. On a CPU
    (mixed=False) each preset makes its own, spread over the cores."""
    from minigrpo.compare import COMMANDS, CompareConfig, command
    from minigrpo.population.engine import shares_of

    algos = [
        "default",
        "default@lr=0.002",
        "default@beta=0.1",
        "default@beta=0",
        "grpo@beta=0.1",
        "dapo",
        "remax",
    ]
    items = [
        (a, s, command(a, s, CompareConfig(seeds=2), [], "food", tmp_path), tmp_path / f"{a}-s{s}")
        for a in algos
        for s in range(2)
    ]
    names = lambda shares: [sorted({item[0] for item in share}) for share in shares]
    shares, alone = shares_of(items, COMMANDS)
    assert sorted(names(shares)) == [sorted(algos[:-1]), ["remax"]] and alone == []
    assert names(shares_of(items, COMMANDS, most=2)[0]) == [[a] for a in algos]
    # a CPU's
    apart = sorted(names(shares_of(items, COMMANDS, mixed=False)[0]))
    # a preset each
    assert apart == sorted([sorted(algos[:4]), ["dapo"], ["grpo@beta=0.1"], ["remax"]])


def test_the_first_line_names_the_runs_that_go_alone_and_why(tmp_path):
    """--engine population: a run lockstep cannot map goes alone, and compare's first line says
    which algorithms and why (lockstep.unsupported's words), one reason each."""
    from minigrpo.compare import COMMANDS, CompareConfig, command
    from minigrpo.population.engine import describe, shares_of

    algos, extra = (
        ["default", "dpo", "online_dpo", "grpo"],
        {"grpo": ["--preserve-anchor", "sampled"]},
    )
    items = [
        (a, s, command(a, s, CompareConfig(seeds=2), extra.get(a, []), "food", tmp_path), None)
        for a in algos
        for s in range(2)
    ]
    shares, alone = shares_of(items, COMMANDS)
    assert [item[0] for share in shares for item in share] == ["default"] * 2
    assert describe(shares, alone, COMMANDS) == (
        "1 lockstep population, 6 runs alone (no lockstep: dpo, online_dpo: minigrpo.dpo has no "
        "lockstep; grpo: --preserve-anchor sampled), "
    )
    assert describe(shares, [], COMMANDS) == "1 lockstep population, "


def finished_run(run, cmd):
    """A folder that looks like a finished run of `cmd`, stamped now (stamps.stamp_of)."""
    run.mkdir()
    (run / "summary.json").write_text('{"step": 3, "stop_reason": "cap: --steps 3 reached"}')
    (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 3}\n')
    (run / "compare_command.json").write_text(json.dumps(stamps.stamp_of(cmd)))
    return run


@pytest.mark.parametrize(
    "damage",
    [
        lambda run: (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 3, "targ'),
        lambda run: (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 2}\n'),
        lambda run: (run / "metrics.jsonl").unlink(),
        lambda run: (run / "summary.json").write_text('{"step": 3}'),
        lambda run: (run / "summary.json").write_bytes(b"\xff\xfe"),
        lambda run: (run / "compare_command.json").write_text("{"),
    ],
    ids=[
        "torn-line",
        "short-record",
        "no-record",
        "no-stop-reason",
        "binary-summary",
        "torn-stamp",
    ],
)
def test_a_damaged_finished_run_is_made_again_never_tabulated(tmp_path, damage):
    """A finished run counts only intact: a summary.json with its stop reason at the step of the
    last line of its metrics.jsonl (a torn last line once lowered a table's final target from 0.788
    to 0.749 with a warning)."""
    cmd = [sys.executable, "-m", "minigrpo.grpo", "--out", str(tmp_path / "run")]
    run = finished_run(tmp_path / "run", cmd)
    assert stamps.finished_by(run, cmd)
    damage(run)
    assert not stamps.finished_by(run, cmd)


@pytest.mark.parametrize("says", ["done", "nothing"])
@pytest.mark.slow
def test_compare_tabulates_only_the_runs_that_finished_whatever_its_engine_said(
    tmp_path, tiny_pretrained, capsys, monkeypatch, says
):
    """A run an engine reported done without its summary, or never reported (a population cut short
    by a reward's KeyboardInterrupt), is named as failed, left out of the table, and compare exits
    1."""
    import minigrpo.compare as compare

    def pool_that_skips_seed_1(fn, items, jobs, done):
        for item in items:
            if item[1] == 0:
                done(item, compare.run_one(item))
            elif says == "done":
                done(item, None)

    monkeypatch.setattr(compare, "run_pool", pool_that_skips_seed_1)
    init, _, _ = tiny_pretrained
    out = tmp_path / "cmp"
    flags = ["--algos", "grpo", "--seeds", "2", "--init", str(init), *TINY, "--out", str(out)]
    with pytest.raises(SystemExit) as e:
        main(flags)
    printed = capsys.readouterr().out
    assert e.value.code == 1 and "grpo seed 1: FAILED: the run did not finish" in printed, printed
    assert "| grpo | 1 ok, 1 failed" in (out / "table.md").read_text()


@pytest.mark.slow
def test_a_reward_raising_keyboardinterrupt_in_a_population_fails_its_runs_by_name(
    tmp_path, tiny_pretrained, capsys
):
    """issue 53 item 1 as its tester made it: with --engine population a reward that raises
    KeyboardInterrupt after a step once ended the population with nothing printed for its runs,
    which compare then tabulated as complete with exit 0."""
    init, _, _ = tiny_pretrained
    reward = tmp_path / "interrupts.py"
    reward.write_text(
        "calls = 0\ndef reward(prompt, completion):\n    global calls\n    calls += 1\n"
        "    if calls > 24:  # past the reward's table and the first step\n"
        "        raise KeyboardInterrupt\n    return float(completion == 'pizza')\n"
    )
    out = tmp_path / "cmp"
    flags = ["--algos", "grpo", "--seeds", "2", "--init", str(init), *TINY, "--out", str(out)]
    with pytest.raises(SystemExit) as e:
        main([*flags, "--engine", "population", "--reward", f"{reward}:reward"])
    printed = capsys.readouterr().out
    assert e.value.code == 1, printed
    for s in range(2):
        assert f"grpo seed {s}: interrupted at once during step" in printed, printed
    assert "| grpo | 0 ok, 2 failed" in (out / "table.md").read_text()


def test_a_finished_run_is_kept_only_while_its_named_files_are_unchanged(tmp_path, monkeypatch):
    """stamps.stamp_of holds the content hash of every file the command line names (the --init
    checkpoint, a reward file.py:fn), so a re-pretrained checkpoint or an edited reward file makes
    the run again."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "init.pt").write_bytes(b"weights")
    (tmp_path / "r.py").write_text("def f(p, c):\n    return 1.0\n")
    cmd = [
        sys.executable,
        "-m",
        "minigrpo.grpo",
        "--init",
        "init.pt",
        "--reward",
        "r.py:f",
        "--reward",
        "food:pizza",
        "--out",
        str(tmp_path / "run"),
    ]
    assert set(stamps.named_files(cmd)) == {"init.pt", "r.py"}  # not the folder, not "food:pizza"
    run = finished_run(tmp_path / "run", cmd)
    assert stamps.finished_by(run, cmd)
    (tmp_path / "r.py").write_text("def f(p, c):\n    return 0.0\n")
    assert not stamps.finished_by(run, cmd), "an edited reward file kept the old run"
    (run / "compare_command.json").write_text(json.dumps(stamps.stamp_of(cmd)))
    assert stamps.finished_by(run, cmd)
    (tmp_path / "init.pt").write_bytes(b"other weights")
    assert not stamps.finished_by(run, cmd), "a re-pretrained checkpoint kept the old run"


def test_a_reward_module_is_stamped_by_its_source(tmp_path, monkeypatch):
    """A --reward package.module:function is stamped by its module's source file (found, not run),
    so editing the module makes compare's runs again; built-in rewards and file paths are not taken
    for modules."""
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "scores.py").write_text("raise RuntimeError('find_spec must not run the module')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    source = str(pkg / "scores.py")
    assert module_file("mypkg.scores:f") == source
    for spec in (
        "food:pizza",
        "food:apple pie",
        "exact:ravin likes pizza",
        "regex:a.b",
        "r.py:f",
        "dir/r.py:f",
        "nosuchpkg.mod:f",
        "mypkg.missing:f",
        "pizza=1,length=0.1",
    ):
        assert module_file(spec) is None, spec
    cmd = [
        sys.executable,
        "-m",
        "minigrpo.grpo",
        "--reward",
        "mypkg.scores:f",
        "--out",
        str(tmp_path / "run"),
    ]
    assert set(stamps.named_files(cmd)) == {source}
    run = finished_run(tmp_path / "run", cmd)
    assert stamps.finished_by(run, cmd)
    (pkg / "scores.py").write_text("def f(p, c):\n    return 0.0\n")
    assert not stamps.finished_by(run, cmd), "an edited reward module kept the old run"


def test_a_finished_run_is_made_again_when_a_module_its_reward_imports_changes(
    tmp_path, monkeypatch
):
    """The stamp follows the reward's imports into the user's folder (helpers.py, a package beside
    it), so an edit there makes the run again instead of reporting the old reward's run for the new
    one."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.py").write_text(
        "import helpers\nfrom scoring.weights import w\n"
        "def f(p, c):\n    return helpers.bonus() * w\n"
    )
    (tmp_path / "helpers.py").write_text("def bonus():\n    return 1.0\n")
    (tmp_path / "scoring").mkdir()
    (tmp_path / "scoring" / "__init__.py").write_text("")
    (tmp_path / "scoring" / "weights.py").write_text("w = 1.0\n")
    cmd = [
        sys.executable,
        "-m",
        "minigrpo.grpo",
        "--reward",
        "r.py:f",
        "--out",
        str(tmp_path / "run"),
    ]
    assert {Path(p).name for p in stamps.named_files(cmd)} == {
        "r.py",
        "helpers.py",
        "__init__.py",
        "weights.py",
    }
    run = finished_run(tmp_path / "run", cmd)
    assert stamps.finished_by(run, cmd)
    for edited in ("helpers.py", "scoring/weights.py"):
        (run / "compare_command.json").write_text(json.dumps(stamps.stamp_of(cmd)))
        (tmp_path / edited).write_text((tmp_path / edited).read_text().replace("1.0", "0.0"))
        assert not stamps.finished_by(run, cmd), (
            f"an edit of {edited}, which the reward imports, kept the old run"
        )


def test_a_run_that_ends_without_its_summary_is_never_counted_ok(tmp_path):
    """A trainer whose main returns (or exits 0) without writing summary.json has failed, whatever
    its exit code."""
    folder = tmp_path / "run"
    task = ("default", 0, [sys.executable, "-m", "silent_trainer", "--out", str(folder)], folder)
    error = pool.run_one(task, {"silent_trainer": lambda argv: None})
    assert error is not None and "summary.json" in error, error
    # a module it was not given
    with pytest.raises(ValueError, match="silent_trainer is none of the commands given"):
        pool.run_one(task, {"minigrpo.grpo": lambda argv: None})


def test_compare_runs_its_trainers_from_its_own_imports():
    """compare names a module for every algorithm's runs and gives the pool its main: the tools
    below it import no command (tests/test_layers.py); what the pool's workers get pickles."""
    import pickle

    from minigrpo import compare

    assert {compare.module_of(a) for a in compare.ALGOS} == set(compare.MAINS)
    assert all(compare.MAINS[m.__name__] is m.main for m in compare.TRAINERS.values())
    assert pickle.loads(pickle.dumps(compare.run_one)) is compare.run_one


def test_compare_refuses_an_empty_out_a_foreign_init_a_bad_reward_and_no_gpu_before_any_run(
    tmp_path, tiny_pretrained, capsys, monkeypatch
):
    init, _, _ = tiny_pretrained
    monkeypatch.chdir(tmp_path)
    base = ["--algos", "grpo", "--seeds", "1", "--init", str(init), *TINY]
    assert "--out is empty" in one_line_error(main, [*base, "--out", ""], capsys)
    assert "pretrained on task 'food'" in one_line_error(
        main, [*base, "--task", "arithmetic", "--out", "a"], capsys
    )
    broken = tmp_path / "broken.py"
    broken.write_text("def f(p, c):\n    raise RuntimeError('boom')\n")
    assert "boom" in one_line_error(main, [*base, "--reward", f"{broken}:f", "--out", "b"], capsys)
    assert (
        not (tmp_path / "a").exists()
        and not (tmp_path / "b").exists()
        and not (tmp_path / "runs").exists()
    )
    # a machine without a GPU, wherever this runs
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert "no CUDA GPU is available" in one_line_error(
        main, [*base, "--device", "cuda", "--out", "c"], capsys
    )
    assert not (tmp_path / "c").exists()


def test_compare_prints_a_short_table_of_what_judges_each_algorithm():
    """compare printed table.md's 21 columns; a terminal gets 7 (medians over seeds), at most 120
    characters a line."""
    from minigrpo.tools.sweep_report import short_table

    def run(target, steps_to_goal, drift, malformed, regret):
        steps = [0, steps_to_goal or 50, 60]
        return {
            "steps": steps,
            "target": [0.1, 0.95 if steps_to_goal else 0.9, target],
            "final": {
                "target_rate": target,
                "worst_drift": drift,
                "peak_worst_drift": drift,
                "malformed": malformed,
                "peak_malformed": malformed,
                "regret": regret,
                "steps": 60,
            },
        }

    results = {
        "grpo": [run(0.998, 23, 0.02, 0.001, 0.0011), run(0.99, 31, 0.04, 0.001, 0.002)],
        "reinforce_rej": [run(0.90, None, 0.01, 0.03, 0.05), run(0.97, 40, 0.01, 0.001, 0.01)],
    }
    lines = short_table(results, regret=True).splitlines()
    assert lines[0].split("  ")[0] == "algorithm" and [
        c.strip() for c in lines[0].split("  ") if c.strip()
    ] == [
        "algorithm",
        "within bars",
        "steps to 0.95",
        "final target",
        "peak drift",
        "peak malformed",
        "regret",
    ]
    assert lines[1].split()[:4] == ["grpo", "1/2", "27", "0.994"], lines
    assert lines[2].split()[:5] == ["reinforce_rej", "1/2", "40", "(1", "never)"], lines
    assert all(len(line) <= 120 for line in lines) and len(lines) == 3
    assert "regret" not in short_table(results, regret=False)


@pytest.mark.slow
def test_the_runs_outside_the_bars_are_named_with_what_they_missed_and_a_peaks_step(tmp_path):
    from minigrpo.tools.sweep_report import curves, outside_bars, write_outputs
    from minigrpo.util.jsonl import JsonlLogger

    def run(name, drifts, final=0.99):  # an evaluation a step: the worst drift and its running peak
        (tmp_path / name).mkdir()
        log = JsonlLogger(tmp_path / name / "metrics.jsonl")
        for step, d in enumerate(drifts):
            log.log(
                {
                    "step": step,
                    "target_rate": final if step else 0.15,
                    "worst_drift": d,
                    "malformed": 0.001,
                    "peak_worst_drift": max(drifts[: step + 1]),
                    "peak_malformed": 0.001,
                }
            )
        log.close()
        return curves(tmp_path / name)

    results = {
        "dapo": [run("dapo-s0", [0.0, 0.02, 0.01]), run("dapo-s1", [0.0, 0.02, 0.0303])],
        "ppo": [run("ppo-s0", [0.0, 0.0508, 0.0508, 0.01], final=0.9)],
    }
    assert outside_bars(results) == [
        "dapo-s1: end drift 0.0303 > 0.03",
        "ppo-s0: final target 0.9000 < 0.95; peak drift 0.0508 > 0.05 (step 1)",
    ]
    write_outputs(tmp_path, results, {}, "t")
    table = (tmp_path / "table.md").read_text()
    assert (
        "Runs outside the bars (2):\n\n- dapo-s1: end drift 0.0303 > 0.03\n- ppo-s0: final target"
        in table
    )
    write_outputs(tmp_path, {"dapo": results["dapo"][:1]}, {}, "t")
    assert "Every run within every bar." in (tmp_path / "table.md").read_text()


@pytest.mark.slow
def test_on_a_gpu_compares_first_line_says_how_its_processes_share_it(
    tmp_path, tiny_pretrained, capsys, monkeypatch
):
    """Its GPU stood in for (the runs on the CPU): compare starts no CUDA MPS daemon of its own; its
    first line says its two population processes share the GPU through the machine's MPS where one
    serves (a control pipe where CUDA looks; else they take turns: tests/test_pool.py)."""
    from minigrpo import compare

    init, _, _ = tiny_pretrained
    monkeypatch.setattr(compare, "on_gpu", lambda device: True)
    pipes = tmp_path / "mps-pipes"
    pipes.mkdir()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipes))
    args = ["--algos", "default,ppo", "--seeds", "2", "--init", str(init), *TINY, "--jobs", "2"]
    (pipes / "control").touch()  # a daemon the user started
    main([*args, "--device", "cpu", "--out", str(tmp_path / "served")])
    printed = capsys.readouterr().out
    first = printed.splitlines()[0]
    said = "2 lockstep populations, 2 at a time (sharing the GPU through CUDA MPS) ->"
    assert said in first, printed
    assert printed.count(": ok") == 4, printed
    assert sorted(p.name for p in pipes.iterdir()) == ["control"]  # nothing of compare's there


def test_the_library_starts_no_cuda_mps_daemon():
    """Sharing a GPU through CUDA MPS is the user's to start (docs/running.md): no module of ours
    runs its control program."""
    from test_layers import MODULES

    assert not [n for n, (_, src) in MODULES.items() if "nvidia-cuda-mps-control" in src]


def test_a_run_of_one_engine_is_never_kept_for_the_other(tmp_path):
    """A lockstep member rounds otherwise than its run alone (0.007 apart in final target after 40
    steps): its stamp says it ran in lockstep, so --engine pool makes the run again, and the other
    way round."""
    cmd = [sys.executable, "-m", "minigrpo.grpo", "--out", str(tmp_path / "run")]
    run = finished_run(tmp_path / "run", cmd)
    assert stamps.finished_by(run, cmd) and not stamps.finished_by(run, cmd, lockstep=True)
    (run / "compare_command.json").write_text(json.dumps(stamps.stamp_of(cmd, lockstep=True)))
    assert stamps.finished_by(run, cmd, lockstep=True) and not stamps.finished_by(run, cmd)


def test_overwrite_of_a_folder_it_cannot_remove_is_one_line(tmp_path, monkeypatch):
    """--overwrite on a run folder that cannot be removed (permissions, a busy mount): one line
    naming it, never a traceback."""
    cmd = [sys.executable, "-m", "minigrpo.grpo", "--out", str(tmp_path / "grpo-s0")]
    finished_run(tmp_path / "grpo-s0", cmd)

    def refuse(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(stamps.shutil, "rmtree", refuse)
    with pytest.raises(stamps.UsageError, match="could not remove .*grpo-s0.*Permission denied"):
        stamps.claim_runs(tmp_path, lambda name: [sys.executable, "other"], overwrite=True)
    assert (tmp_path / "grpo-s0" / "summary.json").exists()
