import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from conftest import pretrain_tiny
from hypothesis import given, settings
from hypothesis import strategies as st

from toy_tasks import arithmetic as ar
from toy_tasks import get_task
from toy_tasks.rewards import make_reward
from toy_tasks.support import reward_table

N = len(ar.EXPRESSIONS)


def kind_of(line: str) -> tuple[str, str]:
    """(prompt, declared outcome kind) of a corpus line."""
    prompt, _, completion = line.partition("=")
    prompt += "="
    return prompt, ar.KINDS[ar.completions(prompt).index(completion)]


# ---- the world -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, value",
    [
        ("3+4*2", 11),
        ("3*4+2", 14),
        ("2-3*3", -7),
        ("9-9", 0),
        ("0*7", 0),
        ("3-2-1", 0),
        ("1-2+3", 2),
        ("2*3-1", 5),
        ("1+2*3", 7),
        ("3*3*3", 27),
        ("1-3*3", -8),
        ("2*2-3*1", 1),
        ("9*9", 81),
        ("0-9", -9),
    ],
)
def test_precedence_on_hand_examples(expression, value):
    assert ar.evaluate(expression) == value


def test_every_expression_agrees_with_python():
    assert 300 <= N <= 2000 and len(set(ar.EXPRESSIONS)) == N
    # precedence matters
    assert any(len(p) == 6 and "*" in p[3:] and p[1] in "+-" for p in ar.EXPRESSIONS)
    for p in ar.EXPRESSIONS:
        assert p.endswith("=") and ar.VALUES[p] == eval(p[:-1]) == ar.value(p), p


@pytest.mark.parametrize("bad", ["", "3+", "+3", "3++4", "3=4", "a+b", "3 + 4"])
def test_evaluate_rejects_non_expressions(bad):
    with pytest.raises(ValueError):
        ar.evaluate(bad)


def test_heldout_is_a_fixed_disjoint_tenth():
    assert set(ar.PROMPTS).isdisjoint(ar.HELDOUT)
    assert sorted(ar.PROMPTS + ar.HELDOUT) == sorted(ar.EXPRESSIONS)
    assert len(ar.HELDOUT) == round(0.1 * N)
    cfg = SimpleNamespace(reward="correct", person="ravin")
    assert ar.rl_prompts(cfg) == ar.PROMPTS and ar.anchor_prompts(cfg) == []


def test_error_model_is_declared_and_consistent():
    assert abs(sum(q for _, q, _, _ in ar.OUTCOMES) - 1) < 1e-12 and ar.P_CORRECT == 0.6
    for p in ["3+2*2=", "0-9=", "9*9="]:
        comps = ar.completions(p)
        # distinct outcomes give distinct strings
        assert len(set(comps)) == len(comps) == len(ar.KINDS)
        for kind, c in zip(ar.KINDS, comps):
            assert (ar.FORMAT.fullmatch(c) is not None) == kind.endswith("/ok"), (kind, c)
            assert ar.reward_correct(p, c) == float(kind.startswith("right/")), (kind, c)


def test_lines_fit_the_alphabet_and_block():
    lines = [p + c for p in ar.EXPRESSIONS for c in ar.completions(p)]
    assert set("".join(lines)) == set(ar.ALPHABET)
    assert max(len(s) for s in lines) + 2 <= ar.BLOCK_SIZE and get_task("arithmetic") is ar


# ---- the corpus ---------------------------------------------------------------------------------


def test_exact_corpus_matches_the_error_model_per_expression():
    n = N * ar.CORPUS_UNIT
    counts = Counter(kind_of(s) for s in ar.make_corpus(n, seed=3))
    for p in ar.EXPRESSIONS:
        for kind, q, _, _ in ar.OUTCOMES:
            assert counts[p, kind] == round(q * ar.CORPUS_UNIT), (p, kind)


@pytest.mark.parametrize("n", [800, 8000, 12345])
def test_inexact_corpus_is_within_a_line_or_two_of_the_error_model(n):
    lines = ar.make_corpus(n, seed=0)
    assert len(lines) == n
    pairs = [kind_of(s) for s in lines]
    per_expr = Counter(p for p, _ in pairs)
    assert len(per_expr) == N and set(per_expr.values()) <= {n // N, n // N + 1}  # HELDOUT included
    kinds, joint = Counter(k for _, k in pairs), Counter(pairs)
    for kind, q, _, _ in ar.OUTCOMES:
        assert abs(kinds[kind] - q * n) < 1, kind  # globally: within one line of the declared share
        # per expression
        assert all(abs(joint[p, kind] - q * c) < 2 for p, c in per_expr.items()), kind
    for number, _, q in ar.NUMBERS:
        count = Counter(p for p, k in pairs if k.startswith(number + "/"))
        assert all(abs(count[p] - q * c) < 2 for p, c in per_expr.items()), number
    well_formed = Counter(p for p, k in pairs if k.endswith("/ok"))
    assert all(abs(well_formed[p] - ar.P_WELL_FORMED * c) < 3 for p, c in per_expr.items())


def test_corpus_is_shuffled_by_seed():
    a, b = ar.make_corpus(2000, seed=0), ar.make_corpus(2000, seed=1)
    assert len(a) == 2000 and a != b and ar.make_corpus(2000, seed=0) == a


def test_entropy_floor_equals_the_empirical_entropy_of_an_exact_corpus():
    lines = ar.make_corpus(N * ar.CORPUS_UNIT, seed=0)
    counts = Counter(lines)
    n = len(lines)
    h_lines = -sum(c * math.log(c / n) for c in counts.values())
    tokens = sum(len(s) + 1 for s in lines)  # every character after BOS, plus EOS
    assert abs(ar.entropy_floor() - h_lines / tokens) < 1e-12


# ---- rewards ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, correct, fmt",
    [
        ("7.", 1, 1),
        ("7", 1, 0),
        ("7..", 1, 0),
        (" 7.", 1, 0),
        ("8.", 0, 1),
        ("6", 0, 0),
        ("", 0, 0),
        ("abc", 0, 0),
        ("-7.", 0, 1),
        ("07.", 1, 0),
        ("7.5", 1, 0),
        ("x7y", 1, 0),
        ("7" * 5000, 0, 0),
        ("٧.", 0, 0),
    ],
)
def test_rewards_on_hand_examples(completion, correct, fmt):
    p = "3+2*2="  # 7
    assert ar.reward_correct(p, completion) == correct and ar.reward_format(p, completion) == fmt
    assert make_reward("correct+format", ar.REWARDS, ar.REWARD_HELP)(p, completion) == correct + fmt
    assert (
        make_reward("correct=1,format=1", ar.REWARDS, ar.REWARD_HELP)(p, completion)
        == correct + fmt
    )
    assert ar.reward_strict(p, completion) == float(completion == "7.")


