"""variants/inner_updates.py (GRPO's μ loop and its step's row, one definition for a run alone and
a lockstep population) and population/grpo_update.Members (what the population maps GRPO's stages
over): each against what a run alone does, written out by hand."""

from types import SimpleNamespace

import torch

from minigrpo.population.grpo_update import Members
from minigrpo.variants.inner_updates import inner_updates, row


def _loop(terms, anchor, updates=2):
    """inner_updates with a constant forward, recording each step(loss) -> (figures, ratios, the
    losses stepped)."""
    stepped = []
    step = lambda loss: stepped.append(loss.item()) or 7.0
    per_update, ratios = inner_updates(updates, lambda: (None, None), terms, anchor, step)
    return per_update, ratios, stepped


def test_each_update_steps_on_its_loss_with_the_anchor_beside_it_in_the_runs_order():
    terms = lambda i, logp, logits: (
        torch.tensor(1.0 + i),
        {"policy_loss": torch.tensor(0.5), "loss": torch.tensor(1.0 + i), "kl": torch.tensor(i)},
        {"ratio_max": torch.tensor(2.0 + i)} if i else {},
    )
    per_update, ratios, stepped = _loop(terms, lambda: torch.tensor(0.25))
    assert stepped == [1.25, 2.25]
    assert [list(d) for d in per_update] == [
        ["policy_loss", "loss", "kl", "preserve_loss", "grad_norm"]
    ] * 2
    assert [d["loss"].item() for d in per_update] == [1.25, 2.25]
    assert [d["ratio_max"].item() for d in ratios] == [3.0], "no ratio at the first of μ > 1"
    per_update, _, stepped = _loop(terms, lambda: None)
    assert stepped == [1.0, 2.0] and "preserve_loss" not in per_update[0]


def test_a_skipped_step_takes_the_anchors_updates_alone_and_none_without_an_anchor():
    per_update, ratios, stepped = _loop(None, lambda: torch.tensor(0.25), updates=3)
    assert stepped == [0.25] * 3 and ratios == []
    assert [list(d) for d in per_update] == [["preserve_loss", "grad_norm"]] * 3
    assert _loop(None, lambda: None, updates=3) == ([], [], []), "no anchor: no optimiser step"


def test_a_steps_row_combines_its_updates_and_a_skipped_step_keeps_its_signals_figures():
    per_update = [
        {"loss": 1.0, "ratio_max": 3.0, "preserve_loss": 0.5, "grad_norm": 2.0},
        {"loss": 3.0, "ratio_max": 1.0, "preserve_loss": 1.5, "grad_norm": 4.0},
    ]
    stats = {"adv_mean": 0.0, "skipped": 0.0, "sampler_kl": 0.1}
    assert row(stats, ["adv_mean", "skipped"], per_update, [{"clip_frac": 0.5}]) == {
        "adv_mean": 0.0,
        "sampler_kl": 0.1,
        "loss": 2.0,
        "ratio_max": 3.0,
        "preserve_loss": 1.0,
        "grad_norm": 3.0,
        "clip_frac": 0.5,
    }
    skipped = row({**stats, "skipped": 1.0}, ["adv_mean", "skipped"], per_update, [])
    assert skipped == {"adv_mean": 0.0, "preserve_loss": 1.0, "grad_norm": 3.0, "skipped": 1.0}
    assert row({"adv_mean": 0.0, "skipped": 1.0}, ["adv_mean"], [], []) == {
        "adv_mean": 0.0,
        "skipped": 1.0,
    }


def test_members_call_each_runs_own_function_on_its_slice_and_a_failed_member_calls_none():
    """Members.each: each member's function on its slice, a (P, N, T, ...) one cut to the member's
    own completion width (its longest completion), as its single run has it; the
    outputs padded back to T; a failed member's slot holds another's outputs, detached."""
    calls = []

    class Algo:
        def __init__(self, name):
            self.name = name

    def fn(a, x, objects, fixed, t):
        calls.append((a.name, tuple(t.shape)))
        return x * 2, {"n": float(len(objects))}, objects, None, fixed, t + 1

    batch = SimpleNamespace(gen=None)
    lengths = torch.tensor([[3, 1, 0, 2], [4, 4, 4, 4], [1, 2, 2, 0]])  # widths 3, 4, 2 of T = 5
    step = SimpleNamespace(
        algos=[Algo("a"), Algo("b"), Algo("c")],
        mask=torch.arange(5) < lengths[..., None],
        rewards=torch.zeros(3, 4),
        batches=[batch, None, batch],
        runs=[SimpleNamespace(cfg=SimpleNamespace(beta=b)) for b in (0.1, 0.1, 0.2)],
    )
    m = Members(step)
    x, t = torch.arange(6.0).view(3, 2).requires_grad_(), torch.ones(3, 4, 5)
    doubled, figures, objects, none, fixed, wider = m.each(fn, x, ["u", "vv", "www"], 5, t)
    assert calls == [("a", (4, 3)), ("c", (4, 2))], "the failed member's: never"
    assert doubled.tolist() == [[0.0, 2.0], [0.0, 2.0], [8.0, 10.0]]  # its slot: another's
    assert figures["n"].tolist() == [1.0, 1.0, 3.0] and objects == ["u", "u", "www"]
    assert none is None and fixed.tolist() == [5, 5, 5], "numbers as a tensor"
    assert wider.shape == (3, 4, 5) and wider.sum((0, 1)).tolist() == [24, 24, 16, 0, 0]
    doubled.sum().backward()  # the failed member's slot, a copy of another's, passes no gradient
    assert x.grad.tolist() == [[2.0, 2.0], [0.0, 0.0], [2.0, 2.0]]
    assert m.map(lambda v, w: v.sum() + (0 if w is None else w), x, None).tolist() == [
        1.0,
        5.0,
        9.0,
    ]
