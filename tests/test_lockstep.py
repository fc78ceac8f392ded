"""minigrpo/population/lockstep.py: a lockstep population's members against the same runs made one
by one (their oracle), a failing member against the others, and the configurations it refuses."""

from dataclasses import replace

import pytest
import torch
from test_population import UNTIMED, _run, breaking_reward, close

from minigrpo import dpo, grpo, ppo
from minigrpo.compare import run_one
from minigrpo.population.checkpoint import HostCopies
from minigrpo.population.lockstep import Member, train_lockstep, unsupported
from minigrpo.util.jsonl import read_jsonl
from minigrpo.variants.presets import PRESETS


def _cfg(init, folder, seed, extra=(), trainer=grpo):
    return trainer.parse(_run(init, folder, seed, trainer.__name__, extra)[2][3:])


LOCKSTEP_RUNS = {
    "grpo": (grpo, ()),
    "random-reward": (grpo, ("--preset", "random_reward")),
    "remax": (grpo, ("--preset", "remax")),
    "reinforce-rej": (grpo, ("--preset", "reinforce_rej")),
    "clip-cov": (grpo, ("--preset", "clip_cov", "--cov-ratio", "0.05")),
    "entropy-8020": (grpo, ("--preset", "entropy_8020")),
    "entropy-target": (
        grpo,
        ("--entropy-target", "0.5", "--entropy-step", "0.01", "--fork-entropy", "0.1"),
    ),
    "sampler": (
        grpo,
        ("--sample-temperature", "0.8", "--sample-top-p", "0.9", "--is-correction", "tis"),
    ),
    "stale-sampler": (grpo, ("--sample-stale", "1")),
    "tight-trust-region": (grpo, ("--trust-region-anchor", "3e-6", "--trust-region", "0.02")),
    "ppo": (ppo, ()),
    "ppo-oracle": (ppo, ("--critic", "oracle")),
    "ppo-head": (ppo, ("--critic", "head")),
    "ppo-kl-target": (ppo, ("--kl-target", "0.01")),
}
# every other preset compare can put in a population, three members of its own recipe (a preset met
# only as one member of a mixed population could mix its members' rows: REINFORCE's batch std,
# GPG's scale); DAPO's: test_dapos_members_skip_their_equal_groups_as_their_single_runs_do
TESTED = {
    "dapo",
    *(x[x.index("--preset") + 1] for _, x in LOCKSTEP_RUNS.values() if "--preset" in x),
}
LOCKSTEP_RUNS.update({p: (grpo, ("--preset", p)) for p in sorted(PRESETS) if p not in TESTED})


