"""bench/sweep.py: the sweep section's table, the GPU's readings and the phases they split the wall
time into."""

import os
import stat
import time

import pytest

from minigrpo.bench import sweep


@pytest.mark.slow
def test_the_section_times_compare_and_checks_its_runs_against_the_bars(
    tmp_path, tiny_pretrained, capsys
):
    init, _, _ = tiny_pretrained
    text = sweep.bench_sweep(
        tmp_path,
        init,
        "cpu",
        seeds=2,
        extra=("--algos", "default,ppo", "--steps", "2"),
        also=[("--jobs", "1")],
    )  # and again with another flag
    row, again = [
        line for line in text.splitlines() if line.startswith("| `python -m minigrpo.compare")
    ]
    assert again.startswith(
        "| `python -m minigrpo.compare --seeds 2 --reward pizza --device cpu --algos default,ppo "
        "--steps 2 --jobs 1` |"
    ) and again.rstrip(" |").endswith("ok"), again
    assert (tmp_path / "sweep-jobs1" / "ppo-s1" / "summary.json").exists()
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sweep: ")]
    assert [line.split(":")[1] for line in progress] == [" as it is", " --jobs 1"], progress
    command, wall, within, longest, marks, status = [
        c.strip() for c in row.strip("| \n").split(" | ")
    ]
    assert (
        command
        == "`python -m minigrpo.compare --seeds 2 --reward pizza --device cpu --algos default,ppo "
        "--steps 2`"
    ), row
    assert float(wall) > 0 and status == "ok", row
    seconds, algorithm = longest.split(" ")  # the longest run's steps: less than the whole command
    assert 0 < float(seconds) < float(wall) and algorithm in ("(default)", "(ppo)"), row
    # claimed, the runs' folders made, the last begun, ended (the last to end)
    marks, last = marks.split(" (")
    claimed, made, begun, ended = marks.split(" · ")
    first, made = (float(m) for m in made.split("–"))
    assert 0 < float(claimed) <= first <= made <= float(begun) <= float(ended) < float(wall), row
    assert last in ("default)", "ppo)"), row
    # 2 seeds of 2 algorithms; 2 steps of a tiny model reach no goal: 0/4
    assert within.endswith("/4"), row
    assert (tmp_path / "sweep" / "ppo-s1" / "summary.json").exists() and (
        tmp_path / "sweep" / "table.md"
    ).exists()
    # then the report alone, timed twice
    report = text.split("compare's report of its 4 runs")[1].splitlines()
    assert (
        "all but ppo's made before" in report[1] or "all but default's made before" in report[1]
    ), report
    cold, warm = (float(c) for c in report[3].strip("| \n").split(" | "))
    assert cold > 0 and warm > 0 and not (tmp_path / "sweep-report").exists()


def test_phases_split_the_wall_time_by_the_gpus_memory_and_utilisation():
    # (seconds, MiB, %): 2 s before any memory, 3 s held (1 of them busy), then let go 1 s before
    # the end
    samples = [(0, 0, 0), (1, 10, 0), (2, 500, 10), (3, 600, 90), (4, 600, 50), (5, 10, 0)]
    assert sweep.phases(samples, wall=6) == (2, 1, 2, 1)
    assert sweep.phases(samples[:5], wall=5) == (2, 1, 2, 0)  # held to the end
    # never more than at the start
    assert sweep.phases([(0, 300, 0), (1, 320, 100)], wall=2) == (2, 0, 0, 0)
    assert sweep.phases([], wall=3) == (3, 0, 0, 0)  # no readings


def test_readings_come_from_nvidia_smi_and_none_without_it(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '1234, 56'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with sweep.GpuReadings() as readings:
        deadline = time.monotonic() + 30
        while not readings.samples and time.monotonic() < deadline:
            time.sleep(0.01)
    assert readings.samples[0][1:] == (1234.0, 56.0)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with sweep.GpuReadings() as readings:
        pass
    assert readings.samples == []


def test_timeline_gives_the_claim_and_the_runs_files_in_seconds_from_the_start(tmp_path):
    start, runs = 1_000_000.0, [tmp_path / "default-s0", tmp_path / "ppo-s0"]
    times = {"default-s0": (2.0, 9.5, 30.0), "ppo-s0": (3.0, 8.0, 41.25)}  # made, begun, ended
    for run in runs:
        run.mkdir()
        for name, t in zip((sweep.STAMP, "config.json", "summary.json"), times[run.name]):
            (run / name).write_text("{}")
            os.utime(run / name, (start + t, start + t))
    # no .lock: not claimed
    assert sweep.timeline(tmp_path, runs, start) == "– · 2.0–3.0 · 9.5 · 41.2 (ppo)"
    (tmp_path / ".lock").write_text("")
    os.utime(tmp_path / ".lock", (start + 1.5, start + 1.5))
    (runs[1] / "summary.json").unlink()  # a failed run has none
    assert sweep.timeline(tmp_path, runs, start) == "1.5 · 2.0–3.0 · 9.5 · 30.0 (default)"
    assert sweep.timeline(tmp_path / "none", [], start) == "– · – · – · –"


def test_a_gpu_row_says_how_compares_processes_shared_the_gpu():
    first = (
        "compare: 9 algorithms x 128 seeds (1152 to run), 9 lockstep populations, 9 at a time "
        "({}) -> runs/x\n  ok\n"
    )
    said = "sharing the GPU through CUDA MPS, a daemon of this command's own"
    assert sweep.sharing(first.format(said)) == said
    assert (
        sweep.sharing(first.replace(" ({})", "")) == "one process"
        and sweep.sharing("") == "one process"
    )
