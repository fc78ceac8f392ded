"""python -m minigrpo.optimum on the tiny pretrained model: the frontier table and figure, --beta in
text and JSON (checked against minigrpo.exact.frontier on an independently built outcome space), the
malformed bucket's reward, and one-line refusals of bad input."""

import json
import math

import pytest
import torch
from conftest import one_line_error

from minigrpo.exact import frontier as F
from minigrpo.optimum import MALFORMED, main
from toy_tasks.food import FOODS, exact_distribution


def reference(model, tok, person="ravin"):
    """π_ref over the 12 foods + the malformed bucket, built here without the CLI's helpers."""
    dist = exact_distribution(model, tok, person)
    probs = [dist[f] for f in FOODS]
    p = torch.tensor([*probs, max(0.0, 1 - sum(probs))], dtype=torch.float64)
    return p / p.sum()


def run(argv, capsys):
    main(argv)
    return capsys.readouterr().out


def test_the_frontier_table_rises_from_the_reference_to_the_target_and_writes_the_figure(
    tiny_pretrained, tmp_path, capsys
):
    ckpt, model, tok = tiny_pretrained
    out = run(["--reward", "pizza", "--init", str(ckpt), "--out", str(tmp_path / "o")], capsys)
    assert "P(pizza)" in out and "constant off the support; exact" in out, out
    rows = [
        line.split()
        for line in out.splitlines()
        if line.strip().split(" ")[0] in ("∞", "→") or line.strip()[:1].isdigit()
    ]
    assert rows[0][0] == "∞" and rows[-1][:2] == ["→", "0"], (
        f"the table runs from β = ∞ to β → 0:\n{out}"
    )
    rewards = [float(r[-2]) for r in rows]
    assert rewards == sorted(rewards), f"E[r] must not fall as β falls:\n{out}"
    p_pizza = reference(model, tok)[FOODS.index("pizza")].item()
    assert float(rows[0][-1]) == pytest.approx(p_pizza, abs=1e-4), (
        "β = ∞ is π_ref: P(pizza) as pretrained"
    )
    assert float(rows[-1][-2]) == 1.0 and float(rows[-1][-3]) == pytest.approx(
        -math.log(p_pizza), abs=1e-4
    )
    png = tmp_path / "o" / "frontier.png"
    assert png.read_bytes()[:4] == b"\x89PNG", "frontier.png must be written into --out"


def test_beta_json_is_the_exact_optimum_of_the_reference_over_thirteen_outcomes(
    tiny_pretrained, tmp_path, capsys
):
    ckpt, model, tok = tiny_pretrained
    d = json.loads(
        run(["--reward", "pizza", "--init", str(ckpt), "--beta", "0.1", "--json"], capsys)
    )
    assert list(d["distribution"]) == [*FOODS, MALFORMED], f"outcomes: {list(d['distribution'])}"
    assert sum(d["distribution"].values()) == pytest.approx(1, abs=1e-12), "π*_β must sum to 1"
    p = reference(model, tok)
    r = torch.tensor([float(f == "pizza") for f in FOODS] + [0.0], dtype=torch.float64)
    want = F.optimum(p, r, 0.1)
    got = torch.tensor(list(d["distribution"].values()), dtype=torch.float64)
    assert torch.allclose(got, want, atol=1e-9), (
        f"--json distribution {got.tolist()} vs frontier.optimum {want}"
    )
    figures = F.optimum_figures(p, r, 0.1)
    for key in ("expected_reward", "kl", "log_z"):
        assert d[key] == pytest.approx(figures[key], abs=1e-9), f"{key}: {d[key]} vs {figures[key]}"
    assert d["beta"] == 0.1 and d["rewards"][MALFORMED] == 0 and d["malformed_exact"] is True


def test_frontier_json_holds_the_points_in_order_of_rising_kl(tiny_pretrained, tmp_path, capsys):
    ckpt, _, _ = tiny_pretrained
    d = json.loads(
        run(
            ["--reward", "graded", "--init", str(ckpt), "--out", str(tmp_path / "g"), "--json"],
            capsys,
        )
    )
    pts = d["points"]
    assert pts[0]["beta"] is None and pts[-1]["beta"] == 0, (
        "β = ∞ (null in JSON) first, the β → 0 limit last"
    )
    kls = [p["kl"] for p in pts]
    assert kls == sorted(kls) and pts[-1]["expected_reward"] == 1.0, (
        "KL rises along the points; the end is max r"
    )
    assert d["rewards"][MALFORMED] == -1 and d["target"] == "pizza", (
        "graded: malformed lines pay −1"
    )
    assert (tmp_path / "g" / "frontier.png").exists()


def test_a_reward_not_constant_off_the_support_is_reported_as_a_bound(tiny_pretrained, capsys):
    ckpt, _, _ = tiny_pretrained
    out = run(["--reward", "length", "--init", str(ckpt), "--beta", "1"], capsys)
    assert "NOT constant off the support" in out and "bound" in out, out