@pytest.mark.parametrize("trainer, extra", LOCKSTEP_RUNS.values(), ids=LOCKSTEP_RUNS.keys())
@pytest.mark.slow
def test_a_lockstep_populations_members_are_their_single_runs(
    tmp_path, tiny_pretrained, trainer, extra
):
    """Seeds 0, 1, 2 in lockstep (the default recipe: preservation, trust region; GRPO's μ = 2; its
    random rewards and ReMax's greedy baseline, each member's own; REINFORCE-Rej's groups dropped
    under a mean over sequences; the entropy controls, member by member, Clip-Cov drawing from each
    member's generator; another sampler (a stale one too) and its correction; a trust region that
    halves and rejects steps (the anchor probe's logits carried from one step to the next);
    PPO's 2 epochs × 2 minibatches with each of its critics, and an adaptive β): each member writes
    its single run's files, matches its metrics over the first two steps (test_population.close:
    relative, each figure to its own size), and resumes as a single run."""
    init, _, _ = tiny_pretrained
    cfgs = [_cfg(init, tmp_path / f"lock-s{s}", s, extra, trainer) for s in range(3)]
    assert unsupported(trainer, cfgs) is None
    results = train_lockstep(trainer, cfgs, [print] * 3)
    assert [r["step"] for r in results] == [3, 3, 3]
    for s in range(3):
        pop, alone = tmp_path / f"lock-s{s}", tmp_path / f"alone-s{s}"
        assert run_one(_run(init, alone, s, trainer.__name__, extra)) is None
        assert {"config.json", "metrics.jsonl", "summary.json", "samples.txt", "model.pt"} <= {
            f.name for f in pop.iterdir()
        }
        rows, want = read_jsonl(pop / "metrics.jsonl"), read_jsonl(alone / "metrics.jsonl")
        assert len(rows) == len(want) == 4
        assert set(rows[1]) == set(want[1])
        for got, ref in zip(rows[:3], want[:3]):  # steps 0, 1, 2
            assert close(UNTIMED(got), UNTIMED(ref)) == [], (s, got["step"])
        # its own weights and optimiser state, no other's
        state = torch.load(pop / "model.pt", weights_only=True)
        alone_state = torch.load(alone / "model.pt", weights_only=True)
        # its weights, π_ref's: as laid out
        for part in (lambda x: x["model"], lambda x: x["extra"]["rl"]["ref"]):
            assert all(
                v.shape == part(alone_state)[k].shape
                and v.stride() == part(alone_state)[k].stride()
                and torch.allclose(v, part(alone_state)[k], atol=1e-3)
                for k, v in part(state).items()
            )
        assert [m.shape for m in state["optimizer"]["m"]] == [
            m.shape for m in alone_state["optimizer"]["m"]
        ]
        mine, its = state["extra"]["rl"]["algo_state"], alone_state["extra"]["rl"]["algo_state"]
        assert mine.keys() == its.keys()
        # a critic's weights before training
        start = {
            "value_head": {"linear.weight": 0.0, "linear.bias": 0.0},
            "critic_trunk": torch.load(init, weights_only=True)["model"],
        }
        # a learned critic's weights are its single run's too, trained
        for part in ("value_head", "critic_trunk"):
            if its.get(part) is not None:
                assert all(
                    torch.allclose(w, its[part][k], atol=1e-3) for k, w in mine[part].items()
                ), part
                assert any(
                    not torch.equal(w, w * 0 + start[part][k]) for k, w in mine[part].items()
                ), part
    trainer.train(
        trainer.parse(
            ["--resume", str(tmp_path / "lock-s1"), "--steps", "4", "--quiet", "--no-plot"]
        )
    )
    # as its own
    assert [r["step"] for r in read_jsonl(tmp_path / "lock-s1" / "metrics.jsonl")] == [
        0,
        1,
        2,
        3,
        4,
    ]


@pytest.mark.parametrize("noise_drawn", ["noise-ahead"], indirect=True)
@pytest.mark.parametrize("trainer", [grpo, ppo], ids=["grpo", "ppo"])
@pytest.mark.slow
def test_with_the_noise_drawn_ahead_as_on_a_gpu_members_are_their_single_runs(
    tmp_path, tiny_pretrained, trainer, noise_drawn
):
    """lm/sampling.NOISE_AHEAD (a GPU's way, here on the CPU): each member draws its call's noise at
    its first token as its single run does, so its samples and metrics over the first steps are its
    single run's (to 1e-4 relative)."""
    init, _, _ = tiny_pretrained
    results = train_lockstep(
        trainer,
        [_cfg(init, tmp_path / f"lock-s{s}", s, (), trainer) for s in range(3)],
        [print] * 3,
    )
    assert [r["step"] for r in results] == [3, 3, 3]
    for s in range(3):
        assert run_one(_run(init, tmp_path / f"alone-s{s}", s, trainer.__name__)) is None
        rows, want = (
            read_jsonl(tmp_path / f"{kind}-s{s}" / "metrics.jsonl") for kind in ("lock", "alone")
        )
        assert len(rows) == len(want) == 4 and all(
            close(UNTIMED(a), UNTIMED(b)) == [] for a, b in zip(rows, want)
        )
        samples = [
            (tmp_path / f"{kind}-s{s}" / "samples.txt").read_text() for kind in ("lock", "alone")
        ]
        assert samples[0] == samples[1], s


