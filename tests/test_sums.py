import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from conftest import pretrain_tiny
from hypothesis import given, settings
from hypothesis import strategies as st

from minigrpo.exact.frontier import pass_at_k_estimate
from toy_tasks import get_task
from toy_tasks import sums as su
from toy_tasks import sums_exact as sx
from toy_tasks import sums_world as sw
from toy_tasks.rewards import make_reward
from toy_tasks.support import padded, reward_table

N = len(su.EXPRESSIONS)


def completion_of(line: str) -> tuple[str, str]:
    """(prompt, completion) of a corpus line: the prompt ends at the first "="."""
    head, _, tail = line.partition("=")
    return head + "=", tail


# ---- the world -----------------------------------------------------------------------------------


def test_prompts_are_declared_sums_and_heldout_is_a_fixed_disjoint_tenth():
    assert get_task("sums") is su and N == 81 + 243 + 243 == len(set(su.EXPRESSIONS))
    assert Counter(len(p) for p in su.EXPRESSIONS) == {4: 81, 6: 243, 8: 243}
    assert su.value("3+4+2=") == 9 and sw.operands("9+9+9+9=") == [9] * 4
    assert set(su.PROMPTS).isdisjoint(su.HELDOUT) and len(su.HELDOUT) == 8 + 24 + 24
    held = [sum(len(p) == 2 * n for p in su.HELDOUT) for n in (2, 3, 4)]
    assert held == [8, 24, 24], "a tenth of each number of operands"
    assert sorted(su.PROMPTS + su.HELDOUT) == sorted(su.EXPRESSIONS)
    cfg = SimpleNamespace(reward="correct")
    assert su.rl_prompts(cfg) == su.PROMPTS and su.anchor_prompts(cfg) == []


@pytest.mark.parametrize("bad", ["", "3+4", "3+=", "34+2=", "3-4=", "0+0=x"])
def test_operands_reject_other_text(bad):
    with pytest.raises(ValueError):
        sw.operands(bad)


def test_worked_steps_by_hand():
    assert sw.worked_text([3, 4, 2], (0, 0)) == ("(3+4=7,7+2=9)9.", 9)
    # a slip carries on: the next step adds to the result as written
    assert sw.worked_text([3, 4, 2], (1, 0)) == ("(3+4=8,8+2=10)10.", 10)
    assert sw.worked_text([3, 4], (-1,)) == ("(3+4=6)6.", 6)
    assert sw.worked_text([9, 9, 9, 9], (1, 1, 1)) == ("(9+9=19,19+9=29,29+9=39)39.", 39)


@pytest.mark.parametrize("prompt", ["3+4=", "1+1+1=", "9+9+9+9=", "5+2+8+1="])
def test_outcomes_are_distinct_declared_and_well_formed(prompt):
    outs = su.outcomes(prompt)
    n = len(sw.operands(prompt))
    assert len(outs) == len(sw.DIRECT_ANSWERS) + 3 ** (n - 1) == len({o.text for o in outs})
    assert abs(sum(o.probability for o in outs) - 1) < 1e-12
    assert abs(sum(o.probability for o in outs if o.worked) - su.P_WORKED) < 1e-12
    v = su.value(prompt)
    right_at_once = sum(o.probability for o in outs if not o.worked and o.answer == v)
    assert abs(right_at_once - (1 - su.P_WORKED) * su.DIRECT_RIGHT[n]) < 1e-12
    for o in outs:
        fmt = sw.WORKED_FORMAT if o.worked else sw.DIRECT_FORMAT
        assert fmt.fullmatch(o.text) and su.final_answer(o.text) == o.answer >= 0
        assert su.reward_correct(prompt, o.text) == float(o.answer == v)
        assert len(prompt + o.text) + 2 <= su.BLOCK_SIZE and set(o.text) <= set(su.ALPHABET)


def test_working_pays_for_every_number_of_operands():
    # every chain of slips whose offsets cancel is right too: 0.95² + 2·0.025² for two steps
    assert su.WORKED_RIGHT[3] == pytest.approx(0.95**2 + 2 * 0.025**2)
    for n in sw.OPERANDS:
        assert su.WORKED_RIGHT[n] > su.DIRECT_RIGHT[n] and su.WORKED_RIGHT[n] > 0.85
    assert su.DIRECT_RIGHT[2] > su.DIRECT_RIGHT[3] > su.DIRECT_RIGHT[4]


