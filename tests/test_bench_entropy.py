"""The pure helpers of minigrpo/bench/entropy.py (the bench's `entropy` section), on tiny models and
hand-built numbers: the visit-weighted states of an enumerated tree, the top-ρ share, the fit, the
covariance split, and that the probed run is the CLI's run."""

import json
import math

import pytest
import torch

# a 1-layer GPT over BOS, EOS, PAD, a, b; prompts "a", "ba"
from test_preserve import PROMPTS, TOK, tiny_gpt

from minigrpo.bench.entropy import (
    State,
    covariance_split,
    fit,
    grpo_run,
    state_keys,
    top_share,
    visited_states,
)
from minigrpo.lm.tokenizer import EOS_ID
from minigrpo.objectives.entropy_control import token_covariance
from minigrpo.rl.preserve import build_anchor_tree


def test_visit_weights_flow_down_the_tree_and_entropies_are_exact():
    """Every completion enumerated (min_prob 1e-12): each prompt's root state is visited with weight
    1/prompts, and each child state s+c with weight w(s)·π(c|s); H is the entropy of the stored
    next-token distribution."""
    tree = build_anchor_tree(tiny_gpt(), TOK, PROMPTS, 10_000, 3, min_prob=1e-12)
    states = visited_states(tree)
    by_key = {(s.prompt, s.prefix): s for s in states}
    assert len(by_key) == len(states), "each state once"
    for g in range(len(PROMPTS)):
        assert math.isclose(by_key[(g, ())].weight, 1 / len(PROMPTS), rel_tol=1e-5)
    children = 0
    for s in states:
        p = s.probs.double()
        assert math.isclose(s.entropy, -(p * p.log()).sum().item(), rel_tol=1e-9, abs_tol=1e-12)
        for c in range(TOK.vocab_size):
            child = by_key.get((s.prompt, s.prefix + (c,)))
            if child is not None:
                assert c != EOS_ID
                assert math.isclose(child.weight, s.weight * p[c].item(), rel_tol=1e-4), (
                    s.prefix,
                    c,
                )
                children += 1
    assert children == len(states) - len(PROMPTS), "every non-root state is some state's child"


def test_top_share_takes_the_most_entropic_tokens_and_splits_the_boundary_state():
    v = torch.zeros(3)
    states = [State(0, (), 1.0, 3.0, v), State(0, (1,), 1.0, 1.0, v), State(0, (2,), 2.0, 2.0, v)]
    # 2 of 4 token visits: H 3 (all), H 2 (half of its 2)
    picked, threshold, share = top_share(states, 0.5)
    assert [(s.entropy, f) for s, f in picked] == [(3.0, 1.0), (2.0, 0.5)]
    assert threshold == 2.0 and math.isclose(share, (3 + 2) / (3 + 1 + 4))
    picked, _, share = top_share(states, 0.1)
    assert [(s.entropy, f) for s, f in picked] == [(3.0, 0.4)] and math.isclose(share, 0.4 * 3 / 8)
    assert math.isclose(top_share(states, 1.0)[2], 1.0)


def test_fit_recovers_a_line_and_counts_opposite_signs():
    x = [1.0, 2.0, 3.0, -1.0]
    f = fit(x, [-2 * a + 0.1 for a in x])
    assert math.isclose(f["r"], -1.0) and math.isclose(f["slope"], -2.0) and f["sign"] == 1.0
    f = fit([1.0, 2.0, 0.0, 3.0], [1.0, -1.0, 5.0, -2.0])  # x = 0 is not counted; 2 of 3 opposite
    assert math.isclose(f["sign"], 2 / 3) and f["r"] < 0


def test_covariance_split_is_the_law_of_total_covariance():
    g = torch.Generator().manual_seed(0)
    logp, adv = (
        -torch.rand(4, 5, generator=g, dtype=torch.float64),
        torch.randn(4, generator=g, dtype=torch.float64),
    )
    mask = torch.tensor(
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool
    )
    batch = token_covariance(logp, adv, mask)[mask].mean().item()
    distinct = [[(i, t) for t in range(5)] for i in range(4)]
    assert covariance_split(distinct, logp, adv, mask) == (batch, 0.0), (
        "a state sampled once adds nothing"
    )
    one = [[0] * 5 for _ in range(4)]
    assert math.isclose(covariance_split(one, logp, adv, mask)[1], batch, rel_tol=1e-12)
    keys = [[t % 2 for t in range(5)] for _ in range(4)]  # two states: even and odd positions
    total, within = covariance_split(keys, logp, adv, mask)
    tokens = [(t % 2, adv[i].item(), logp[i, t].item()) for i, t in mask.nonzero().tolist()]
    mean = lambda xs: sum(xs) / len(xs)
    ma, ml = mean([a for _, a, _ in tokens]), mean([lp for _, _, lp in tokens])
    between = 0.0
    for k in (0, 1):
        at = [(a, lp) for s, a, lp in tokens if s == k]
        between += len(at) * (mean([a for a, _ in at]) - ma) * (mean([lp for _, lp in at]) - ml)
    assert math.isclose(total, within + between / len(tokens), rel_tol=1e-9)


def test_state_keys_share_a_key_exactly_when_prompt_and_prefix_agree():
    from minigrpo.lm.sampling import Generation

    # prompts "aa", "aa", "ba"
    ids = torch.tensor([[0, 3, 3, 4, 1], [0, 3, 3, 4, 3], [0, 4, 3, 4, 1]])
    gen = Generation(
        ids,
        torch.ones(3, 5, dtype=torch.bool),
        3,
        torch.ones(3, 2, dtype=torch.bool),
        torch.zeros(3, 2),
        torch.ones(3, dtype=torch.bool),
    )
    k = state_keys(gen)
    assert k[0][0] == k[1][0] and k[0][1] == k[1][1] and k[0][0] != k[2][0]
    ids[1, 3] = 3
    assert state_keys(gen)[0][1] != state_keys(gen)[1][1]


@pytest.mark.slow
def test_the_probed_run_is_the_cli_run(tiny_pretrained, tmp_path):
    """EntropyProbe's extra forwards change nothing: the same metrics as an unprobed run, one row
    per step."""
    from minigrpo.grpo import PRESETS, GRPOConfig, train
    from minigrpo.rl.config import parse_rl_config

    ckpt, _, _ = tiny_pretrained
    args = [
        "--reward",
        "pizza",
        "--steps",
        "3",
        "--goal",
        "0",
        "--plateau",
        "0",
        "--group-size",
        "4",
    ]
    probe, _ = grpo_run(ckpt, tmp_path / "probed", 0, args)
    plain = parse_rl_config(
        GRPOConfig,
        [*args, "--init", str(ckpt), "--out", str(tmp_path / "plain"), "--quiet", "--no-plot"],
        "",
        "grpo",
        PRESETS,
    )
    train(plain)
    rows = [
        [json.loads(line) for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
        for d in ("probed", "plain")
    ]
    strip = lambda rs: [
        {k: v for k, v in r.items() if k not in ("step_time", "tokens_per_s")} for r in rs
    ]  # noqa
    assert strip(rows[0]) == strip(rows[1])
    assert len(probe.steps) == 3 and all(
        math.isfinite(s["dh"]) and math.isfinite(s["cov"]) for s in probe.steps
    )