@pytest.mark.parametrize("trainer", [grpo, ppo], ids=["grpo", "ppo"])
@pytest.mark.slow
def test_members_with_learning_rates_of_their_own_are_their_single_runs(
    tmp_path, tiny_pretrained, trainer
):
    """Members may differ in --lr (compare's NAME@lr=... variants share a population): each member's
    AdamW step at its own rate (lm/optim.AdamW's rate per slice), its metrics its single run's to
    1e-4 relative over the first two steps, its checkpoint's rate its own; a population's members
    all at one rate take AdamW's own step as before."""
    from minigrpo.compare import COMMANDS
    from minigrpo.population.engine import lockstep_key

    init, _, _ = tiny_pretrained
    rates = ("6e-4", "2e-3", "2e-4")
    cfgs = [
        _cfg(init, tmp_path / f"lock-s{s}", s, ("--lr", lr), trainer) for s, lr in enumerate(rates)
    ]
    assert [r["step"] for r in train_lockstep(trainer, cfgs, [print] * 3)] == [3, 3, 3]
    for s, lr in enumerate(rates):
        alone = tmp_path / f"alone-s{s}"
        assert run_one(_run(init, alone, s, trainer.__name__, ("--lr", lr))) is None
        rows, want = (
            read_jsonl(tmp_path / f"lock-s{s}" / "metrics.jsonl"),
            read_jsonl(alone / "metrics.jsonl"),
        )
        assert len(rows) == len(want) == 4
        assert all(close(UNTIMED(g), UNTIMED(w)) == [] for g, w in zip(rows[:3], want[:3])), s
        saved = torch.load(tmp_path / f"lock-s{s}" / "model.pt", weights_only=True)["optimizer"][
            "lr"
        ]
        assert saved == torch.load(alone / "model.pt", weights_only=True)["optimizer"]["lr"]
    items = [
        _run(init, tmp_path / f"k{s}", s, trainer.__name__, ("--lr", lr))
        for s, lr in enumerate(rates)
    ]
    assert (
        len({lockstep_key(item, COMMANDS) for item in items}) == 1
    )  # one population for all three


OWN_SETTINGS = {
    "grpo": (grpo, (), ("pizza", "food:sushi", "food:curry"), ()),
    "grpo-beta": (grpo, (), ("pizza", "pizza", "food:sushi"), ("0.3", "0.05", "0.15")),
    "grpo-kl-in-reward": (
        grpo,
        ("--kl-in", "reward", "--kl", "k1"),
        ("pizza",) * 3,
        ("0.3", "0.05", "0.15"),
    ),
    "ppo": (ppo, (), ("pizza", "food:sushi", "pizza"), ("0.05", "0.05", "0.2")),
    "ppo-oracle": (
        ppo,
        ("--critic", "oracle"),
        ("food:sushi", "pizza", "food:curry"),
        ("0.1", "0.03", "0.1"),
    ),
}


@pytest.mark.parametrize(
    "trainer, extra, rewards, betas", OWN_SETTINGS.values(), ids=OWN_SETTINGS.keys()
)
@pytest.mark.slow
def test_members_with_rewards_and_betas_of_their_own_are_their_single_runs(
    tmp_path, tiny_pretrained, trainer, extra, rewards, betas
):
    """Members may differ in --reward (each scores its rows, is evaluated and, PPO, valued exactly
    under its own reward) and in --beta (GRPO's in its loss or its reward penalty, PPO's adapted on
    its own): each member's metrics are its single run's to 1e-4 relative over the first two steps,
    and the items make one population (engine.lockstep_key)."""
    from minigrpo.compare import COMMANDS
    from minigrpo.population.engine import lockstep_key

    init, _, _ = tiny_pretrained
    own = [
        ("--reward", r, *(("--beta", b) if betas else ()))
        for r, b in zip(rewards, betas or rewards)
    ]
    cfgs = [
        _cfg(init, tmp_path / f"lock-s{s}", s, (*extra, *o), trainer) for s, o in enumerate(own)
    ]
    assert unsupported(trainer, cfgs) is None
    assert [r["step"] for r in train_lockstep(trainer, cfgs, [print] * 3)] == [3, 3, 3]
    for s, o in enumerate(own):
        alone = tmp_path / f"alone-s{s}"
        assert run_one(_run(init, alone, s, trainer.__name__, (*extra, *o))) is None
        rows, want = (
            read_jsonl(tmp_path / f"lock-s{s}" / "metrics.jsonl"),
            read_jsonl(alone / "metrics.jsonl"),
        )
        assert len(rows) == len(want) == 4
        assert all(close(UNTIMED(g), UNTIMED(w)) == [] for g, w in zip(rows[:3], want[:3])), (
            s,
            [close(UNTIMED(g), UNTIMED(w)) for g, w in zip(rows[:3], want[:3])],
        )
    targets = [
        read_jsonl(tmp_path / f"lock-s{s}" / "metrics.jsonl")[0]["target_rate"] for s in range(3)
    ]
    # each evaluated under its own reward
    assert len({round(t, 6) for t in targets}) == len(set(rewards))
    items = [
        _run(init, tmp_path / f"k{s}", s, trainer.__name__, (*extra, *o)) for s, o in enumerate(own)
    ]
    assert (
        len({lockstep_key(item, COMMANDS) for item in items}) == 1
    )  # one population for all three


