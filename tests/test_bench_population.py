"""bench/population.py: the population section's table, and its limit on how long one population may
take."""

import re
import shutil

import pytest

from minigrpo.bench import population


@pytest.mark.slow
def test_the_section_measures_each_population_and_skips_one_the_last_rate_says_is_too_long(
    tmp_path, tiny_pretrained, monkeypatch
):
    init, _, _ = tiny_pretrained
    monkeypatch.setattr(population, "cores", lambda: 2)
    # 1,000 runs at the rate of 1 and 2 would take far longer
    monkeypatch.setattr(population, "LIMIT_S", 60)
    text = population.bench_population(
        tmp_path, init, "cpu", sizes=[1, 2, 1000], steps=1, grow=0, tries=2
    )
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    ok = lambda name: rows[name].rstrip(" |").endswith("ok")
    assert ok("1 alone, as the pool runs it") and ok("1") and ok("2"), text
    assert "not run: about" in rows["1000"] and "limit per population: 60 s" in rows["1000"], text
    # the run alone and the largest P measured, each twice in turn: median (min–max), and the ratio
    # of each try's rates
    for name in ("1 alone, as the pool runs it", "2", "2 over a run alone, try by try"):
        median, low, high = (float(x) for x in re.findall(r"[\d.]+", rows[name].split("|")[2]))
        assert 0 < low <= median <= high, text
    assert rows["1"].split("|")[2].strip().count(" ") == 0, text  # once: no range
    assert rows["2 over a run alone, try by try"].rstrip(" |").endswith("2 tries"), text
    assert ok("2 in 2 processes"), text
    assert ok("2 of ppo") and ok("2 of ppo_oracle"), text
    # GRPO's presets of μ = 2: one, or each its own
    assert ok("one population") and ok("one each, in turn"), text
    kernels = {how: int(rows[how].split("|")[3]) for how in ("one population", "one each, in turn")}
    # one step's kernels for seven presets
    assert kernels["one population"] < kernels["one each, in turn"], text
    assert not (tmp_path / "population" / "P1000").exists()
    assert "where a lockstep population of P = 2 works" in text, text
    assert "| minigrpo/population/lockstep.py:_step → " in text, text
    assert "torch calls and kernels per step of a lockstep population" in text, text
    assert "| calls, P = 1 | calls, P = 2 | kernels, P = 1 | kernels, P = 2 |" in text, text
    calls = [int(x) for x in rows["all"].split("|")[2:6]]
    # fewer kernels than calls (views launch none)
    assert all(n > 0 for n in calls) and calls[2] < calls[0], text


@pytest.mark.slow
def test_the_recipes_table_says_what_each_member_adds_a_step(tmp_path, tiny_pretrained):
    """One population of 2 × the seeds: most of a step's kernels are made once for all members; each
    member adds a few (its noise drawn once a step, as on a GPU; its rows copied with the others'),
    and on the CPU its own layer norm backward and attention calls of its trees' widths, which keep
    it its single run's to the bit (lm/model.py; a GPU takes neither): 44 a member measured."""
    init, _, _ = tiny_pretrained
    folder = lambda name: (shutil.rmtree(tmp_path / name, ignore_errors=True), tmp_path / name)[1]
    text = population._recipes(folder, init, "cpu", 2, 1, 2)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    kernels = {
        how: int(rows[how].split("|")[3])
        for how in ("one population", "one population of 28 (2 × the seeds)")
    }
    assert rows["one population of 28 (2 × the seeds)"].rstrip(" |").endswith("ok"), text
    added = (kernels["one population of 28 (2 × the seeds)"] - kernels["one population"]) / (
        28 - 14
    )
    assert 0 < added < 64, text
