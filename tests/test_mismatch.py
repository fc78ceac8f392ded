"""The sampler-trainer mismatch lab wired into GRPO: rollouts from π_sampler (--sample-temperature,
--sample-top-p, --sample-stale; rollout.Sampler) and the TIS / MIS weights on the per-token policy
loss (--is-correction, --is-level, --is-cap, --is-band; is_correction.correction). The weights' own
math: test_is_correction.py."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import one_line_error
from test_grpo import TIME_KEYS, cfg_for, fake_run, loss_inputs

from minigrpo.grpo import GRPO, GRPOConfig, grpo_loss, main, train
from minigrpo.lm.checkpoint import read_checkpoint
from minigrpo.lm.draws import process_logits
from minigrpo.lm.logprobs import generation_logprobs, shifted_forward
from minigrpo.objectives.importance import correction
from minigrpo.ppo import main as ppo_main
from minigrpo.rl.rollout import Sampler, collect
from minigrpo.util.jsonl import read_jsonl
from toy_tasks import food
from toy_tasks.rewards import make_reward

QUIET = dict(log=lambda *a: None)


@pytest.fixture
def model(tiny_pretrained):
    return copy.deepcopy(tiny_pretrained[1])


@pytest.fixture
def batch_of(tiny_pretrained):
    """A rollout of the given prompts (G each) from `model`, or from `sampler`'s distribution."""

    def make(model, sampler=None, prompts=("ravin likes ", "bob likes "), group=4):
        return collect(
            model,
            copy.deepcopy(model),
            tiny_pretrained[2],
            list(prompts),
            group,
            make_reward("pizza", food.REWARDS),
            torch.Generator().manual_seed(0),
            max_new_tokens=12,
            keep_ref_logits=True,
            old_logp=False,
            sampler=sampler,
        )

    return make


def update_with(model, batch, lr=0.1, **kw):
    """One GRPO.update of a copy of `model` on a copy of `batch` -> (its stats, the updated
    weights)."""
    m = copy.deepcopy(model)
    cfg = GRPOConfig(group_size=4, max_new_tokens=12, **kw)
    stats = GRPO(fake_run(cfg, m)).update(
        copy.deepcopy(batch), torch.optim.SGD(m.parameters(), lr=lr)
    )
    return stats, m.state_dict()


# ---- sampler = trainer: weights exactly 1, the uncorrected loss ----------------------------------


@pytest.mark.parametrize(
    "kind, level", [("tis", "token"), ("tis", "sequence"), ("mis", "token"), ("mis", "sequence")]
)
def test_a_sampler_equal_to_the_trainer_gives_weights_of_exactly_one_and_the_uncorrected_update(
    model, batch_of, kind, level
):
    batch = batch_of(model)
    # log π_sampler IS log π_old, bit for bit
    batch.gen.logprobs = generation_logprobs(model, batch.gen).detach()
    w, stats = correction(
        kind, generation_logprobs(model, batch.gen).detach(), batch.sampler_logp, batch.mask, level
    )
    assert (
        torch.equal(w[batch.mask], torch.ones(int(batch.mask.sum()))) and stats["sampler_kl"] == 0.0
    )
    plain, plain_w = update_with(model, batch)
    fixed, fixed_w = update_with(model, batch, is_correction=kind, is_level=level)
    assert fixed["is_weight_mean"] == 1.0 and fixed.get("is_capped", fixed.get("is_masked")) == 0.0
    assert fixed["loss"] == plain["loss"] and fixed["policy_loss"] == plain["policy_loss"]
    assert all(torch.equal(plain_w[k], fixed_w[k]) for k in plain_w), "the same step, bit for bit"


def test_without_a_sampler_flag_grpo_samples_from_pi_old_and_logs_nothing_new(model, batch_of):
    cfg = GRPOConfig(group_size=4, max_new_tokens=12)
    assert GRPO(fake_run(cfg, copy.deepcopy(model))).sampler is None
    stats, _ = update_with(model, batch_of(model))
    assert not {"sampler_kl", "is_weight_mean", "is_capped", "is_masked"} & set(stats)
    # corrects only the KV cache's rounding
    engine, _ = update_with(model, batch_of(model), is_correction="tis")
    assert abs(engine["is_weight_mean"] - 1) < 1e-5 and abs(engine["sampler_kl"]) < 1e-5


# ---- what the sampler samples from ---------------------------------------------------------------