def test_members_share_the_first_members_pi_ref_and_the_population_never_writes_it(
    tmp_path, tiny_pretrained, monkeypatch
):
    """rl/loop.Run(like=): a member takes the first member's π_ref module (not a copy of its own),
    which only gives its checkpoint a layout: π_ref renewed each step (--ref-update-every 1) is the
    population's stack's, so the shared module keeps the starting weights and each member's
    checkpoint holds its own renewed π_ref (its policy)."""
    init, _, _ = tiny_pretrained
    made, original = [], Member.__init__
    made_run = lambda self, *a, **k: (original(self, *a, **k), made.append(self.run))[0]
    monkeypatch.setattr(Member, "__init__", made_run)
    cfgs = [_cfg(init, tmp_path / f"s{s}", s, ("--ref-update-every", "1")) for s in range(3)]
    assert [r["step"] for r in train_lockstep(grpo, cfgs, [print] * 3)] == [3, 3, 3]
    assert (
        made[1].ref is made[0].ref
        and made[2].ref is made[0].ref
        and made[1].policy is not made[0].policy
    )
    start = torch.load(init, weights_only=True)["model"]
    assert all(torch.equal(w, start[k]) for k, w in made[0].ref.state_dict().items())
    for s in range(3):
        state = torch.load(tmp_path / f"s{s}" / "model.pt", weights_only=True)
        ref = state["extra"]["rl"]["ref"]
        assert all(torch.equal(w, state["model"][k]) for k, w in ref.items()), s
        assert not all(torch.equal(w, start[k]) for k, w in ref.items()), s


def test_host_copies_are_made_once_and_each_member_gets_its_own_slices_in_its_layout():
    stacked = {"w": torch.arange(24.0).view(3, 2, 4), "b": torch.arange(6.0).view(3, 2)}
    copies = HostCopies({"policy": stacked, "m": {0: stacked["w"] * 2}})
    assert copies.host is None  # nothing copied before a checkpoint asks
    # a weight kept transposed, as lm/model.py does
    layout = {"w": torch.empty(4, 2).t(), "b": torch.empty(2)}
    mine = copies.member("policy", 1, layout)
    host = copies.host
    assert torch.equal(mine["w"], stacked["w"][1]) and mine["w"].stride() == (1, 2)
    # its own
    assert torch.equal(mine["b"], stacked["b"][1]) and mine["b"].untyped_storage().nbytes() == 2 * 4
    m = copies.member("m", 2)
    assert torch.equal(m[0], stacked["w"][2] * 2) and m[0].untyped_storage().nbytes() == 8 * 4
    assert copies.host is host  # one copy for every member and group of the step


