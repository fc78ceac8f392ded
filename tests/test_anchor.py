"""minigrpo/population/anchor.py and lockstep's trust-region anchor rows (Population.adopt):
members of other --person (each its own prompt, tree anchor and trust-region anchor rows) in one
lockstep population, against their single runs (the oracle); own_rows' padding."""

import pytest
import torch
from test_lockstep import _cfg
from test_population import UNTIMED, _run, close

from minigrpo import grpo, ppo
from minigrpo.compare import run_one
from minigrpo.lm.sampling import Generation
from minigrpo.population.anchor import own_rows
from minigrpo.population.lockstep import train_lockstep, unsupported
from minigrpo.util.jsonl import read_jsonl

PEOPLE = {"grpo": (grpo, ()), "ppo": (ppo, ()), "ppo-oracle": (ppo, ("--critic", "oracle"))}


@pytest.mark.parametrize("trainer, extra", PEOPLE.values(), ids=PEOPLE.keys())
@pytest.mark.slow
def test_members_of_other_people_are_their_single_runs(tmp_path, tiny_pretrained, trainer, extra):
    """Members of three --person (two of them one person's): each trains on its own prompt, keeps
    the others' food through its own anchor, is held by the trust region on its own anchor rows, is
    evaluated on its own target and drift (PPO: valued exactly over its own prompt); each matches
    its single run to 1e-4 relative over the first two steps, and the items make one population
    (engine.lockstep_key)."""
    from minigrpo.compare import COMMANDS
    from minigrpo.population.engine import lockstep_key

    init, _, _ = tiny_pretrained
    people = ["ravin", "alice", "ravin", "bob"]
    own = [(*extra, "--person", p) for p in people]
    cfgs = [_cfg(init, tmp_path / f"lock-{k}", k, o, trainer) for k, o in enumerate(own)]
    assert unsupported(trainer, cfgs) is None
    assert [r["step"] for r in train_lockstep(trainer, cfgs, [print] * len(cfgs))] == [3] * len(
        cfgs
    )
    for k, o in enumerate(own):
        alone = tmp_path / f"alone-{k}"
        assert run_one(_run(init, alone, k, trainer.__name__, o)) is None
        rows, want = (
            read_jsonl(tmp_path / f"lock-{k}" / "metrics.jsonl"),
            read_jsonl(alone / "metrics.jsonl"),
        )
        assert len(rows) == len(want) == 4 and [list(r) for r in rows] == [list(w) for w in want], k
        assert all(close(UNTIMED(g), UNTIMED(w)) == [] for g, w in zip(rows[:3], want[:3])), (
            k,
            [close(UNTIMED(g), UNTIMED(w)) for g, w in zip(rows[:3], want[:3])],
        )
    targets = [
        read_jsonl(tmp_path / f"lock-{k}" / "metrics.jsonl")[0]["target_rate"]
        for k in range(len(people))
    ]
    # each person's own target
    assert targets[0] == targets[2] and len({round(t, 6) for t in targets}) == 3
    items = [_run(init, tmp_path / f"k{k}", k, trainer.__name__, o) for k, o in enumerate(own)]
    assert len({lockstep_key(item, COMMANDS) for item in items}) == 1


def test_own_rows_pad_each_members_rows_by_repeating_its_last_one():
    """Two members of 2 and 3 rows (completions of 1 and 2 tokens): one Generation of 3 rows
    each, the short member's third row its second again (no node its tree lacks), its per-row
    tensors padded with 0, the masks to 2 positions."""

    def gen(rows):
        ids = torch.tensor([[1, 5, *c, *[0] * (2 - len(c))] for c in rows])
        comp = torch.tensor([[True] * len(c) + [False] * (2 - len(c)) for c in rows])
        key = torch.cat([torch.ones(len(rows), 2, dtype=torch.bool), comp], 1)
        return Generation(
            ids[:, : 2 + max(map(len, rows))],
            key[:, : 2 + max(map(len, rows))],
            2,
            comp[:, : max(map(len, rows))],
            torch.zeros(comp[:, : max(map(len, rows))].shape),
            torch.ones(len(rows), dtype=torch.bool),
        )

    a, b = gen([[7], [8]]), gen([[7, 2], [8, 2], [9, 2]])
    rows, (w, where) = own_rows(
        [a, b],
        [
            [torch.tensor([0.5, 0.5]), torch.tensor([0.2, 0.3, 0.5])],
            [a.completion_mask, b.completion_mask],
        ],
    )
    assert rows.ids.shape[:2] == (2, 3) and torch.equal(rows.ids[0, 2], rows.ids[0, 1])
    assert torch.equal(w, torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]))
    assert where.shape == (2, 3, 2) and where[0].tolist() == [
        [True, False],
        [True, False],
        [False, False],
    ]