def test_the_samplers_logprobs_are_those_of_the_tempered_nucleus(model, batch_of):
    batch = batch_of(
        model, Sampler(temperature=1.7, top_p=0.8), prompts=("ravin likes ", "jo likes "), group=16
    )
    gen, P = batch.gen, batch.gen.prompt_len
    logits, _ = shifted_forward(model, gen.ids, gen.key_mask)  # (N, P+T−1, V) at temperature 1
    logits = logits[:, P - 1 :]
    q = F.log_softmax(
        process_logits(logits.reshape(-1, logits.size(-1)), 1.7, None, 0.8), -1
    ).view_as(logits)
    want = q.gather(-1, gen.completion_ids[..., None]).squeeze(-1)
    m = batch.mask
    assert torch.isfinite(want[m]).all(), "every sampled token is inside its nucleus"
    assert torch.allclose(batch.sampler_logp[m], want[m], atol=1e-5), (
        "log π_sampler: tempered, then truncated"
    )
    old = generation_logprobs(model, gen)
    assert (batch.sampler_logp[m] - old[m]).abs().max() > 0.05, (
        "and not π_old's (temperature 1, untruncated)"
    )


def test_sample_stale_samples_from_the_policy_n_steps_back(tmp_path, tiny_pretrained, monkeypatch):
    import minigrpo.rl.rollout as rollout

    init, _, _ = tiny_pretrained
    seen, original = [], rollout.generate_all
    monkeypatch.setattr(
        rollout,
        "generate_all",
        lambda w, *a, **kw: seen.append(copy.deepcopy(w.w)) or original(w, *a, **kw),
    )
    flags = dict(sample_stale=2, lr=1e-2, preserve=False)
    train(cfg_for(tmp_path, init, **flags, steps=1, out=str(tmp_path / "one")), **QUIET)
    theta1 = read_checkpoint(tmp_path / "one" / "model.pt")["model"]
    theta0 = read_checkpoint(init)["model"]
    seen.clear()
    train(cfg_for(tmp_path, init, **flags, steps=4, out=str(tmp_path / "four")), **QUIET)
    same = lambda a, b: all(torch.equal(a[k], b[k]) for k in b)
    assert len(seen) == 4
    assert all(same(s, theta0) for s in seen[:3]), (
        "steps 1-3 have no policy 2 steps back: the initial one"
    )
    assert same(seen[3], theta1) and not same(seen[3], theta0), (
        "step 4 samples from θ_1, the policy 2 steps back"
    )


# ---- TIS caps, MIS masks, through grpo_loss ------------------------------------------------------


def shifted_sampler(old, *cells):
    """log π_sampler = log π_old − log w at the given ((i, t), log w) cells, 0 elsewhere."""
    s = old.clone()
    for (i, t), v in cells:
        s[i, t] = old[i, t] - v
    return s


@pytest.mark.parametrize("kind", ["tis", "mis"])
def test_tis_caps_and_mis_masks_the_per_token_policy_gradient_but_not_the_kl(kind):
    # 3 rows of 3, 1, 4 valid tokens; ρ = 1
    logp, old, ref_logp, logits, ref_logits, adv, mask = loss_inputs()
    # w = e², e^0.3, e^−1
    sampler = shifted_sampler(old, ((0, 0), 2.0), ((0, 1), 0.3), ((2, 2), -1.0))
    w, stats = correction(kind, old, sampler, mask, "token", cap=2.0, band=(0.5, 2.0))
    cfg = GRPOConfig(beta=0.3, loss_agg="token-mean", max_new_tokens=4)
    logp.retain_grad()
    loss, policy_loss, _, _ = grpo_loss(
        logp, old, ref_logp, logits, ref_logits, adv, mask, cfg, is_weights=w
    )
    (policy_loss).backward(retain_graph=True)
    g = logp.grad.clone()
    want = {"tis": (2.0, math.exp(0.3), math.exp(-1.0)), "mis": (0.0, math.exp(0.3), 0.0)}[kind]
    for (i, t), weight in zip(((0, 0), (0, 1), (2, 2)), want):
        assert g[i, t].item() == pytest.approx(-weight * adv[i].item() / 8), (i, t)
    assert g[2, 0].item() == pytest.approx(-adv[2].item() / 8), "an agreeing token keeps weight 1"
    share = stats["is_capped" if kind == "tis" else "is_masked"]
    assert share == pytest.approx((1 if kind == "tis" else 2) / 8)
    plain = grpo_loss(logp, old, ref_logp, logits, ref_logits, adv, mask, cfg)
    assert (loss - policy_loss).item() == pytest.approx((plain[0] - plain[1]).item()), (
        "the KL term is not weighted"
    )