@pytest.mark.parametrize("trainer", [grpo, ppo], ids=["grpo", "ppo"])
@pytest.mark.slow
def test_a_failing_member_ends_with_its_error_and_the_others_are_untouched(
    tmp_path, tiny_pretrained, trainer
):
    """Member 1's reward raises in its second step: it fails with its single run's line, and members
    0 and 2 write what they write without it (to 1e-4 relative over the first two steps, as in the
    test above; PPO's critics leave the stack with it). Only the reward differs: train_lockstep
    takes what members share from the first."""
    init, _, _ = tiny_pretrained
    cfg = lambda folder, seed, extra=(): _cfg(init, tmp_path / folder, seed, extra, trainer)
    cfgs = [cfg(f"two-s{s}", s) for s in (0, 2)]
    assert [r["step"] for r in train_lockstep(trainer, cfgs, [print] * 2)] == [3, 3]
    bad = breaking_reward(tmp_path)
    train_lockstep(
        trainer, [cfg("one-step", 1, ("--reward", f"{bad}:reward", "--steps", "1"))], [print]
    )
    # it breaks in its second step
    (tmp_path / "limit.txt").write_text((tmp_path / "count.txt").read_text())
    three = [
        replace(cfgs[0], out=str(tmp_path / "w0")),
        cfg("bad", 1, ("--reward", f"{bad}:reward")),
        replace(cfgs[1], out=str(tmp_path / "w2")),
    ]
    results = train_lockstep(trainer, three, [print] * 3)
    assert "the reward broke" in results[1] and "stopped at step 1" in results[1], results[1]
    assert not (tmp_path / "bad" / "summary.json").exists()
    for a, b in (("two-s0", "w0"), ("two-s2", "w2")):
        rows, want = (
            read_jsonl(tmp_path / b / "metrics.jsonl"),
            read_jsonl(tmp_path / a / "metrics.jsonl"),
        )
        # to 1e-4 relative over two steps (REL: each member computes as it would alone)
        assert len(rows) == len(want) == 4
        assert all(close(UNTIMED(g), UNTIMED(w)) == [] for g, w in zip(rows[:3], want[:3])), [
            close(UNTIMED(g), UNTIMED(w)) for g, w in zip(rows, want)
        ]


@pytest.mark.slow
def test_members_leaving_a_stale_sampler_are_their_single_runs_and_the_others_too(
    tmp_path, tiny_pretrained
):
    """--sample-stale 1 (GRPO's sampler draws from the last step's stacked weights): member 1 ends
    after step 2, member 0 (whose sampler the others share, Population.adopt) after step 3, member 2
    goes on alone to step 4. Population.leave cuts the stale record to the live members, so each
    member samples from its own last weights: every member's metrics over all its steps, those
    after the others left included, are its single run's to 1e-4 relative."""
    init, _, _ = tiny_pretrained
    steps = (3, 2, 4)
    flags = lambda s: ("--sample-stale", "1", "--steps", str(steps[s]))
    cfgs = [_cfg(init, tmp_path / f"lock-s{s}", s, flags(s)) for s in range(3)]
    assert [r["step"] for r in train_lockstep(grpo, cfgs, [print] * 3)] == list(steps)
    for s in range(3):
        assert run_one(_run(init, tmp_path / f"alone-s{s}", s, extra=flags(s))) is None
        rows, want = (
            read_jsonl(tmp_path / f"{kind}-s{s}" / "metrics.jsonl") for kind in ("lock", "alone")
        )
        assert len(rows) == len(want) == steps[s] + 1, s
        assert [close(UNTIMED(g), UNTIMED(w)) for g, w in zip(rows, want)] == [[]] * len(want), s


def test_what_lockstep_refuses_is_named(tmp_path, tiny_pretrained):
    init, _, _ = tiny_pretrained
    a, b = _cfg(init, tmp_path / "a", 0), _cfg(init, tmp_path / "b", 1, ("--beta", "0.1"))
    assert unsupported(grpo, [a, b]) is None  # each member's β
    # a recipe of its own
    assert unsupported(grpo, [a, _cfg(init, tmp_path / "b", 1, ("--beta", "0"))]) is None
    assert (
        unsupported(grpo, [a, _cfg(init, tmp_path / "b", 1, ("--group-size", "2"))])
        == "members differ in more than their seed, out, lr, reward, beta, person and recipe"
    )
    from minigrpo.compare import COMMANDS
    from minigrpo.population.engine import lockstep_key, run_lockstep

    key = lambda *flags: lockstep_key(
        _run(init, tmp_path / "k", 0, "minigrpo.grpo", flags), COMMANDS
    )
    assert (
        key()
        == key("--beta", "0.1")
        == key("--beta", "0")
        == key("--preset", "dapo")
        == key("--kl", "k3")
    )
    assert key() != key("--preset", "remax") != key("--group-size", "2")  # another μ, another batch
    bad = [
        _run(init, tmp_path / f"x{s}", s, "minigrpo.grpo", ("--beta", "x") * s) for s in range(2)
    ]
    # a bad value: its run says so
    assert key() == lockstep_key(bad[1], COMMANDS) and run_lockstep(bad, None, COMMANDS) is False
    # each member's own rate
    assert unsupported(grpo, [a, _cfg(init, tmp_path / "b", 1, ("--lr", "1e-3"))]) is None
    assert (
        unsupported(grpo, [_cfg(init, tmp_path / "c", 0, ("--preserve-anchor", "sampled"))])
        == "--preserve-anchor sampled"
    )
    assert (
        unsupported(ppo, [_cfg(init, tmp_path / "e", 0, ("--preserve-anchor", "sampled"), ppo)])
        == "--preserve-anchor sampled"
    )
    assert unsupported(grpo, [_cfg(init, tmp_path / "d", 0, ("--preset", "gspo"))]) is None
    # a trainer without a lockstep (no ALGORITHM, no update of its members)
    dpo_cfg = dpo.parse(["--init", str(init), "--out", str(tmp_path / "f")])
    assert unsupported(dpo, [dpo_cfg]) == "minigrpo.dpo has no lockstep"