# ---- the corpus ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [N * 10 + 7])
def test_corpus_lines_are_declared_and_within_a_line_of_the_shares(n):
    lines = sw.make_corpus(n, seed=0)
    assert len(lines) == n
    pairs = [completion_of(s) for s in lines]
    per_prompt = Counter(p for p, _ in pairs)
    assert len(per_prompt) == N and set(per_prompt.values()) <= {n // N, n // N + 1}
    kinds = {p: {o.text: o for o in su.outcomes(p)} for p in su.EXPRESSIONS}
    found = [kinds[p][c] for p, c in pairs]  # KeyError: a line outside the declared support
    assert all(o.probability > 0 for o in found)
    for k in sw.OPERANDS:
        mine = [(p, o) for (p, _), o in zip(pairs, found) if len(p) == 2 * k]
        worked = sum(o.worked for _, o in mine)
        assert abs(worked - su.P_WORKED * len(mine)) < 1
        direct = Counter(o.answer - su.value(p) for p, o in mine if not o.worked)
        for off, q in sw.DIRECT_OFFSETS[k].items():
            assert abs(direct[off] - q * (len(mine) - worked)) < 1, (k, off)


def test_corpus_is_shuffled_by_seed():
    a, b = sw.make_corpus(2000, seed=0), sw.make_corpus(2000, seed=1)
    assert a != b and sw.make_corpus(2000, seed=0) == a


def test_entropy_floor_decomposes_by_prompt():
    # H(line) = log N + mean over prompts of H(completion | prompt), every line being distinct
    h_completion = [
        -sum(o.probability * math.log(o.probability) for o in su.outcomes(p) if o.probability)
        for p in su.EXPRESSIONS
    ]
    length = [
        sum(o.probability * (len(p + o.text) + 1) for o in su.outcomes(p)) for p in su.EXPRESSIONS
    ]
    h = math.log(N) + sum(h_completion) / N
    assert su.entropy_floor() == pytest.approx(h / (sum(length) / N), rel=1e-12)


# ---- rewards ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, correct, fmt, worked",
    [
        ("9.", 1, 1, 0),
        ("(3+4=7,7+2=9)9.", 1, 1, 1),
        ("(3+4=8,8+2=10)10.", 0, 1, 1),
        ("(3+4=8,8+1=9)9.", 1, 1, 1),  # wrong work, right answer: correct pays the answer
        ("10.", 0, 1, 0),
        ("9", 0, 0, 0),
        ("9..", 0, 0, 0),
        ("x)9.", 1, 0, 0),
        ("19.", 0, 1, 0),
        ("", 0, 0, 0),
        ("9" * 5000 + ".", 0, 1, 0),
        ("٩.", 0, 0, 0),
    ],
)
def test_rewards_on_hand_examples(completion, correct, fmt, worked):
    p = "3+4+2="
    assert su.reward_correct(p, completion) == correct
    assert su.reward_format(p, completion) == fmt and su.reward_worked(p, completion) == worked
    assert make_reward("correct+format", su.REWARDS, su.REWARD_HELP)(p, completion) == correct + fmt


def test_factory_names_only_its_own_rewards():
    factory = su.REWARDS["sums"]
    assert factory("pizza") is None and set(su.REWARD_RANGES) == set(su.REWARD_HELP)
    assert all(callable(factory(name)) for name in su.REWARD_HELP)


@settings(max_examples=100, deadline=None)
@given(completion=st.text(), prompt=st.text() | st.sampled_from(su.EXPRESSIONS))
def test_rewards_never_raise_and_stay_in_range(completion, prompt):
    for name, (lo, hi) in su.REWARD_RANGES.items():
        r = su.REWARDS["sums"](name)(prompt, completion)
        assert isinstance(r, float) and lo <= r <= hi, (name, completion)


# ---- exact figures: pure functions of the support's probabilities ------------------------------


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    data=st.data(),
)
def test_padded_rows_keep_their_values_and_pad_with_their_lowest(sizes, data):
    flat = data.draw(st.lists(st.floats(-5, 5), min_size=sum(sizes), max_size=sum(sizes)))
    out = padded(flat, sizes)
    assert out.shape == (len(sizes), max(sizes))
    start = 0
    for i, k in enumerate(sizes):
        assert out[i, :k].tolist() == flat[start : start + k]
        assert (out[i, k:] == min(flat[start : start + k])).all()
        start += k
    if len(set(sizes)) == 1:  # every row full: the plain reshape
        assert torch.equal(out, torch.tensor(flat, dtype=torch.float64).view(len(sizes), -1))


PROBE = ["3+4=", "1+2+3=", "9+9+9+9=", "2+7+1+5="]