def test_sequence_level_puts_the_capped_or_masked_product_on_every_token_of_the_row():
    logp, old, ref_logp, logits, ref_logits, adv, mask = loss_inputs()
    # row 0: Π = e^0.9 > 2; row 2: e^0.2
    sampler = shifted_sampler(old, ((0, 0), 0.5), ((0, 2), 0.4), ((2, 1), 0.2))
    tis, _ = correction("tis", old, sampler, mask, "sequence", cap=2.0)
    mis, _ = correction("mis", old, sampler, mask, "sequence", band=(0.5, 2.0))
    assert (
        torch.allclose(tis[0, :3], torch.full((3,), 2.0, dtype=tis.dtype))
        and (mis[0, :3] == 0).all()
    )
    for w in (tis, mis):
        assert torch.allclose(w[2], torch.full((4,), math.exp(0.2), dtype=w.dtype)) and w[1, 0] == 1


def test_the_update_logs_the_mean_weight_the_capped_share_and_the_samplers_kl(model, batch_of):
    batch = batch_of(model)
    old = generation_logprobs(model, batch.gen).detach()
    cell = batch.mask.nonzero()[0].tolist()
    batch.gen.logprobs = shifted_sampler(old, (tuple(cell), 1.0))  # one token with w = e > 2
    stats, _ = update_with(model, batch, is_correction="tis")
    n = int(batch.mask.sum())
    assert stats["is_capped"] == pytest.approx(1 / n)
    assert stats["is_weight_mean"] == pytest.approx((n - 1 + 2) / n, abs=1e-6)
    assert stats["sampler_kl"] == pytest.approx(-1 / n, abs=1e-6)


# ---- resume, refusals ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags",
    [
        {"sample_stale": 2, "is_correction": "tis"},
        {
            "sample_temperature": 1.4,
            "sample_top_p": 0.9,
            "is_correction": "mis",
            "is_level": "sequence",
        },
    ],
    ids=["stale", "temperature_top_p"],
)
def test_resume_with_a_mismatched_sampler_is_exact(tmp_path, tiny_pretrained, flags):
    init, _, _ = tiny_pretrained
    flags = {**flags, "lr": 1e-2}
    train(cfg_for(tmp_path, init, **flags, steps=4, out=str(tmp_path / "straight")), **QUIET)
    train(cfg_for(tmp_path, init, **flags, steps=2, out=str(tmp_path / "split")), **QUIET)
    main(["--resume", str(tmp_path / "split"), "--steps", "4", "--quiet"])
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]
    a, b = (strip(read_jsonl(tmp_path / f / "metrics.jsonl")) for f in ("straight", "split"))
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4] and a == b


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sample-temperature", "0"], "--sample-temperature must be"),
        (["--sample-top-p", "1.5"], "--sample-top-p must be"),
        (["--sample-stale", "-1"], "--sample-stale must be >= 0"),
        (["--is-correction", "pis"], "--is-correction"),
        (["--is-level", "sequence"], "--is-level belongs to --is-correction tis or mis"),
        (["--is-correction", "mis", "--is-cap", "3"], "--is-cap belongs to --is-correction tis"),
        (
            ["--is-correction", "tis", "--is-band", "0.5,2"],
            "--is-band belongs to --is-correction mis",
        ),
        (["--is-correction", "tis", "--is-cap", "0.5"], "--is-cap must be"),
        (["--is-correction", "mis", "--is-band", "2,0.5"], "--is-band needs 0 <= LOW <= 1 <= HIGH"),
        (["--is-correction", "mis", "--is-band", "half"], "--is-band must be LOW,HIGH"),
    ],
)
def test_bad_mismatch_flags_are_refused_with_one_line(tmp_path, capsys, argv, message):
    err = one_line_error(main, ["--out", str(tmp_path / "bad"), "--quiet", *argv], capsys)
    assert message in err, err


def test_ppo_refuses_the_sampler_flags(tmp_path, capsys):
    err = one_line_error(
        ppo_main, ["--out", str(tmp_path / "bad"), "--quiet", "--sample-stale", "2"], capsys
    )
    assert "--sample-stale" in err, err