@pytest.mark.parametrize(
    "extra",
    [(), ("--entropy-target", "0.5", "--entropy-step", "0.01")],
    ids=["dapo", "dapo-entropy-target"],
)
@pytest.mark.slow
def test_dapos_members_skip_their_equal_groups_as_their_single_runs_do(
    tmp_path, tiny_pretrained, extra
):
    """--preset dapo (--skip-equal-groups, token-mean) in lockstep: a member whose groups all have
    equal rewards takes its μ updates on the anchor alone, as its single run does; the members match
    their single runs to 1e-4 relative over all four steps, the same keys in every row (with an
    entropy target too, whose figures a skipped step does not log)."""
    init, _, _ = tiny_pretrained
    dapo = ("--preset", "dapo", "--steps", "4", *extra)
    cfgs = [_cfg(init, tmp_path / f"lock-s{s}", s, dapo) for s in range(4)]
    assert unsupported(grpo, cfgs) is None
    assert [r["step"] for r in train_lockstep(grpo, cfgs, [print] * 4)] == [4] * 4
    skipped = 0
    for s in range(4):
        assert run_one(_run(init, tmp_path / f"alone-s{s}", s, extra=dapo)) is None
        rows, want = (
            read_jsonl(tmp_path / f"{t}-s{s}" / "metrics.jsonl") for t in ("lock", "alone")
        )
        assert len(rows) == len(want) == 5 and [set(r) for r in rows] == [set(w) for w in want], s
        assert all(close(UNTIMED(g), UNTIMED(w)) == [] for g, w in zip(rows, want)), s
        skipped += sum(w.get("skipped", 0) for w in want)
    assert 0 < skipped < 16, skipped  # both kinds of step were taken


def test_a_lockstep_population_that_fails_as_a_whole_reports_it_for_each_run(
    tmp_path, tiny_pretrained, monkeypatch
):
    """An error of the batch itself (the GPU's memory, say) is each run's error line, its folder
    without a summary."""
    from test_population import _run as item

    from minigrpo.compare import COMMANDS
    from minigrpo.population import lockstep
    from minigrpo.population.engine import run_population

    def out_of_memory(*args):
        raise RuntimeError("CUDA out of memory (as a test)")

    monkeypatch.setattr(lockstep, "_step", out_of_memory)
    init, _, _ = tiny_pretrained
    errors = {}
    run_population(
        [item(init, tmp_path / f"s{s}", s) for s in range(2)],
        lambda i, e: errors.__setitem__(i[1], e),
        COMMANDS,
    )
    assert errors == {
        0: "RuntimeError: CUDA out of memory (as a test)",
        1: "RuntimeError: CUDA out of memory (as a test)",
    }
    assert (
        not (tmp_path / "s0" / "summary.json").exists()
        and (tmp_path / "s0" / "config.json").exists()
    )


