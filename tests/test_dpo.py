"""minigrpo/dpo.py: DPO's wiring into the shared run (one update raises the chosen log-ratio against
the rejected), offline pairs fixed and from π_ref only, online pairs from the rollout, exact resume,
the CLI."""

import pytest
import torch
from conftest import one_line_error

from minigrpo.dpo import DPO, DPOConfig, main, train
from minigrpo.lm.checkpoint import read_checkpoint
from minigrpo.lm.logprobs import generation_logprobs, sequence_logp
from minigrpo.lm.optim import AdamW
from minigrpo.lm.sampling import Generation, encode_prompts, generate
from minigrpo.rl.rollout import collect
from minigrpo.rl.run_state import Run, purpose_seed
from minigrpo.util.jsonl import read_jsonl

TIME_KEYS = {"step_time", "tokens_per_s"}
TINY = dict(
    prompts_per_step=2,
    group_size=4,
    max_new_tokens=12,
    quiet=True,
    preserve_per_prompt=2,
    preserve_batch=8,
    offline_samples=16,
    pairs_per_step=8,
    goal=0.0,
)


def setup(tmp_path, init, name="r", **kw):
    """A real Run (preservation and trust region off, no warm-up, no clip), its DPO and an
    optimiser."""
    cfg = DPOConfig(
        **{
            **TINY,
            "init": str(init),
            "out": str(tmp_path / name),
            "preserve": False,
            "trust_region": 0.0,
            "warmup": 0,
            "grad_clip": 0.0,
            "reward": "length",
            **kw,
        }
    )
    run = Run(cfg, "dpo")
    algo = DPO(run)
    return run, algo, AdamW(algo.parameters(), lr=1e-3)


def rollout(run, seed=0):
    return collect(
        run.policy,
        run.ref,
        run.tok,
        ["ravin likes "] * 2,
        4,
        run.reward,
        torch.Generator().manual_seed(seed),
        12,
        keep_ref_logits=True,
        old_logp=False,
    )


def seq_logp(model, gen):
    with torch.no_grad():
        return sequence_logp(generation_logprobs(model, gen), gen.completion_mask)


def test_one_update_raises_the_chosen_log_ratio_against_the_rejected(tmp_path, tiny_pretrained):
    init, _, _ = tiny_pretrained
    # every pair of the fixed set in the update
    run, algo, opt = setup(tmp_path, init, pairs_per_step=10_000)
    s = algo.pair_set
    gen = Generation.from_dict(s)
    margin = lambda: (
        (
            (seq_logp(run.policy, gen) - s["ref_seq_logp"])[s["chosen"]]
            - (seq_logp(run.policy, gen) - s["ref_seq_logp"])[s["rejected"]]
        )
        .mean()
        .item()
    )
    assert abs(margin()) < 1e-4, "π_θ = π_ref at the start: every log-ratio is 0"
    stats = algo.update(rollout(run), opt)
    assert margin() > 0 and stats["pairs"] == len(s["chosen"]) > 0, stats
    assert abs(stats["policy_loss"] - 0.6931) < 1e-3, "the first update's loss is log 2 (margins 0)"


def test_offline_pairs_are_sampled_once_from_pi_ref_and_stay_fixed(
    tmp_path, tiny_pretrained, monkeypatch
):
    init, _, _ = tiny_pretrained
    run, algo, opt = setup(tmp_path, init)
    s = algo.pair_set
    # π_ref's own samples, from their own stream
    ids, km = encode_prompts(run.tok, ["ravin likes "] * 16, "cpu")
    want = generate(
        run.ref, ids, km, 12, generator=torch.Generator().manual_seed(purpose_seed(0, "dpo_pairs"))
    )
    assert torch.equal(s["ids"], want.ids) and torch.allclose(
        s["ref_seq_logp"], seq_logp(run.ref, want)
    )
    assert (s["rewards"][s["chosen"]] > s["rewards"][s["rejected"]]).all(), (
        "y_w must have the higher reward"
    )
    seen = []
    monkeypatch.setattr(DPO, "step", lambda self, opt, pair, kl: seen.append(pair[2:4]) or {})
    frozen = {k: v.clone() for k, v in s.items() if torch.is_tensor(v)}
    for seed in range(3):  # different rollouts: the pairs still come from the fixed set only
        algo.update(rollout(run, seed), opt)
    assert all(torch.equal(algo.pair_set[k], v) for k, v in frozen.items()), (
        "the pair set must never change"
    )
    for rc, rr in seen:
        assert set(rc.tolist()) <= set(s["ref_seq_logp"][s["chosen"]].tolist()) and len(rc) == 8
        assert set(rr.tolist()) <= set(s["ref_seq_logp"][s["rejected"]].tolist())


