import json
import math

from minigrpo.util.jsonl import JsonlLogger, read_jsonl


def test_every_line_is_strict_json_with_nan_and_inf_as_null(tmp_path):
    log = JsonlLogger(tmp_path / "m.jsonl")
    log.log({"step": 1, "a": float("nan"), "b": float("inf"), "c": 0.5})
    log.close()
    line = (tmp_path / "m.jsonl").read_text().splitlines()[0]
    # rejects NaN/Infinity
    row = json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
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

    got = combine_stats(
        [{"loss": 1.0, "ratio_max": 1.5, "a": 2.0}, {"loss": 3.0, "ratio_max": 1.2}]
    )
    # a key only some updates report: their mean
    assert got == {"loss": 2.0, "ratio_max": 1.5, "a": 2.0}


def test_packed_figures_unpack_to_each_updates_own_under_their_tag():
    from minigrpo.rl.report import packed, unpacked

    updates, ratios = [{"loss": 1.0, "grad_norm": 2.0}, {"loss": 3.0}], [{"ratio_max": 1.5}]
    flat = {"reward_mean": 0.5, **packed(updates), **packed(ratios, "ratio")}
    assert unpacked(flat, 2) == updates and unpacked(flat, 1, "ratio") == ratios
    assert unpacked(flat, 3)[2] == {} and unpacked({"loss": 1.0}, 1) == [{}], (
        "the step's own figures are no update's"
    )


def test_plot_panels_skips_empty_panels_and_the_cli_refuses_a_folder_without_an_rl_run(
    tmp_path, capsys
):
    import pytest
    from matplotlib.image import imread

    from minigrpo.metrics import main
    from minigrpo.util.plotting import plot_panels

    rows = [{"step": s, "a": s * 0.1, "b": None if s % 2 else 1.0} for s in range(5)]
    plot_panels(
        rows, [("a and b", ["a", "b"]), ("never logged", ["c"])], tmp_path / "m.png", title="t"
    )
    # 1 row of 3 panels: (2.8 + 0.4) x 12.6 in, 90 dpi
    assert imread(tmp_path / "m.png").shape[:2] == (288, 1134)
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path)])
    assert e.value.code == 2 and "holds no RL run" in capsys.readouterr().err


def strict_loads(text: str):
    """json.loads that refuses NaN and ±Infinity, as a strict parser does."""
    return json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


def test_write_json_is_strict_json_with_non_finite_numbers_as_null_at_any_depth(tmp_path):
    from minigrpo.util.outputs import write_json

    write_json(
        tmp_path / "s.json",
        {
            "implied_beta": float("inf"),
            "rows": [{"x": float("nan")}, 1.5],
            "nested": {"y": float("-inf"), "z": 2},
        },
    )
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

    (tmp_path / "config.json").write_text(
        json.dumps(
            {"algo": "grpo", "task": "food", "reward": "pizza", "preserve": True, "person": "ravin"}
        )
    )
    torn(tmp_path).rename(tmp_path / "metrics.jsonl")
    main([str(tmp_path)])
    assert (tmp_path / "metrics.png").stat().st_size > 0 and "torn" in capsys.readouterr().err


def test_the_metrics_command_on_a_folder_it_cannot_write_is_one_line(tmp_path, capsys):
    """A read-only folder gave a traceback. As root chmod does not stop a write, so metrics.png is a
    folder here: the same OSError path."""
    from conftest import one_line_error

    from minigrpo.metrics import main

    (tmp_path / "config.json").write_text(
        json.dumps(
            {"algo": "grpo", "task": "food", "reward": "pizza", "preserve": True, "person": "ravin"}
        )
    )
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 0, "target_rate": 0.1}\n{"step": 1, "target_rate": 0.2}\n'
    )
    (tmp_path / "metrics.png").mkdir()
    err = one_line_error(lambda argv: main(argv), [str(tmp_path)], capsys)
    assert "cannot write" in err and "metrics.png" in err, err