def test_runs_whose_folders_cannot_be_made_fail_alone_and_none_made_trains_nothing(
    tmp_path, tiny_pretrained, monkeypatch
):
    """A folder that cannot be made afresh fails its run only; with none made, the population is
    done (each run said why) without a step."""
    from test_population import _run as item

    from minigrpo.compare import COMMANDS
    from minigrpo.population import engine

    def refused(item, lockstep=False):
        raise PermissionError(f"cannot make {item[1]} (as a test)")

    monkeypatch.setattr(engine, "start_folder", refused)
    init, _, _ = tiny_pretrained
    errors = {}
    items = [item(init, tmp_path / f"s{s}", s) for s in range(2)]
    assert engine.run_lockstep(items, lambda i, e: errors.__setitem__(i[1], e), COMMANDS) is True
    assert errors == {s: f"PermissionError: cannot make {s} (as a test)" for s in range(2)}
    assert not (tmp_path / "s0").exists()


def test_a_keyboardinterrupt_in_a_step_ends_every_member_as_interrupted_at_once(
    tmp_path, tiny_pretrained, monkeypatch
):
    """A KeyboardInterrupt out of a step (a reward that raises it; a second Ctrl-C) once ended a
    population with none of its runs reported, and compare tabulated them as complete: each run
    now says it was interrupted at once in that step, without a summary or a checkpoint of the
    half-applied step."""
    from test_population import _run as item

    from minigrpo.compare import COMMANDS
    from minigrpo.population import lockstep
    from minigrpo.population.engine import run_task

    steps, real_step = [], lockstep._step

    def interrupted_in_step_2(pop):
        steps.append(len(steps) + 1)
        if len(steps) == 2:
            raise KeyboardInterrupt  # as the reward would, while scoring
        real_step(pop)

    monkeypatch.setattr(lockstep, "_step", interrupted_in_step_2)
    init, _, _ = tiny_pretrained
    items = [item(init, tmp_path / f"s{s}", s) for s in range(2)]
    results = run_task(("population", items), COMMANDS)
    said = "interrupted at once during step 2: the checkpoints already written are intact"
    assert results == [(items[0], said), (items[1], said)], results
    for s in range(2):
        assert not (tmp_path / f"s{s}" / "summary.json").exists()
        assert [r["step"] for r in read_jsonl(tmp_path / f"s{s}" / "metrics.jsonl")] == [0, 1]


@pytest.mark.parametrize(
    "trainer, extra", [(grpo, ()), (ppo, ("--critic", "oracle"))], ids=["grpo", "ppo-oracle"]
)
@pytest.mark.slow
def test_arithmetic_members_with_other_prompts_are_their_single_runs(tmp_path, trainer, extra):
    """The arithmetic task in lockstep: each member draws its own prompts (other widths: the rows
    are padded, and the members sample each from its own Draws), evaluates model by model (the task
    has no rl_evaluate_many), and matches its single run to 1e-4 relative over two steps; PPO's
    exact critic over many prompts' supports, each answer rewarded otherwise."""
    from minigrpo.pretrain import PretrainConfig, train

    train(
        PretrainConfig(
            task="arithmetic",
            out=str(tmp_path / "pre"),
            device="cpu",
            steps=40,
            batch_size=64,
            n_embd=32,
            n_head=2,
            lr=1e-2,
            n_lines=2000,
            eval_every=40,
            ckpt_every=40,
            threads=1,
        ),
        log=lambda *a: None,
    )
    init, flags = (
        tmp_path / "pre" / "model.pt",
        ("--task", "arithmetic", "--prompts-per-step", "4", "--steps", "2"),
    )
    argv = lambda folder, seed: [
        "--seed",
        str(seed),
        "--init",
        str(init),
        "--quiet",
        "--no-plot",
        "--group-size",
        "4",
        *flags,
        *extra,
        "--out",
        str(tmp_path / folder),
    ]
    cfgs = [trainer.parse(argv(f"lock-s{s}", s)) for s in range(2)]
    assert unsupported(trainer, cfgs) is None
    assert [r["step"] for r in train_lockstep(trainer, cfgs, [print] * 2)] == [2, 2]
    for s in range(2):
        trainer.train(trainer.parse(argv(f"alone-s{s}", s)), log=lambda *a: None)
        rows, want = (
            read_jsonl(tmp_path / f"{t}-s{s}" / "metrics.jsonl") for t in ("lock", "alone")
        )
        assert len(rows) == len(want) == 3 and all(
            close(UNTIMED(g), UNTIMED(w)) == [] for g, w in zip(rows, want)
        )