def test_negative_and_zero_answers():
    assert ar.reward_correct("1-3*3=", "-8.") == 1 and ar.reward_correct("1-3*3=", "8.") == 0
    assert ar.reward_format("9-9=", "0.") == 1 and ar.reward_format("9-9=", "-0.") == 0
    assert ar.answer("0-9=") == "-9."


def test_factory_names_only_its_own_rewards():
    factory = ar.REWARDS["arith"]
    assert factory("pizza") is None and factory("exact:7.") is None
    assert set(ar.REWARD_RANGES) == set(ar.REWARD_HELP)
    for name in ar.REWARD_HELP:
        assert callable(factory(name))


@settings(max_examples=300, deadline=None)
@given(completion=st.text(), index=st.integers(0, N - 1))
def test_rewards_never_raise_and_stay_in_range(completion, index):
    prompt = ar.EXPRESSIONS[index]
    for name, (lo, hi) in ar.REWARD_RANGES.items():
        r = ar.REWARDS["arith"](name)(prompt, completion)
        assert isinstance(r, float) and math.isfinite(r) and lo <= r <= hi, (name, completion)


# ---- exact evaluation on a tiny trained model ---------------------------------------------------


@pytest.fixture(scope="module")
def tiny_arith(tmp_path_factory):
    _, model, tok = pretrain_tiny(
        tmp_path_factory.mktemp("pretrain-arith"),
        task="arithmetic",
        steps=150,
        batch_size=64,
        n_embd=32,
        n_head=2,
        lr=1e-2,
        n_lines=4000,
        eval_every=150,
        ckpt_every=150,
        threads=1,
    )
    return model, tok


def test_exact_accuracy_matches_sampling(tiny_arith):
    model, tok = tiny_arith
    prompts = ar.PROMPTS[::12]
    exact = ar.exact_accuracy(model, tok, prompts)
    n = 100 * len(prompts)
    sampled = ar.sampled_accuracy(model, tok, prompts, 100, torch.Generator().manual_seed(0))
    se = math.sqrt(exact * (1 - exact) / n)
    assert 0.02 < exact < 0.98 and abs(sampled - exact) < 5 * se, (exact, sampled, se)


def test_exact_figures_are_consistent(tiny_arith):
    model, tok = tiny_arith
    mixed = ["3+2*2=", "9*9=", "1-3*3=", "0-9="]  # different lengths: left padding must not matter
    alone = [ar.exact_accuracy(model, tok, [p]) for p in mixed]
    assert abs(sum(alone) / len(alone) - ar.exact_accuracy(model, tok, mixed)) < 1e-5
    probs = ar.exact_outcomes(model, tok, mixed)
    assert probs.shape == (4, len(ar.KINDS)) and (probs.sum(1) <= 1 + 1e-5).all()
    assert torch.allclose(probs[:, ar.KINDS.index("right/ok")], torch.tensor(alone), atol=1e-5)
    cfg = SimpleNamespace(reward="correct+format", person="ravin")
    rewards = reward_table(make_reward("correct+format", ar.REWARDS), ar.PROMPTS, ar.support)
    ev = ar.rl_evaluate(model, tok, ar.rl_baseline(model, tok, cfg), cfg, rewards)
    assert "worst_drift" not in ev, "a task without off-target prompts has no drift to report"
    assert abs(ev["malformed"] + ev["format_rate"] - 1) < 1e-6
    assert 0 <= ev["target_rate"] <= min(ev["correct_rate"], ev["format_rate"])
    assert ev["best_reward"] == 2.0  # "v." is right and well-formed
    # exact E[r] over the declared support = 2·P(v.) + P(right number, a slip) + P(v±1 well-formed)
    kinds = ar.exact_outcomes(model, tok, ar.PROMPTS).mean(0)
    by_kind = dict(zip(ar.KINDS, kinds.tolist()))
    by_hand = sum((("right/" in k) + k.endswith("/ok")) * q for k, q in by_kind.items())
    assert abs(ev["exact_reward"] - by_hand) < 1e-5, (ev["exact_reward"], by_hand)
    assert "heldout" in ar.format_rl_eval(ev, cfg)
    report = ar.pretrain_report(model, tok)
    assert isinstance(report["ok"], bool) and "declared" in ar.format_report(report)
