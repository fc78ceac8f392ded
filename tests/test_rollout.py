"""Properties of minigrpo/rl/rollout.py: the layout GRPO's group baselines rely on,
RolloutBatch.select, and the log-probs `collect` stores, checked against the teacher-forced scorer
of minigrpo/lm/logprobs.py."""

import copy

import pytest
import torch

from minigrpo.lm.logprobs import completion_logprobs as teacher_forced
from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.lm.tokenizer import BOS_ID
from minigrpo.rl.rollout import RolloutBatch, collect
from toy_tasks.rewards import Reward

# drawn with replacement: a repeat
PROMPTS = ["bob likes ", "alice likes ", "jo likes ", "bob likes "]
G = 3


def by_prompt(prompt: str, completion: str) -> float:
    """A reward that names its prompt: 100·(index of the person) + the completion's length."""
    return 100.0 * ["alice", "bob", "jo"].index(prompt.split()[0]) + len(completion)


def models(tiny_pretrained):
    _, model, tok = tiny_pretrained
    policy = copy.deepcopy(model)
    with torch.no_grad():  # π_old ≠ π_ref, so their log-probs cannot be confused
        g = torch.Generator().manual_seed(0)
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return policy, copy.deepcopy(model), tok


def rollout(tiny_pretrained, seed=0, **kw) -> tuple:
    policy, ref, tok = models(tiny_pretrained)
    kw = {"max_new_tokens": 7, "keep_ref_logits": True, **kw}
    batch = collect(
        policy,
        ref,
        tok,
        PROMPTS,
        G,
        Reward("by_prompt", by_prompt),
        torch.Generator().manual_seed(seed),
        **kw,
    )
    return batch, policy, ref, tok


def test_rows_are_grouped_prompt_by_prompt(tiny_pretrained):
    batch, _, _, tok = rollout(tiny_pretrained)
    N = len(PROMPTS) * G
    assert batch.group_size == G and batch.rewards.shape == (N,) and batch.gen.ids.size(0) == N
    assert batch.prompts == [p for p in PROMPTS for _ in range(G)]
    P = batch.gen.prompt_len
    for i in range(N):  # the tokens each row was sampled after are its prompt's
        head = batch.gen.ids[i, :P][batch.gen.key_mask[i, :P]].tolist()
        assert head[0] == BOS_ID and tok.decode(head[1:]) == batch.prompts[i], (
            f"row {i} was sampled after another prompt"
        )
        assert batch.rewards[i].item() == by_prompt(batch.prompts[i], batch.completions[i])
    groups = batch.rewards.view(-1, G)  # (prompts, G): row b must be prompt b's G completions
    assert groups.shape == (len(PROMPTS), G)
    for b, prompt in enumerate(PROMPTS):
        want = 100.0 * ["alice", "bob", "jo"].index(prompt.split()[0])
        assert ((groups[b] >= want) & (groups[b] < want + 100)).all(), (
            f"group {b} mixes prompts: {groups[b].tolist()}"
        )
    assert batch.completions == [tok.decode(r.tolist()) for r in batch.gen.completion_ids]


@pytest.mark.parametrize("with_optional", [True, False])
def test_select_picks_the_same_rows_of_every_field(tiny_pretrained, with_optional):
    batch, _, _, _ = rollout(
        tiny_pretrained, seed=1, keep_ref_logits=with_optional, old_logp=with_optional
    )
    rows = torch.tensor([7, 0, 4, 4, 11])
    sub = batch.select(rows)
    assert isinstance(sub, RolloutBatch) and sub.group_size == batch.group_size
    pick = rows.tolist()
    assert sub.prompts == [batch.prompts[i] for i in pick]
    assert sub.completions == [batch.completions[i] for i in pick]
    assert torch.equal(sub.rewards, batch.rewards[rows])
    assert torch.equal(sub.ref_logp, batch.ref_logp[rows])
    g, h = batch.gen, sub.gen
    assert h.prompt_len == g.prompt_len
    for name in ("ids", "key_mask", "completion_mask", "logprobs", "finished"):
        assert torch.equal(getattr(h, name), getattr(g, name)[rows]), (
            f"select mismatched gen.{name}"
        )
    assert torch.equal(sub.mask, batch.mask[rows])
    for name in ("old_logp", "ref_logits"):
        x = getattr(batch, name)
        if with_optional:
            assert torch.equal(getattr(sub, name), x[rows]), f"select mismatched {name}"
        else:
            assert x is None and getattr(sub, name) is None


