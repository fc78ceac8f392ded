"""minigrpo/population/grpo_update.py's recipes: members of several GRPO recipes in
one lockstep population, each against its single run (its oracle), and the merge of the recipes'
figures."""

import json

import pytest
import torch
from test_lockstep import _cfg
from test_population import UNTIMED, _run, close

from minigrpo import grpo
from minigrpo.compare import run_one
from minigrpo.population.grpo_update import RECIPE, _merger, recipe_of
from minigrpo.population.lockstep import train_lockstep, unsupported
from minigrpo.util.jsonl import read_jsonl

# compare's presets of μ = 2 (default, dr_grpo, dapo, rloo, grpo; gspo's ratio per sequence too), a
# member of the default's recipe with a rate of its own in between, so that the default's members
# are places 0 and 2
MIXED = [
    (),
    ("--preset", "dr_grpo"),
    ("--lr", "1e-3"),
    ("--preset", "rloo"),
    ("--preset", "dapo"),
    ("--preset", "grpo"),
    ("--preset", "gspo"),
]
NO_ANCHOR = [
    ("--preset", "dapo", "--no-preserve", "--reward", "ZERO"),
    ("--no-preserve",),
    ("--no-preserve", "--beta", "0.1"),
]  # ZERO: a reward that gives 0 to every completion


@pytest.mark.parametrize(
    "runs, recipes", [(MIXED, 6), (NO_ANCHOR, 3)], ids=["presets", "no-anchor"]
)
@pytest.mark.slow
def test_members_of_several_recipes_are_their_single_runs(tmp_path, tiny_pretrained, runs, recipes):
    """Seven members of six recipes (β 0 and > 0, the KL in the loss and in the reward, k3, k1 and
    exact, DAPO's dropped groups and clip, GSPO's sequence ratio, every aggregation) as one
    population; and without an anchor, where a DAPO member with no group left keeps its weights
    while the others step: each member's metrics are its single run's to 1e-4 relative over the
    first two steps, in its run's order of figures (metrics.jsonl the same text but for the
    numbers), and its config.json is its run's."""
    init, _, _ = tiny_pretrained
    (tmp_path / "zero.py").write_text("def zero(prompt, completion):\n    return 0.0\n")
    runs = [
        tuple(f"{tmp_path / 'zero.py'}:zero" if a == "ZERO" else a for a in extra) for extra in runs
    ]
    cfgs = [_cfg(init, tmp_path / f"lock-{k}", k, extra) for k, extra in enumerate(runs)]
    assert unsupported(grpo, cfgs) is None
    assert len({recipe_of(c) for c in cfgs}) == recipes
    assert [r["step"] for r in train_lockstep(grpo, cfgs, [print] * len(cfgs))] == [3] * len(cfgs)
    skipped = [
        [r.get("skipped", 0) for r in read_jsonl(tmp_path / f"lock-{k}" / "metrics.jsonl")[1:]]
        for k in range(len(runs))
    ]
    # the DAPO member skipped every step (every group's rewards equal), the others none
    if runs is NO_ANCHOR:
        assert skipped == [[1.0] * 3] + [[0] * 3] * 2, skipped
        # its weights kept: no anchor to update on
        first = torch.load(init, weights_only=True)["model"]
        assert all(
            torch.equal(w, first[k])
            for k, w in torch.load(tmp_path / "lock-0" / "model.pt", weights_only=True)[
                "model"
            ].items()
        )
    for k, extra in enumerate(runs):
        alone = tmp_path / f"alone-{k}"
        assert run_one(_run(init, alone, k, "minigrpo.grpo", extra)) is None
        rows, want = (
            read_jsonl(tmp_path / f"lock-{k}" / "metrics.jsonl"),
            read_jsonl(alone / "metrics.jsonl"),
        )
        assert len(rows) == len(want) == 4
        # its figures, no other recipe's, in order
        assert [list(r) for r in rows] == [list(w) for w in want], k
        assert all(close(UNTIMED(g), UNTIMED(w)) == [] for g, w in zip(rows[:3], want[:3])), (
            k,
            extra,
            [close(UNTIMED(g), UNTIMED(w)) for g, w in zip(rows[:3], want[:3])],
        )
        mine, its = (
            json.loads((f / "config.json").read_text()) for f in (tmp_path / f"lock-{k}", alone)
        )
        assert {n: mine[n] for n in RECIPE} == {n: its[n] for n in RECIPE}
        steps = [
            torch.load(f / "model.pt", weights_only=True)["optimizer"]["t"]
            for f in (tmp_path / f"lock-{k}", alone)
        ]
        # its optimiser's steps: none where it skipped without an anchor
        assert steps[0] == steps[1], (k, steps)