def random_probs(seed: int, on_support: float) -> torch.Tensor:
    """(1, P, K) probabilities on PROBE's supports summing to `on_support` per prompt."""
    lay = sx.layout(tuple(PROBE))
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(lay.real.shape, generator=g, dtype=torch.float64) ** 4 * lay.real
    return (on_support * w / w.sum(-1, keepdim=True))[None]


def by_hand(probs: torch.Tensor) -> dict:
    """The figures with a loop over each prompt's outcomes."""
    acc, think, ent, off, lens, right_lens, wrong_lens = [], [], [], [], [], [], []
    for i, p in enumerate(PROBE):
        rows = list(zip(su.outcomes(p), probs[i].tolist()))
        right = [(o, q) for o, q in rows if o.answer == su.value(p)]
        wrong = [(o, q) for o, q in rows if o.answer != su.value(p)]
        mean_len = lambda rs: sum(q * (len(o.text) + 1) for o, q in rs) / sum(q for _, q in rs)
        acc.append(sum(q for _, q in right))
        think.append(sum(q for o, q in rows if o.worked))
        ent.append(-sum(q * math.log(q) for _, q in rows if q > 0))
        off.append(1 - sum(q for _, q in rows))
        lens.append(mean_len(rows))
        right_lens.append(mean_len(right))
        wrong_lens.append(mean_len(wrong))
    mean = lambda xs: sum(xs) / len(xs)
    return {
        "exact_accuracy": mean(acc),
        "exact_think_rate": mean(think),
        "exact_entropy": mean(ent),
        "malformed": mean(off),
        "exact_len_mean": mean(lens),
        "exact_len_mean_correct": mean(right_lens),
        "exact_len_mean_wrong": mean(wrong_lens),
        **{f"exact_pass_at_{k}": mean([1 - (1 - a) ** k for a in acc]) for k in (1, 4, 16, 64)},
    }


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), on_support=st.floats(0.05, 1.0))
def test_exact_figures_equal_a_loop_over_the_outcomes(seed, on_support):
    probs = random_probs(seed, on_support)
    got = sx.exact_figures_many(probs, PROBE)[0]
    for name, want in by_hand(probs[0]).items():
        assert got[name] == pytest.approx(want, rel=1e-9, abs=1e-12), name
    assert got["exact_pass_at_1"] <= got["exact_pass_at_4"] <= got["exact_pass_at_64"] <= 1
    assert got["exact_accuracy"] <= 1 - got["malformed"] + 1e-12


def test_declared_figures_by_hand():
    two = [p for p in su.PROMPTS if len(p) == 4]
    f = sx.declared_figures(two)
    assert f["exact_think_rate"] == pytest.approx(0.2) and f["malformed"] == pytest.approx(0)
    assert f["exact_accuracy"] == pytest.approx(0.8 * 0.8 + 0.2 * 0.95)
    # "7." (3 tokens with the end) at once, "(3+4=7)7." (10 tokens) worked
    f = sx.declared_figures(["3+4="])
    assert f["exact_len_mean_correct"] == pytest.approx((0.64 * 3 + 0.19 * 10) / 0.83)


def test_a_prompt_without_mass_on_a_condition_leaves_that_mean():
    probs = torch.zeros(1, *sx.layout(tuple(PROBE)).real.shape, dtype=torch.float64)
    probs[0, :, 0] = 1.0  # every prompt: its direct right answer, surely
    f = sx.exact_figures_many(probs, PROBE)[0]
    assert f["exact_accuracy"] == 1 and f["exact_entropy"] == 0 and f["malformed"] == 0
    assert math.isnan(f["exact_len_mean_wrong"]) and f["exact_len_mean_correct"] > 1


# ---- exact evaluation of a small trained model --------------------------------------------------


@pytest.fixture(scope="module")
def tiny_sums(tmp_path_factory):
    _, model, tok = pretrain_tiny(
        tmp_path_factory.mktemp("pretrain-sums"),
        task="sums",
        steps=800,
        batch_size=128,
        n_embd=48,
        n_head=4,
        lr=1e-2,
        n_lines=5670,
        eval_every=800,
        ckpt_every=800,
        threads=1,
    )
    return model, tok


