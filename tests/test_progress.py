"""population/progress.py: a lockstep population's line now and then, with the quality of its runs
as they go."""

from pathlib import Path
from types import SimpleNamespace

from test_population import _run

from minigrpo import grpo
from minigrpo.population import progress
from minigrpo.population.lockstep import train_lockstep


def _runs(rates, step=7):
    return [
        SimpleNamespace(
            out=Path(f"runs/x/{name}-s{s}"),
            step=step,
            cfg=SimpleNamespace(steps=60),
            last_eval={"target_rate": rate},
        )
        for s, (name, rate) in enumerate(rates)
    ]


def test_a_line_every_so_often_with_the_runs_target_rate(capsys):
    now = [100.0]
    runs = _runs([("default", 0.5), ("default", 0.9), ("dapo", 0.7)])
    line = progress.Progress(runs, every=10, clock=lambda: now[0])
    now[0] = 109.0
    line.tick(runs)
    assert capsys.readouterr().out == ""  # not yet ten seconds
    now[0] = 112.0
    line.tick(runs[:2])
    assert (
        capsys.readouterr().out
        == "  3 runs of default, dapo: step 7/60 after 12 s, 2 going; exact target rate "
        "0.700 (0.500–0.900)\n"
    )
    now[0] = 115.0
    line.tick(runs)  # ten seconds from the last line, not from the start
    assert capsys.readouterr().out == ""


def test_many_algorithms_are_cut_short_and_other_folders_keep_their_names():
    runs = _runs([(n, 0.1) for n in ("a", "b", "c", "d")]) + [
        SimpleNamespace(out=Path("runs/mine"))
    ]
    assert progress.Progress(runs).label == "5 runs of a, b, c, …"
    assert progress.Progress(runs[4:]).label == "1 run of mine"


def test_a_lockstep_population_says_how_it_goes(tmp_path, tiny_pretrained, monkeypatch, capsys):
    init, _, _ = tiny_pretrained
    monkeypatch.setattr(progress, "EVERY_S", 0.0)  # a line at every step
    cfgs = [grpo.parse(_run(init, tmp_path / f"lock-s{s}", s)[2][3:]) for s in range(2)]
    assert [r["step"] for r in train_lockstep(grpo, cfgs, [lambda *a: None] * 2)] == [3, 3]
    lines = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("  2 runs of lock: ")
    ]
    # then it ends
    assert [line.split(": step ")[1].split(" after")[0] for line in lines] == ["1/3", "2/3"], lines
    assert all("2 going; exact target rate " in line for line in lines), lines
