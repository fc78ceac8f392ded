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