def rl_run(folder, rows, summary=None, **config):
    """A folder holding an RL run: config.json, metrics.jsonl and (when given) summary.json."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {
        "algo": "grpo",
        "task": "food",
        "reward": "pizza",
        "preserve": True,
        "person": "ravin",
        "goal": 0.95,
        "goal_malformed": 0.01,
        "goal_drift": 0.03,
        **config,
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def evaluated(step, target, drift, malformed, peak_drift=None, peak_malformed=None):
    return {
        "step": step,
        "reward_mean": target,
        "target_rate": target,
        "worst_drift": drift,
        "malformed": malformed,
        "peak_worst_drift": peak_drift or drift,
        "peak_malformed": peak_malformed or malformed,
    }


def test_the_metrics_command_has_a_help_and_sums_up_each_run_it_draws(tmp_path, capsys):
    """`metrics --help` was "error: usage: ...", exit 2; a drawn run said only "wrote
    .../metrics.png"."""
    import pytest
    from conftest import one_line_error

    from minigrpo.metrics import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: ")
    good = rl_run(
        tmp_path / "good",
        [evaluated(0, 0.15, 0.0, 0.001), evaluated(15, 0.986, 0.012, 0.0014, 0.033)],
        {"step": 15, "stop_reason": "goal reached at step 13"},
    )
    bad = rl_run(
        tmp_path / "bad",
        [evaluated(0, 0.15, 0.0, 0.001), evaluated(60, 0.80, 0.04, 0.0014, 0.061)],
        {"step": 60, "stop_reason": "cap: --steps 60 reached"},
    )
    # no summary
    torn = rl_run(
        tmp_path / "torn", [evaluated(0, 0.15, 0.0, 0.001), evaluated(4, 0.5, 0.01, 0.001)]
    )
    main([str(good), str(bad), str(torn)])
    out = capsys.readouterr().out
    blocks = out.split("wrote ")  # each run's summary, then "wrote <its metrics.png>"
    assert [b.splitlines()[0] for b in blocks[1:]] == [
        str(f / "metrics.png") for f in (good, bad, torn)
    ], out
    first, second, third = blocks[:3]
    assert (
        "15 steps" in first and "goal reached at step 13" in first and "final target 0.986" in first
    ), out
    assert "drift 0.012 (peak 0.033)" in first and "malformed 0.0014 (peak 0.0014)" in first, out
    assert "within every bar" in first, out
    assert "60 steps" in second and "cap: --steps 60 reached" in second, out
    assert "final target 0.8000 < 0.95" in second and "peak drift 0.0610 > 0.05" in second, out
    assert "end drift 0.0400 > 0.03" in second and "malformed" not in second.split("outside")[1], (
        out
    )
    assert "4 steps" in third and "no summary.json" in third, out
    assert all(len(line) <= 120 for line in out.splitlines()), out
    assert "unrecognized arguments: --bogus" in one_line_error(main, [str(good), "--bogus"], capsys)
    assert "RUN_FOLDER" in one_line_error(main, [], capsys)


def test_metrics_png_draws_the_bars_its_run_is_judged_by(tmp_path, monkeypatch):
    """The panels of metrics.png declare the quality bars (tools/bars.py) and the run's own --goal
    flags: plot_panels receives them as lines (y, label) on the target, drift and malformed
    panels."""
    from minigrpo import dpo, grpo, ppo
    from minigrpo.rl import report

    drawn = {}
    monkeypatch.setattr(
        report, "plot_panels", lambda rows, panels, path, title: drawn.update(panels=panels)
    )
    rows = [evaluated(0, 0.15, 0.0, 0.001), evaluated(1, 0.2, 0.01, 0.001)]

    def bars(panels, key):
        (panel,) = [p for p in panels if key in p[1]]
        return sorted(y for y, label in (panel[2] if len(panel) > 2 else []))

    for panels in (grpo.PANELS, ppo.PANELS, dpo.PANELS):
        report.draw_figure(rl_run(tmp_path / "a", rows), panels)
        assert bars(drawn["panels"], "target_rate") == [0.95]
        assert bars(drawn["panels"], "malformed") == [0.01, 0.02]
        assert bars(drawn["panels"], "worst_drift") == [0.03, 0.05]
    # its own goal too
    report.draw_figure(rl_run(tmp_path / "b", rows, goal=0.9, goal_drift=0.02), grpo.PANELS)
    assert bars(drawn["panels"], "target_rate") == [0.9, 0.95]
    assert bars(drawn["panels"], "worst_drift") == [0.02, 0.03, 0.05]
    # compare's runs: --goal 0
    report.draw_figure(rl_run(tmp_path / "c", rows, goal=0.0), grpo.PANELS)
    assert bars(drawn["panels"], "target_rate") == [0.95]
    labels = [label for p in drawn["panels"] if len(p) > 2 for _, label in p[2]]
    assert labels and all(label for label in labels)


def test_damaged_run_files_are_one_line_naming_the_file_never_a_traceback(tmp_path, capsys):
    """A corrupt summary.json is said in the run's summary (the metrics are still drawn); a binary
    metrics.jsonl, a line that is JSON but not an object, or a config.json that is not an object:
    one line naming the file, exit 2."""
    from conftest import one_line_error

    from minigrpo.metrics import main

    rows = [evaluated(0, 0.1, 0.0, 0.001), evaluated(1, 0.2, 0.01, 0.001)]
    run = rl_run(tmp_path / "summary", rows)
    (run / "summary.json").write_text('{"step": 1')
    main([str(run)])
    assert "summary.json is not readable JSON" in capsys.readouterr().out
    assert (run / "metrics.png").stat().st_size > 0
    binary = rl_run(tmp_path / "binary", rows)
    (binary / "metrics.jsonl").write_bytes(bytes(range(256)) * 4)
    assert "metrics.jsonl is not text" in one_line_error(main, [str(binary)], capsys)
    listed = rl_run(tmp_path / "listed", rows)
    text = (listed / "metrics.jsonl").read_text()
    (listed / "metrics.jsonl").write_text("[1, 2]\n" + text)
    assert "line 1 is not a JSON object" in one_line_error(main, [str(listed)], capsys)
    config = rl_run(tmp_path / "config", rows)
    (config / "config.json").write_text("[]")
    assert "config.json holds a JSON list" in one_line_error(main, [str(config)], capsys)