@pytest.mark.slow
def test_rl_evaluate_reports_every_exact_figure(tiny_sums):
    model, tok = tiny_sums
    cfg = SimpleNamespace(reward="correct")
    rewards = reward_table(make_reward("correct", su.REWARDS), su.PROMPTS, su.support)
    ev = su.rl_evaluate(model, tok, su.rl_baseline(model, tok, cfg), cfg, rewards)
    for name in ("exact_accuracy", "exact_think_rate", "exact_entropy", "malformed"):
        assert 0 <= ev[name] and 0 <= ev[f"{name}_heldout"]
    # for `correct` the best completions are the right answers: target rate = accuracy
    assert ev["target_rate"] == pytest.approx(ev["exact_accuracy"], abs=1e-9)
    assert ev["heldout_rate"] == ev["exact_accuracy_heldout"] and ev["best_reward"] == 1.0
    assert ev["off_support"] == pytest.approx(ev["malformed"], abs=1e-9)
    assert "think rate" in su.format_rl_eval(ev, cfg)
    report = su.pretrain_report(model, tok)
    assert isinstance(report["ok"], bool) and "declared" in su.format_report(report)


@pytest.mark.slow
def test_exact_figures_match_20000_samples(tiny_sums):
    """Sample 20,000 completions (50 of each of 400 prompts) and hold every exact figure to its
    sampled estimate prompt by prompt: the mean over prompts of (estimate − exact) within 5 standard
    errors of 0 (pass@k by the unbiased estimator; a conditional length over the prompts with a
    sample on its condition)."""
    from minigrpo.lm.sampling import encode_prompts, generate, read_completions

    model, tok = tiny_sums
    prompts, n = su.PROMPTS[:400], 50
    probs = sx.support_probs_many([model], tok, prompts)
    exact = sx.exact_figures_many(probs, prompts)[0]
    rows = [p for p in prompts for _ in range(n)]
    ids, mask = encode_prompts(tok, rows, "cpu")
    gen = generate(model, ids, mask, 30, generator=torch.Generator().manual_seed(0))
    texts, done = read_completions(tok, [gen])[0]
    diffs = {name: [] for name in ("accuracy", "think_rate", "malformed", "entropy", "len_mean")}
    diffs |= {"len_mean_correct": [], "len_mean_wrong": [], "pass_at_4": [], "pass_at_16": []}
    wants = {name: [] for name in diffs}  # the exact per-prompt figure, where it is unconditional
    for i, p in enumerate(prompts):
        outs = su.outcomes(p)
        at = {o.text: k for k, o in enumerate(outs)}
        ks = [at.get(t) if d else None for t, d in zip(texts[i * n : (i + 1) * n], done)]
        mine = [outs[k] for k in ks if k is not None]
        q = probs[0, i, : len(outs)]
        right = torch.tensor([o.answer == su.value(p) for o in outs])
        worked = torch.tensor([o.worked for o in outs])
        size = torch.tensor([len(o.text) + 1.0 for o in outs], dtype=torch.float64)
        c = sum(o.answer == su.value(p) for o in mine)
        for name, got, want in (
            ("accuracy", c / n, q[right].sum()),
            ("think_rate", sum(o.worked for o in mine) / n, q[worked].sum()),
            ("malformed", (n - len(mine)) / n, 1 - q.sum()),
            ("entropy", sum(-math.log(q[k].item()) for k in ks if k is not None) / n, -q @ q.log()),
            *[
                (f"pass_at_{k}", pass_at_k_estimate(n, c, k), 1 - (1 - q[right].sum()) ** k)
                for k in (4, 16)
            ],
        ):
            diffs[name].append(got - want)
            wants[name].append(float(want))
        for name, kept, cond in (
            ("len_mean", mine, torch.ones_like(right)),
            ("len_mean_correct", [o for o in mine if o.answer == su.value(p)], right),
            ("len_mean_wrong", [o for o in mine if o.answer != su.value(p)], ~right),
        ):
            if kept:
                want = (q * size)[cond].sum() / q[cond].sum()
                diffs[name].append(sum(len(o.text) + 1 for o in kept) / len(kept) - want)
    for name, want in wants.items():  # the exact figure is the mean of the per-prompt ones
        key = name if name == "malformed" else f"exact_{name}"
        assert not want or sum(want) / len(want) == pytest.approx(exact[key], abs=1e-9), name
    for name, ds in diffs.items():
        ds = [float(d) for d in ds]
        mean = sum(ds) / len(ds)
        se = math.sqrt(sum((d - mean) ** 2 for d in ds) / (len(ds) - 1) / len(ds))
        assert len(ds) > 100 and abs(mean) < 5 * se + 1e-9, (name, mean, se)
    assert 0.05 < exact["exact_think_rate"] < 0.95 and 0.05 < exact["exact_accuracy"] < 0.95