def test_stored_logprobs_equal_teacher_forced_scores_of_each_row(tiny_pretrained):
    batch, policy, ref, tok = rollout(tiny_pretrained, seed=2)
    fin = batch.gen.finished
    assert fin.any() and (~fin).any(), "the test needs finished and cut-off rows (max_new_tokens 7)"
    for stored, model in ((batch.old_logp, policy), (batch.ref_logp, ref)):
        assert (stored[~batch.mask] == 0).all(), "log-probs must be 0 at masked positions"
        summed = stored.sum(1)
        for i in range(len(batch.prompts)):  # the EOS is scored only where the row produced it
            want = teacher_forced(
                model, tok, [batch.prompts[i]], [batch.completions[i]], end=bool(fin[i])
            )
            assert abs(summed[i].item() - want.item()) < 1e-4, (
                f"row {i}: {summed[i].item()} != {want.item()}"
            )
    assert not torch.allclose(batch.old_logp, batch.ref_logp), (
        "π_old and π_ref differ here: so must their log-probs"
    )
    # temperature 1: π_old's log-probs are exactly the sampling distribution's
    assert torch.allclose(batch.old_logp, batch.gen.logprobs, atol=1e-5)
    # the kept reference logits produce the reference log-probs
    lp = (
        torch.log_softmax(batch.ref_logits, -1)
        .gather(-1, batch.gen.completion_ids[..., None])
        .squeeze(-1)
    )
    assert batch.ref_logits.shape[:2] == batch.mask.shape
    assert torch.allclose(torch.where(batch.mask, lp, 0.0), batch.ref_logp, atol=1e-5)


def test_old_logprobs_follow_the_sampling_temperature(tiny_pretrained):
    batch, policy, _, _ = rollout(tiny_pretrained, seed=3, temperature=0.7)
    assert torch.allclose(batch.old_logp, batch.gen.logprobs, atol=1e-5), (
        "π_old must be the distribution sampled from"
    )
    with torch.no_grad():
        at_one = generation_logprobs(policy, batch.gen)  # the same tokens at temperature 1
    assert not torch.allclose(batch.old_logp, at_one, atol=1e-3), (
        "temperature 0.7 must change the log-probs"
    )


def test_old_logp_false_leaves_it_none_and_changes_nothing_else(tiny_pretrained):
    with_old, _, _, _ = rollout(tiny_pretrained, seed=4)
    without, _, _, _ = rollout(tiny_pretrained, seed=4, old_logp=False, keep_ref_logits=False)
    assert without.old_logp is None and without.ref_logits is None
    assert with_old.old_logp is not None and with_old.ref_logits is not None
    assert torch.equal(without.gen.ids, with_old.gen.ids) and torch.equal(
        without.rewards, with_old.rewards
    )
    assert torch.equal(without.ref_logp, with_old.ref_logp)


@pytest.mark.parametrize("training", [True, False])
def test_collect_restores_the_policy_mode_and_scores_cut_off_rows_as_asked(
    tiny_pretrained, training
):
    policy, ref, tok = models(tiny_pretrained)
    policy.train(training)
    batch = collect(
        policy,
        ref,
        tok,
        PROMPTS,
        G,
        Reward("by_prompt", by_prompt),
        torch.Generator().manual_seed(2),
        max_new_tokens=7,
        unfinished_reward=-5.0,
    )
    assert policy.training is training
    fin = batch.gen.finished
    assert (~fin).any() and (batch.rewards[~fin] == -5.0).all()
    assert all(
        batch.rewards[i].item() == by_prompt(batch.prompts[i], batch.completions[i])
        for i in range(len(fin))
        if fin[i]
    )