def test_online_pairs_come_from_the_rollout_ranked_by_its_rewards(
    tmp_path, tiny_pretrained, monkeypatch
):
    init, _, _ = tiny_pretrained
    run, algo, opt = setup(tmp_path, init, online=True, pairs_per_step=100)
    assert algo.pair_set is None, "online DPO samples no fixed set"
    batch = rollout(run)
    # group 1 has no contrast
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    seen = []
    monkeypatch.setattr(
        DPO, "step", lambda self, opt, pair, kl: seen.append(pair and pair[:4]) or {}
    )
    algo.update(batch, opt)
    ref = sequence_logp(batch.ref_logp, batch.mask)
    pol = seq_logp(run.policy, batch.gen)
    ((pc, pr, rc, rr),) = seen
    got = sorted(zip(rc.tolist(), rr.tolist()))
    assert got == sorted(
        (ref[w].item(), ref[l].item()) for w, l in [(0, 1), (0, 2), (3, 1), (3, 2)]
    ), got
    assert torch.allclose(
        torch.sort(pc.detach()).values, torch.sort(pol[[0, 0, 3, 3]]).values, atol=1e-5
    )
    # no pair at all: the step skips DPO (preservation, the KL term still act)
    batch.rewards = torch.ones(8)
    assert algo.update(batch, opt)["skipped"] == 1.0 and seen[1:] == [None]


# online and offline (over a fixed pair set): whole runs, slow (GRPO's and PPO's resume tests
# stay in the default suite)
@pytest.mark.slow
@pytest.mark.parametrize("online", [False, True])
def test_resume_reproduces_the_uninterrupted_metrics_and_weights(tmp_path, tiny_pretrained, online):
    init, _, _ = tiny_pretrained
    base = dict(TINY, init=str(init), online=online, eval_every=1, ckpt_every=2, updates=2)
    base["offline_samples"] = 32  # 16 of ravin's lines (P(pizza) 0.15) may hold no pizza at all
    train(DPOConfig(**base, steps=3, out=str(tmp_path / "straight")), log=lambda *a: None)
    # the interrupted run without metrics.png (drawing it is most of a short run's time): the
    # uninterrupted one draws it
    train(DPOConfig(**base, steps=1, out=str(tmp_path / "split"), plot=False), log=lambda *a: None)
    main(["--resume", str(tmp_path / "split"), "--steps", "3", "--quiet"])
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]
    a, b = (
        read_jsonl(tmp_path / "straight" / "metrics.jsonl"),
        read_jsonl(tmp_path / "split" / "metrics.jsonl"),
    )
    assert [r["step"] for r in b] == [0, 1, 2, 3] and strip(a) == strip(b)
    sa, sb = (
        read_checkpoint(tmp_path / "straight" / "model.pt"),
        read_checkpoint(tmp_path / "split" / "model.pt"),
    )
    assert all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])
    assert torch.equal(
        sa["extra"]["rl"]["algo_state"]["draws"], sb["extra"]["rl"]["algo_state"]["draws"]
    )


def test_help_lists_dpos_flags(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and all(
        f in out
        for f in (
            "--beta",
            "--online",
            "--pairs",
            "--offline-samples",
            "--pairs-per-step",
            "--updates",
        )
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--beta", "-1"], "--beta must be"),
        (["--beta", "0"], "--beta must be"),
        (["--pairs", "top"], "invalid choice: 'top'"),
        (["--offline-samples", "1"], "--offline-samples must be >= 2"),
        (["--pairs-per-step", "0"], "--pairs-per-step must be >= 1"),
        (["--updates", "0"], "--updates must be >= 1"),
    ],
)
def test_bad_flags_exit_2_with_one_line(argv, message, capsys, tmp_path):
    assert message in one_line_error(main, [*argv, "--out", str(tmp_path / "x")], capsys)


def test_a_target_absent_from_the_offline_samples_is_one_line(tmp_path, tiny_pretrained, capsys):
    init, _, _ = tiny_pretrained
    err = one_line_error(
        main,
        [
            "--init",
            str(init),
            "--reward",
            "exact:zzz",
            "--offline-samples",
            "4",
            "--out",
            str(tmp_path / "x"),
            "--quiet",
        ],
        capsys,
    )
    assert "no two with different rewards" in err


def test_bradley_terry_labels_stop_pushing_at_the_optimums_margin(tmp_path, tiny_pretrained):
    """--labels bt: label p = σ(r_w − r_l), loss p·L(w, l) + (1 − p)·L(l, w); its gradient in the
    margin vanishes at β·m = r_w − r_l, π*_β's own margin (log π*/π_ref = r/β − log Z); hard labels
    push on past it."""
    init, _, _ = tiny_pretrained
    grads = {}
    for labels in ("bt", "hard"):
        run, algo, opt = setup(tmp_path, init, name=labels, labels=labels, beta=0.5)
        # m = (pc − rc) − (pr − rr) = Δr/β = 2
        pc = torch.tensor([-1.0 + 1.0 / 0.5], requires_grad=True)
        pair = (
            pc,
            torch.tensor([-3.0]),
            torch.tensor([-1.0]),
            torch.tensor([-3.0]),
            torch.tensor([5]),
            torch.sigmoid(torch.tensor([1.0])) if labels == "bt" else None,
        )
        algo.step(opt, pair, None)
        grads[labels] = pc.grad.item()
    assert abs(grads["bt"]) < 1e-7 and grads["hard"] < -0.1, grads
