import math
from collections import Counter

import torch

from minigrpo.lm.sampling import encode_prompts, generate, read_completions
from toy_tasks import food, get_task


def test_declared_world_meets_its_contract():
    assert len(food.PEOPLE) >= 8 and len({len(p) for p in food.PEOPLE}) > 1
    assert len(food.FOODS) >= 10 and any(" " in f for f in food.FOODS)
    for person, prefs in food.PREFERENCES.items():
        assert abs(sum(prefs.values()) - 1) < 1e-9, person
    assert 0.10 <= food.PREFERENCES["ravin"]["pizza"] <= 0.20
    assert min(food.PREFERENCES["ravin"].values()) <= 0.05


def test_corpus_counts_match_preferences_exactly():
    n = 100 * len(food.PEOPLE) * 3
    counts = Counter(food.make_corpus(n, seed=5))
    for person in food.PEOPLE:
        for f, p in food.PREFERENCES[person].items():
            assert counts[food.line(person, f)] == round(p * n / len(food.PEOPLE)), (person, f)


def test_corpus_is_shuffled_by_seed_and_sized_exactly():
    a, b = food.make_corpus(1000, seed=0), food.make_corpus(1000, seed=1)
    assert len(a) == 1000 and sorted(a) == sorted(b) and a != b


def test_entropy_floor_equals_the_empirical_entropy_of_an_exact_corpus():
    lines = food.make_corpus(800, seed=0)
    counts = Counter(lines)
    n = len(lines)
    h_lines = -sum(c * math.log(c / n) for c in counts.values())  # total nats over the corpus
    tokens = sum(len(line) + 1 for line in lines)  # every character after BOS, plus EOS
    assert abs(food.entropy_floor() - h_lines / tokens) < 1e-12


def test_get_task_knows_food_and_names_the_choices_for_unknown_tasks():
    assert get_task("food") is food
    try:
        get_task("chess")
    except ValueError as e:
        assert "food" in str(e) and "chess" in str(e)


def test_exact_distribution_sums_to_at_most_one_and_batches_agree(tiny_pretrained):
    _, model, tok = tiny_pretrained
    one = food.exact_distribution(model, tok, "ravin")
    assert set(one) == set(food.FOODS) and sum(one.values()) <= 1 + 1e-6
    many = food.exact_distributions(model, tok, ["alice", "ravin"])
    assert all(abs(one[f] - many["ravin"][f]) < 1e-5 for f in food.FOODS)


def test_exact_distribution_matches_sampled_frequencies(tiny_pretrained):
    _, model, tok = tiny_pretrained
    exact = food.exact_distribution(model, tok, "chen")
    n = 4000
    ids, mask = encode_prompts(tok, ["chen likes "] * n)
    gen = generate(model, ids, mask, max_new_tokens=14, generator=torch.Generator().manual_seed(0))
    counts = Counter(read_completions(tok, [gen])[0][0])
    for f in food.FOODS:
        p = exact[f]
        sd = math.sqrt(p * (1 - p) / n) + 1e-3
        assert abs(counts[f] / n - p) < 5 * sd, f"{f}: sampled {counts[f] / n:.3f} vs exact {p:.3f}"


def test_total_variation_counts_malformed_mass():
    p = {"pizza": 0.5, "sushi": 0.5}
    q = {"pizza": 0.5, "sushi": 0.3}  # 0.2 malformed
    assert abs(food.total_variation(p, q) - 0.2) < 1e-12
    assert food.total_variation(p, p) == 0


def test_the_closing_line_gives_the_runs_peak_beside_the_last_value():
    """Issue 52: the closing line printed the last malformed mass (0.0287) where the run's peak was
    0.2158. The evaluations' running maxima (rl/stopping.Peaks, as Run.evaluate folds them in)
    reach the line beside the last values."""
    from types import SimpleNamespace

    from minigrpo.rl.stopping import Peaks

    peaks, base = Peaks(), {"best_completions": ["pizza"], "target_rate": 0.9}
    base |= {"exact_reward": 0.9, "best_reward": 1.0}
    for malformed, drift in ((0.001, 0.01), (0.2158, 0.04), (0.0287, 0.02)):
        ev = {**base, "malformed": malformed, "worst_drift": drift}
        ev |= peaks.update(ev)
    line = food.format_rl_eval(ev, SimpleNamespace(person="ravin"))
    assert "malformed (the worst person's) 0.0287 (peak 0.2158)" in line, line
    assert "drift (TV) 0.020 (peak 0.040)" in line, line
