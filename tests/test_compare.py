import pytest

from minigrpo.compare import main


def test_compare_smoke_writes_all_outputs_reports_failures_and_resumes(tmp_path, tiny_pretrained, capsys):
    init, _, _ = tiny_pretrained
    out = tmp_path / "cmp"
    args = ["--algos", "grpo,ppo", "--seeds", "1", "--out", str(out), "--init", str(init), "--steps", "3",
            "--group-size", "4", "--prompts-per-step", "2", "--preserve-per-prompt", "2", "--jobs", "2"]
    main(args)
    assert {"curves.png", "frontier.png", "table.md"} <= {p.name for p in out.iterdir()}
    table = (out / "table.md").read_text()
    assert "| grpo | 1 ok" in table and "| ppo | 1 ok" in table
    stamp = (out / "grpo-s0" / "metrics.jsonl").stat().st_mtime_ns
    main(args)  # a rerun keeps finished runs
    assert (out / "grpo-s0" / "metrics.jsonl").stat().st_mtime_ns == stamp
    main(args[:1] + ["grpo"] + args[2:])  # a subset with the same flags: ppo's finished run stays in the table
    table = (out / "table.md").read_text()
    assert "| grpo | 1 ok" in table and "| ppo | 1 ok" in table
    main(args + ["--group-size", "2"])  # another command: the cached runs are not reused
    assert (out / "grpo-s0" / "metrics.jsonl").stat().st_mtime_ns != stamp
    with pytest.raises(SystemExit) as e:  # --updates is GRPO's only: refused before any run starts
        main(args[:-2] + ["--updates", "2", "--out", str(tmp_path / "bad"), "--jobs", "2"])
    assert e.value.code == 2 and "unrecognized arguments: --updates 2" in capsys.readouterr().err
    assert not (tmp_path / "bad" / "grpo-s0").exists()
    flaky = tmp_path / "flaky.py"  # fine on the 12 foods and 2 malformed probes scored at start, raises later
    flaky.write_text("n = 0\ndef f(prompt, completion):\n    global n\n    n += 1\n"
                     "    if n > 14:\n        raise RuntimeError('boom')\n    return 0.0\n")
    with pytest.raises(SystemExit) as e:
        main(args + ["--reward", f"{flaky}:f", "--out", str(tmp_path / "fail")])
    table = (tmp_path / "fail" / "table.md").read_text()
    assert e.value.code == 1 and "failed: grpo seed 0" in table and "failed: ppo seed 0" in table and "boom" in table


@pytest.mark.parametrize("argv, message", [(["--algos", "grpo,sac"], "unknown algorithm(s) sac"),
                                           (["--seeds", "0"], "--seeds must be >= 1"),
                                           (["--seed", "3"], "set by compare itself"),
                                           (["--jobs", "-1"], "--jobs must be >= 0"),
                                           (["--task", "chess"], "unknown task 'chess'"),
                                           (["--reward", "nonsense"], "unknown reward 'nonsense'"),
                                           (["--init", "/nope.pt"], "'/nope.pt' does not exist")])
def test_compare_bad_input(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and message in capsys.readouterr().err
