"""bench/population.py: the population section's table, and its limit on how long one population may take."""

from minigrpo.bench import population


def test_the_section_measures_each_population_and_skips_one_the_last_rate_says_is_too_long(tmp_path, tiny_pretrained,
                                                                                         monkeypatch):
    init, _, _ = tiny_pretrained
    monkeypatch.setattr(population, "cores", lambda: 2)
    monkeypatch.setattr(population, "LIMIT_S", 60)  # 1,000 runs at the rate of 1 and 2 would take far longer
    text = population.bench_population(tmp_path, init, "cpu", sizes=[1, 2, 1000], steps=1)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert rows["1 (alone, as the pool runs it)"].rstrip(" |").endswith("ok"), text
    assert rows["1"].rstrip(" |").endswith("ok") and rows["2"].rstrip(" |").endswith("ok"), text
    assert "not run: about" in rows["1000"] and "limit per population: 60 s" in rows["1000"], text
    assert rows["2 in 2 processes"].rstrip(" |").endswith("ok"), text  # the largest population measured
    assert not (tmp_path / "population" / "P1000").exists()
    assert "where a population's threads work: P = 2 on cpu" in text and "| minigrpo/rl/loop.py:run → " in text, text
    assert "torch calls per run-step of one run on cpu (1 steps" in text and "| all " in text, text