def test_one_recipe_takes_the_whole_and_several_merge_in_the_members_order():
    """_merger: one recipe's tensors and dicts are returned as they are (no copy); several are put
    back in the members' order, a figure a recipe lacks NaN for its members, and the gradient
    reaches each part's own."""
    one = _merger([None])
    x = torch.arange(3.0)
    assert one([x]) is x and one([{"a": x}])["a"] is x
    merge = _merger([torch.tensor([0, 2]), torch.tensor([1])])
    a, b = torch.tensor([10.0, 12.0], requires_grad=True), torch.tensor([11.0], requires_grad=True)
    merged = merge([a, b])
    assert merged.tolist() == [10.0, 11.0, 12.0]
    (merged * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert a.grad.tolist() == [1.0, 3.0] and b.grad.tolist() == [2.0]
    figures = merge(
        [
            {"loss": torch.tensor([1.0, 3.0]), "kl_k3": torch.tensor([5.0, 6.0])},
            {"loss": torch.tensor([2.0]), "skipped": torch.tensor([1.0])},
        ]
    )
    assert list(figures) == ["loss", "kl_k3", "skipped"] and figures["loss"].tolist() == [
        1.0,
        2.0,
        3.0,
    ]
    assert figures["kl_k3"][1].isnan() and figures["kl_k3"][[0, 2]].tolist() == [5.0, 6.0]
    assert figures["skipped"][[0, 2]].isnan().all() and figures["skipped"][1] == 1.0


@pytest.mark.slow
def test_every_grpo_preset_goes_in_its_mus_lockstep_population_as_it_runs_alone(
    tmp_path, tiny_pretrained
):
    """compare's GRPO presets and default: two lockstep populations, μ = 2 and μ = 1 (J_β, ReMax,
    GPG), each preset a recipe; each member's first steps match its run alone to 1e-4 relative."""
    from minigrpo.compare import ALGOS, COMMANDS, OWN_TRAINERS
    from minigrpo.population.engine import lockstep_key, run_lockstep, shares_of

    init, _, _ = tiny_pretrained
    presets = [a for a in ALGOS if a not in OWN_TRAINERS]
    flags = {a: () if a == "default" else ("--preset", a) for a in presets}
    items = [_run(init, tmp_path / f"pop-{a}", 0, "minigrpo.grpo", flags[a]) for a in presets]
    shares, alone = shares_of(items, COMMANDS)
    assert alone == []
    assert sorted(len(share) for share in shares) == [3, len(presets) - 3] and all(
        (lockstep_key(item, COMMANDS) for item in items)
    )
    errors = {}
    for share in shares:
        assert run_lockstep(
            share, lambda item, error: errors.__setitem__(item[3].name, error), COMMANDS
        )
    assert set(errors.values()) == {None}, errors
    for a in presets:
        assert run_one(_run(init, tmp_path / f"alone-{a}", 0, "minigrpo.grpo", flags[a])) is None
        rows, want = (read_jsonl(tmp_path / f"{t}-{a}" / "metrics.jsonl") for t in ("pop", "alone"))
        assert len(rows) == len(want) == 4 and [list(r) for r in rows] == [list(w) for w in want], a
        assert [close(UNTIMED(g), UNTIMED(w)) for g, w in zip(rows[:3], want)] == [[], [], []], a