@pytest.mark.parametrize(
    "argv",
    [
        ["--person", "zed"],
        ["--reward", "nope"],
        ["--init", "/nonexistent/model.pt"],
        ["--beta", "0"],
        ["--beta", "-1"],
        ["--beta", "nan"],
        ["--beta", "inf"],
        ["--beta", "1e-320"],  # log Z_β = 1/β past float64: refused with its range
        ["--beta", "1e-320", "--json"],
        ["--task", "arithmetic"],
        ["--reward", "regex:("],
        ["--reward", "food:pizzza"],
        ["--reward", "food:"],
        ["--reward", "pizza=1,food:sushii=2"],
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tiny_pretrained, argv, capsys):
    ckpt, _, _ = tiny_pretrained
    one_line_error(main, ["--init", str(ckpt), *argv], capsys)


def test_a_beta_too_small_is_named_as_given_even_below_the_normal_floats(tiny_pretrained, capsys):
    """1e-320 is a subnormal float: '%g' printed it as 9.99989e-321, a β the user never gave."""
    ckpt, _, _ = tiny_pretrained
    err = one_line_error(main, ["--init", str(ckpt), "--beta", "1e-320"], capsys)
    assert "--beta 1e-320 is too small for float64" in err and "allowed: β ≥ 1e-308" in err, err


def test_a_reward_that_exits_is_one_line_and_exit_code_2_not_a_silent_0(
    tiny_pretrained, tmp_path, capsys
):
    ckpt, _, _ = tiny_pretrained
    quits = tmp_path / "quits.py"
    quits.write_text("import sys\ndef f(p, c):\n    sys.exit(0)\n")
    assert "sys.exit(0)" in one_line_error(
        main, ["--init", str(ckpt), "--reward", f"{quits}:f", "--out", str(tmp_path / "o")], capsys
    )


def test_a_reward_beyond_a_floats_range_is_one_line_and_a_huge_one_prints_in_a_few_digits(
    tiny_pretrained, tmp_path, capsys
):
    ckpt, _, _ = tiny_pretrained
    big = tmp_path / "big.py"
    big.write_text(
        "def f(p, c):\n    return 1e308 if c == 'pizza' else -1e308\n"
        "def g(p, c):\n    return 1e308 if c == 'pizza' else 0.0\n"
    )
    assert "rescale" in one_line_error(
        main, ["--init", str(ckpt), "--reward", f"{big}:f", "--out", str(tmp_path / "f")], capsys
    )
    out = run(["--init", str(ckpt), "--reward", f"{big}:g", "--out", str(tmp_path / "g")], capsys)
    # no 300-digit numbers
    assert "nan" not in out and "0000000000" not in out and "1e+308" in out, out
    huge = tmp_path / "huge.py"
    huge.write_text("def f(p, c):\n    return 1e200 if c == 'pizza' else 0.0\n")
    at = lambda beta: ["--init", str(ckpt), "--reward", f"{huge}:f", "--beta", beta, "--json"]
    assert "allowed: β ≥ 1e-108" in one_line_error(main, at("1e-200"), capsys)
    # at the edge of the range: every figure finite, J* = β·log Z_β = max r
    fig = json.loads(run(at("1e-107"), capsys))
    assert math.isfinite(fig["log_z"]) and fig["log_z"] * 1e-107 == pytest.approx(1e200)


def test_every_sequence_level_default_beta_puts_its_optimum_clear_of_the_goal():
    """PPO (k1 in the reward, summed over the completion), DPO and the j_beta/rloo/reinforce presets
    climb J_β at their default β: on the food world's declared distribution for ravin (pizza 0.15)
    π*_β must put >= 0.99 on pizza, so a run that reaches its optimum clears the 0.95 goal with
    margin (β 0.2 gave 0.963)."""
    from minigrpo.dpo import DPOConfig
    from minigrpo.grpo import PRESETS
    from minigrpo.ppo import PPOConfig
    from toy_tasks import food

    declared = food.PREFERENCES["ravin"]
    p = torch.tensor([declared.get(f, 0.0) for f in FOODS], dtype=torch.float64)
    r = torch.tensor([float(f == "pizza") for f in FOODS], dtype=torch.float64)
    betas = {
        "ppo": PPOConfig().beta,
        "dpo": DPOConfig().beta,
        **{name: PRESETS[name]["beta"] for name in ("j_beta", "rloo", "reinforce")},
    }
    for name, beta in betas.items():
        pizza = F.optimum(p / p.sum(), r, beta)[FOODS.index("pizza")].item()
        assert pizza >= 0.99, f"{name}: π*_{beta:g}(pizza) = {pizza:.4f} < 0.99"
