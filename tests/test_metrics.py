import json
import math

from minigrpo.util.jsonl import JsonlLogger, read_jsonl


def test_every_line_is_strict_json_with_nan_and_inf_as_null(tmp_path):
    log = JsonlLogger(tmp_path / "m.jsonl")
    log.log({"step": 1, "a": float("nan"), "b": float("inf"), "c": 0.5})
    log.close()
    line = (tmp_path / "m.jsonl").read_text().splitlines()[0]
    row = json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))  # rejects NaN/Infinity
    assert row == {"step": 1, "a": None, "b": None, "c": 0.5}


def test_resume_keeps_rows_up_to_the_checkpoint_only(tmp_path):
    log = JsonlLogger(tmp_path / "m.jsonl")
    for s in range(5):
        log.log({"step": s, "x": math.pi})
    log.close()
    JsonlLogger(tmp_path / "m.jsonl", truncate_after_step=2).close()
    assert [r["step"] for r in read_jsonl(tmp_path / "m.jsonl")] == [0, 1, 2]


def test_combine_stats_takes_means_and_keeps_maxima():
    from minigrpo.rl.report import combine_stats
    got = combine_stats([{"loss": 1.0, "ratio_max": 1.5, "a": 2.0}, {"loss": 3.0, "ratio_max": 1.2}])
    assert got == {"loss": 2.0, "ratio_max": 1.5, "a": 2.0}  # a key only some updates report: their mean


def test_plot_panels_skips_empty_panels_and_the_cli_refuses_a_folder_without_an_rl_run(tmp_path, capsys):
    import pytest
    from matplotlib.image import imread

    from minigrpo.metrics import main
    from minigrpo.util.plotting import plot_panels
    rows = [{"step": s, "a": s * 0.1, "b": None if s % 2 else 1.0} for s in range(5)]
    plot_panels(rows, [("a and b", ["a", "b"]), ("never logged", ["c"])], tmp_path / "m.png", title="t")
    assert imread(tmp_path / "m.png").shape[:2] == (288, 1134)  # 1 row of 3 panels: (2.8 + 0.4) x 12.6 in, 90 dpi
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path)])
    assert e.value.code == 2 and "holds no RL run" in capsys.readouterr().err


def strict_loads(text: str):
    """json.loads that refuses NaN and ±Infinity, as a strict parser does."""
    return json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


def test_write_json_is_strict_json_with_non_finite_numbers_as_null_at_any_depth(tmp_path):
    from minigrpo.util.outputs import write_json
    write_json(tmp_path / "s.json", {"implied_beta": float("inf"), "rows": [{"x": float("nan")}, 1.5],
                                     "nested": {"y": float("-inf"), "z": 2}})
    got = strict_loads((tmp_path / "s.json").read_text())
    assert got == {"implied_beta": None, "rows": [{"x": None}, 1.5], "nested": {"y": None, "z": 2}}


def torn(tmp_path, rows: int = 3):
    """A metrics.jsonl whose last row a full disk cut short."""
    path = tmp_path / "m.jsonl"
    log = JsonlLogger(path)
    for s in range(rows):
        log.log({"step": s, "reward_mean": 0.25})
    log.close()
    with open(path, "a") as f:
        f.write('{"step": 3, "reward_mean": 0.2')  # no closing brace, no newline
    return path


def test_a_torn_last_line_is_skipped_with_one_warning(tmp_path, capsys):
    path = torn(tmp_path)
    assert [r["step"] for r in read_jsonl(path)] == [0, 1, 2]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torn" in err and str(path) in err, err


def test_resume_drops_a_torn_last_line_and_appends_whole_rows_after_it(tmp_path, capsys):
    path = torn(tmp_path)
    log = JsonlLogger(path, truncate_after_step=2)
    log.log({"step": 3, "reward_mean": 0.5})
    log.close()
    assert [strict_loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2, 3]


def test_a_bad_line_before_the_last_is_one_line_naming_it(tmp_path):
    import pytest

    from minigrpo.util.cli import UsageError
    path = torn(tmp_path)
    with open(path, "a") as f:
        f.write('\n{"step": 4}\n')
    with pytest.raises(UsageError, match="line 4 is not JSON"):
        read_jsonl(path)


def test_the_metrics_command_draws_a_run_whose_last_line_is_torn(tmp_path, capsys):
    from minigrpo.metrics import main
    (tmp_path / "config.json").write_text(json.dumps({"algo": "grpo", "task": "food", "reward": "pizza",
                                                      "preserve": True, "person": "ravin"}))
    torn(tmp_path).rename(tmp_path / "metrics.jsonl")
    main([str(tmp_path)])
    assert (tmp_path / "metrics.png").stat().st_size > 0 and "torn" in capsys.readouterr().err


def test_the_metrics_command_on_a_folder_it_cannot_write_is_one_line(tmp_path, capsys):
    """A read-only folder gave a traceback. As root chmod does not stop a write, so metrics.png is a folder here:
    the same OSError path."""
    from conftest import one_line_error
    from minigrpo.metrics import main
    (tmp_path / "config.json").write_text(json.dumps({"algo": "grpo", "task": "food", "reward": "pizza",
                                                      "preserve": True, "person": "ravin"}))
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "target_rate": 0.1}\n{"step": 1, "target_rate": 0.2}\n')
    (tmp_path / "metrics.png").mkdir()
    err = one_line_error(lambda argv: main(argv), [str(tmp_path)], capsys)
    assert "cannot write" in err and "metrics.png" in err, err
