"""Properties of minigrpo/rl/preserve.py, the preservation anchor (on by default in every RL run).

The oracle is exact enumeration: a tiny GPT over a 5-token vocabulary (BOS, EOS, PAD, "a", "b") with
at most 3 new tokens has only 85 possible completions per prompt, so the sequence-level
KL(π_ref‖π_θ) can be summed over all of them and compared with the anchor loss's expectation under
π_ref."""

import copy
import itertools
import math

import pytest
import torch
from conftest import perturbed

from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.lm.model import GPT, GPTConfig, positions
from minigrpo.lm.sampling import Generation, encode_prompts
from minigrpo.lm.tokenizer import EOS_ID, PAD_ID, CharTokenizer
from minigrpo.objectives.kl import exact
from minigrpo.objectives.losses import entropy
from minigrpo.rl.preserve import (
    Anchor,
    anchor_loss,
    build_anchor,
    build_anchor_tree,
    forced_state_anchor,
    make_anchor,
)

TOK = CharTokenizer("ab")  # vocabulary 5: BOS, EOS, PAD, a, b
PROMPTS = ["a", "ba"]  # two lengths: build_anchor left-pads
MAX_NEW = 3


def tiny_gpt(seed: int = 2) -> GPT:
    """A 1-layer GPT whose next-token distributions are far from uniform (embeddings with std 0.3).
    With seed 2 it ends early often: P(completion length 1, 2, 3) = 0.38, 0.24, 0.38 after "a"."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=TOK.vocab_size, block_size=8, n_layer=1, n_head=1, n_embd=8))
    with torch.no_grad():
        model.wte.weight.normal_(0.0, 0.3)
        model.wpe.weight.normal_(0.0, 0.3)
    return model.eval()


def all_completions(prompt: str, max_new: int) -> Generation:
    """Every completion sampling could produce after `prompt`: any tokens up to the first EOS, or
    max_new tokens without one, laid out exactly as `generate` lays out its output."""
    V = TOK.vocab_size
    seqs = []
    for k in range(1, max_new + 1):
        for body in itertools.product([v for v in range(V) if v != EOS_ID], repeat=k - 1):
            seqs.append(list(body) + [EOS_ID])
            if k == max_new:
                seqs += [list(body) + [v] for v in range(V) if v != EOS_ID]
    head = TOK.encode(prompt, bos=True)
    P, M = len(head), len(seqs)
    ids = torch.full((M, P + max_new), PAD_ID, dtype=torch.long)
    ids[:, :P] = torch.tensor(head)
    comp_mask = torch.zeros(M, max_new, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, P : P + len(s)] = torch.tensor(s)
        comp_mask[i, : len(s)] = True
    key_mask = torch.cat([torch.ones(M, P, dtype=torch.bool), comp_mask], 1)
    finished = (ids[:, P:] == EOS_ID).any(1)
    return Generation(ids, key_mask, P, comp_mask, torch.zeros(M, max_new), finished)


def sequence_logp(model: GPT, gen: Generation) -> torch.Tensor:
    """log π(whole completion | prompt), (M,)."""
    with torch.no_grad():
        return generation_logprobs(model, gen).sum(1).double()


def exact_anchor(ref: GPT, gen: Generation) -> Anchor:
    with torch.no_grad():
        _, ref_logits = generation_logprobs(ref, gen, return_logits=True)
    m = gen.ids.size(0)
    return Anchor(gen, ref_logits, torch.full((m,), 1 / m), torch.zeros(m, dtype=torch.long))


def sequence_kl(ref: GPT, policy: GPT, prompts=PROMPTS, max_new=MAX_NEW) -> float:
    """Mean over the prompts of KL(π_ref‖π_θ) over whole completions, by enumeration."""
    total = 0.0
    for prompt in prompts:
        gen = all_completions(prompt, max_new)
        lr, lp = sequence_logp(ref, gen), sequence_logp(policy, gen)
        assert abs(lr.exp().sum().item() - 1) < 1e-5, "the enumeration must cover every completion"
        total += (lr.exp() * (lr - lp)).sum().item()
    return total / len(prompts)


def test_the_enumeration_is_every_completion_and_sums_to_one():
    gen = all_completions("a", MAX_NEW)
    assert gen.ids.size(0) == 1 + 4 + 4 * 4 * 5  # EOS at 1, at 2, or 3 tokens (the third anything)
    assert len({tuple(r) for r in gen.ids.tolist()}) == gen.ids.size(0)
    for model in (tiny_gpt(), perturbed(tiny_gpt(), 0.1, seed=1)):
        assert abs(sequence_logp(model, gen).exp().sum().item() - 1) < 1e-5


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_anchor_loss_is_exactly_zero_when_the_policy_is_the_reference(direction):
    ref = tiny_gpt()
    anchor = build_anchor(
        ref,
        TOK,
        PROMPTS,
        per_prompt=16,
        max_new_tokens=MAX_NEW,
        generator=torch.Generator().manual_seed(0),
    )
    policy = copy.deepcopy(ref).train()
    rows = torch.arange(anchor.gen.ids.size(0))
    loss = anchor_loss(policy, anchor, rows, direction)
    assert loss.item() == 0.0, f"{direction}: π_θ = π_ref must give exactly 0, got {loss.item()}"
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])
    assert grad.abs().max() < 1e-6, (
        "at π_θ = π_ref the KL is at its minimum: its gradient must vanish"
    )
    # a subset of the rows gives 0 too (the rows' reference logits are indexed, not recomputed)
    assert anchor_loss(policy, anchor, rows[3::4], direction).item() == 0.0


def test_expectation_under_the_reference_equals_the_sequence_kl_by_enumeration():
    """E_{x~π_ref}[Σ_t KL(π_ref(·|x_<t) ‖ π_θ(·|x_<t))] = KL(π_ref‖π_θ) over whole completions
    (chain rule), with every completion weighted by its exact π_ref probability."""
    ref = tiny_gpt()
    policy = perturbed(ref, 0.1, seed=1)
    for prompt in PROMPTS:
        gen = all_completions(prompt, MAX_NEW)
        anchor = exact_anchor(ref, gen)
        lr, lp = sequence_logp(ref, gen), sequence_logp(policy, gen)
        with torch.no_grad():
            per_row = torch.tensor(
                [
                    anchor_loss(policy, anchor, torch.tensor([i])).item()
                    for i in range(gen.ids.size(0))
                ],
                dtype=torch.float64,
            )
        expectation = (lr.exp() * per_row).sum().item()
        want = (lr.exp() * (lr - lp)).sum().item()
        assert want > 0.05, "the test needs a policy measurably away from the reference"
        assert abs(expectation - want) < 1e-5 * max(1.0, want), (
            f"{prompt!r}: E_ref[anchor loss] {expectation:.7f} != sequence KL(π_ref‖π_θ) {want:.7f}"
        )
        # the anchor loss over several rows is their mean
        rows = torch.tensor([0, 5, 17, 40])
        with torch.no_grad():
            assert (
                abs(anchor_loss(policy, anchor, rows).item() - per_row[rows].mean().item()) < 1e-6
            )


def test_the_tree_anchor_is_the_sequence_kl_itself_and_its_rows_are_the_likely_completions():
    """build_anchor_tree keeps every completion with π_ref >= min_prob, weighted by its probability:
    with min_prob below every completion's, it enumerates them all and the anchor loss over its rows
    IS the prompt-averaged sequence KL(π_ref‖π_θ), with no sampling error."""
    ref = tiny_gpt()
    policy = perturbed(ref, 0.1, seed=1)
    tree = build_anchor_tree(ref, TOK, PROMPTS, 10_000, MAX_NEW, min_prob=1e-12)
    every = sum(all_completions(p, MAX_NEW).ids.size(0) for p in PROMPTS)
    assert tree.gen.ids.size(0) == every, "min_prob below every completion's must keep all of them"
    assert torch.equal(
        tree.group, torch.arange(len(PROMPTS)).repeat_interleave(every // len(PROMPTS))
    )
    assert abs(tree.weights.sum().item() - 1) < 1e-6
    with torch.no_grad():
        loss = anchor_loss(policy, tree, torch.arange(tree.gen.ids.size(0))).item()
    want = sequence_kl(ref, policy)
    assert abs(loss - want) < 1e-5 * max(1.0, want), (
        f"tree anchor {loss:.7f} != sequence KL {want:.7f}"
    )
    likely = build_anchor_tree(ref, TOK, PROMPTS, 10_000, MAX_NEW, min_prob=0.01)
    probs = sequence_logp(ref, likely.gen).exp()
    assert (probs >= 0.01 - 1e-6).all() and likely.gen.ids.size(0) < every, (
        "only completions >= min_prob stay"
    )
    with torch.no_grad():
        assert anchor_loss(ref, likely, torch.arange(likely.gen.ids.size(0))).item() == 0.0
    capped = build_anchor_tree(ref, TOK, PROMPTS, 3, MAX_NEW, min_prob=1e-12)
    assert torch.equal(torch.bincount(capped.group), torch.tensor([3] * len(PROMPTS))), (
        "at most per_prompt rows"
    )
    kept = sequence_logp(ref, capped.gen).exp().view(len(PROMPTS), 3)
    for i, prompt in enumerate(PROMPTS):  # the most likely ones
        every_p = (
            sequence_logp(ref, all_completions(prompt, MAX_NEW)).exp().sort(descending=True).values
        )
        assert torch.allclose(kept[i].sort(descending=True).values, every_p[:3].double(), atol=1e-6)


def test_anchor_built_from_reference_samples_estimates_the_sequence_kl_within_its_standard_error():
    """build_anchor samples from π_ref: the anchor loss over its rows is a Monte Carlo estimate of
    the (prompt-averaged) sequence KL, within 4 standard errors."""
    ref = tiny_gpt()
    policy = perturbed(ref, 0.1, seed=1)
    per_prompt = 2000
    anchor = build_anchor(ref, TOK, PROMPTS, per_prompt, MAX_NEW, torch.Generator().manual_seed(1))
    M = anchor.gen.ids.size(0)
    assert M == per_prompt * len(PROMPTS)
    ids, mask = encode_prompts(TOK, [p for p in PROMPTS for _ in range(per_prompt)])
    P = anchor.gen.prompt_len
    assert torch.equal(anchor.gen.ids[:, :P], ids) and torch.equal(
        anchor.gen.key_mask[:, :P], mask
    ), "rows must be the prompts, each repeated per_prompt times, in order"
    # the rows are π_ref's samples: completion lengths and first tokens at their exact frequencies
    # (z < 4.5)
    for j, prompt in enumerate(PROMPTS):
        sampled = anchor.gen.select(torch.arange(j * per_prompt, (j + 1) * per_prompt))
        every = all_completions(prompt, MAX_NEW)
        p = sequence_logp(ref, every).exp()
        for feature in (lambda g: g.completion_mask.sum(1), lambda g: g.completion_ids[:, 0]):
            for value in feature(every).unique().tolist():
                want = p[feature(every) == value].sum().item()
                freq = (feature(sampled) == value).double().mean().item()
                se = math.sqrt(max(want * (1 - want), 1e-12) / per_prompt)
                assert abs(freq - want) < 4.5 * se + 1e-9, (
                    f"{prompt!r}: frequency {freq:.3f} vs π_ref {want:.3f}"
                )
    with torch.no_grad():  # 40 disjoint batches of 100 rows: their means give the standard error
        order = torch.randperm(M, generator=torch.Generator().manual_seed(2))
        means = torch.tensor(
            [anchor_loss(policy, anchor, rows).item() for rows in order.chunk(40)],
            dtype=torch.float64,
        )
    estimate, se = means.mean().item(), means.std().item() / math.sqrt(len(means))
    want = sequence_kl(ref, policy)
    assert abs(estimate - want) < 4 * se, (
        f"anchor loss {estimate:.4f} ± {se:.4f} vs exact sequence KL {want:.4f}"
    )
    # the stored reference logits are π_ref's own at each completion position
    with torch.no_grad():
        _, logits = generation_logprobs(ref, anchor.gen, return_logits=True)
    assert torch.allclose(anchor.ref_logits, logits, atol=1e-5)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_one_small_gradient_step_moves_the_policy_towards_the_reference(direction):
    ref = tiny_gpt()
    policy = perturbed(ref, 0.1, seed=1).train()
    anchor = build_anchor(ref, TOK, PROMPTS, 200, MAX_NEW, torch.Generator().manual_seed(3))
    rows = torch.arange(anchor.gen.ids.size(0))
    kl_before = sequence_kl(ref, policy)
    loss = anchor_loss(policy, anchor, rows, direction)
    opt = torch.optim.SGD(policy.parameters(), lr=0.05)
    opt.zero_grad()
    loss.backward()
    assert sum(p.grad.abs().sum().item() for p in policy.parameters() if p.grad is not None) > 0
    opt.step()
    with torch.no_grad():
        loss_after = anchor_loss(policy, anchor, rows, direction).item()
    kl_after = sequence_kl(ref, policy)
    assert loss_after < loss.item(), (
        f"{direction}: the anchor loss rose after a step on it: {loss.item()} -> {loss_after}"
    )
    assert kl_after < kl_before, (
        f"{direction}: the exact KL to π_ref rose: {kl_before} -> {kl_after}"
    )


def model_logits(model: GPT, gen: Generation) -> torch.Tensor:
    """(M, T, V) logits predicting each completion token, from the model's plain forward pass."""
    P = gen.prompt_len
    # slot s predicts slot s+1
    logits = model(gen.ids, pos=positions(gen.key_mask), key_mask=gen.key_mask)
    return logits[:, P - 1 : -1]


def test_positions_after_the_end_token_contribute_nothing():
    ref = tiny_gpt()
    policy = perturbed(ref, 0.1, seed=1).train()
    anchor = build_anchor(ref, TOK, PROMPTS, 32, 6, torch.Generator().manual_seed(4))
    mask = anchor.gen.completion_mask
    assert (~mask).any() and mask.all(1).any(), (
        "the test needs rows that ended early and rows that did not"
    )
    rows = torch.arange(mask.size(0))
    with torch.no_grad():
        per_pos = exact(anchor.ref_logits, model_logits(policy, anchor.gen))  # (M, T)
    assert per_pos[~mask].max() > 1e-3, (
        "the KL after EOS must be non-zero, or the test could not fail"
    )
    # hand computation: Σ over the valid positions only, then the mean over rows
    want = sum(
        per_pos[i, t].item() for i in range(mask.size(0)) for t in range(mask.size(1)) if mask[i, t]
    ) / mask.size(0)
    loss = anchor_loss(policy, anchor, rows)
    assert abs(loss.item() - want) < 1e-5, (
        f"anchor loss {loss.item()} != Σ over valid positions {want}"
    )
    loss.backward()
    clean_grad = [p.grad.clone() for p in policy.parameters()]
    # garbage after the end: other tokens in the padded slots and extreme reference logits there
    dirty = Anchor(
        copy.deepcopy(anchor.gen), anchor.ref_logits.clone(), anchor.weights, anchor.group
    )
    comp = dirty.gen.ids[:, dirty.gen.prompt_len :]
    comp[~mask] = torch.randint(
        0, TOK.vocab_size, (int((~mask).sum()),), generator=torch.Generator().manual_seed(5)
    )
    junk = (
        torch.tensor([1e4, -1e4])
        .repeat(dirty.ref_logits.numel())[: dirty.ref_logits.numel()]
        .view_as(dirty.ref_logits)
    )
    dirty.ref_logits = torch.where(mask[..., None], dirty.ref_logits, junk)
    policy.zero_grad()
    dirty_loss = anchor_loss(policy, dirty, rows)
    dirty_loss.backward()
    assert abs(dirty_loss.item() - loss.item()) < 1e-6, "what follows EOS changed the anchor loss"
    for g0, p in zip(clean_grad, policy.parameters()):
        assert torch.isfinite(p.grad).all() and torch.allclose(g0, p.grad, atol=1e-6), (
            "what follows EOS reached the gradient"
        )


def test_reverse_direction_is_the_policy_to_reference_kl_at_each_position():
    ref = tiny_gpt()
    policy = perturbed(ref, 0.1, seed=1)
    anchor = build_anchor(ref, TOK, PROMPTS, 8, MAX_NEW, torch.Generator().manual_seed(6))
    rows = torch.tensor([1, 2, 9, 14])
    with torch.no_grad():
        logits = model_logits(policy, anchor.gen)
        got = anchor_loss(policy, anchor, rows, "reverse").item()
    want = 0.0
    for i in rows.tolist():
        for t in range(anchor.gen.completion_mask.size(1)):
            if anchor.gen.completion_mask[i, t]:
                q, r = (
                    logits[i, t].double().softmax(-1),
                    anchor.ref_logits[i, t].double().softmax(-1),
                )
                want += sum(
                    q[v].item() * math.log(q[v].item() / r[v].item()) for v in range(TOK.vocab_size)
                )
    want /= len(rows)
    assert abs(got - want) < 1e-5, f"reverse anchor loss {got} != mean Σ_t KL(π_θ‖π_ref) {want}"
    assert abs(anchor_loss(policy, anchor, rows, "forward").item() - got) > 1e-4, (
        "the two directions must differ here"
    )


def test_state_dict_round_trips_through_a_safe_torch_load(tmp_path):
    ref = tiny_gpt()
    anchor = build_anchor(ref, TOK, PROMPTS, 8, 5, torch.Generator().manual_seed(7))
    torch.save(anchor.state_dict(), tmp_path / "anchor.pt")
    back = Anchor.from_state_dict(
        torch.load(tmp_path / "anchor.pt", weights_only=True), torch.device("cpu")
    )
    a, b = anchor.gen, back.gen
    assert b.prompt_len == a.prompt_len
    for name in ("ids", "key_mask", "completion_mask", "logprobs", "finished"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), f"{name} changed in the round trip"
    assert torch.equal(anchor.ref_logits, back.ref_logits)
    policy = perturbed(ref, 0.1, seed=1)
    rows = torch.tensor([0, 3, 8, 15])
    with torch.no_grad():
        assert anchor_loss(policy, anchor, rows).item() == anchor_loss(policy, back, rows).item()


def test_the_rl_prompts_forced_states_count_only_where_the_reference_was_sure_and_weigh_as_given():
    """forced_state_anchor: the off-target prompt ("a", group 0) keeps every position and weight 1;
    the RL prompt's rows ("ba", group −1) count only where H(π_ref) < h, and weigh `weight`
    together; the loss is then the weighted sum of the exact per-position KLs over exactly those
    positions."""
    ref, policy = tiny_gpt(), perturbed(tiny_gpt(), 0.2, seed=3)
    tree = build_anchor_tree(ref, TOK, PROMPTS, 10_000, MAX_NEW, min_prob=1e-12)
    # half the positions
    h = entropy(tree.ref_logits).masked_select(tree.gen.completion_mask).median().item()
    a = forced_state_anchor(tree, 1, h, 0.5)
    own = tree.group == 1
    assert torch.equal(a.group, torch.where(own, -1, 0))
    assert (
        abs(a.weights[~own].sum().item() - 1) < 1e-6
        and abs(a.weights[own].sum().item() - 0.5) < 1e-6
    )
    assert torch.equal(a.kl_mask[~own], tree.gen.completion_mask[~own])
    sure = tree.gen.completion_mask & (entropy(tree.ref_logits) < h)
    assert (
        torch.equal(a.kl_mask[own], sure[own])
        and 0 < sure[own].sum() < tree.gen.completion_mask[own].sum()
    )
    rows = torch.arange(a.gen.ids.size(0))
    with torch.no_grad():
        _, logits = generation_logprobs(policy, a.gen, return_logits=True)
        kl = torch.where(a.kl_mask, exact(a.ref_logits, logits), 0.0).sum(1)
        want = (kl * a.weights).sum() / a.weights.sum()
        assert torch.allclose(anchor_loss(policy, a, rows), want, atol=1e-6)
        assert anchor_loss(ref, a, rows).item() == 0.0
    # h = ∞: the RL prompt is one more person
    everywhere = forced_state_anchor(tree, 1, math.inf, 1.0)
    with torch.no_grad():
        assert torch.allclose(
            anchor_loss(policy, everywhere, rows), anchor_loss(policy, tree, rows), atol=1e-6
        )


def test_make_anchor_follows_the_flags(tmp_path):
    from types import SimpleNamespace

    ref = tiny_gpt()
    cfg = lambda **kw: SimpleNamespace(
        **{
            **dict(
                preserve_anchor="tree",
                preserve_per_prompt=100,
                max_new_tokens=MAX_NEW,
                preserve_forced=0.1,
                preserve_forced_weight=1.0,
            ),
            **kw,
        }
    )
    g = torch.Generator().manual_seed(0)
    assert make_anchor(ref, TOK, [], ["ba"], cfg(), g) is None, "no off-target prompt: no anchor"
    plain = make_anchor(ref, TOK, ["a"], ["ba"], cfg(preserve_forced=0.0), g)
    assert plain.kl_mask is None and torch.equal(plain.group.unique(), torch.tensor([0]))
    forced = make_anchor(ref, TOK, ["a"], ["ba"], cfg(), g)
    assert set(forced.group.tolist()) == {0, -1} and forced.kl_mask is not None
    sampled = make_anchor(ref, TOK, ["a"], ["ba"], cfg(preserve_anchor="sampled"), g)
    assert sampled.kl_mask is None and sampled.gen.ids.size(0) == 100, (
        "the sampled anchor has no forced rows"
    )
    torch.save(forced.state_dict(), tmp_path / "a.pt")
    back = Anchor.from_state_dict(
        torch.load(tmp_path / "a.pt", weights_only=True), torch.device("cpu")
    )
    assert torch.equal(back.kl_mask, forced.kl_mask) and torch.equal(back.group, forced.group)


def test_an_anchors_host_state_is_made_once():
    """Anchor.host_state (a checkpoint's): its state_dict's values on the host, copied once however
    many checkpoints (or lockstep members, who share their first member's anchor) ask."""
    torch.manual_seed(0)
    ref = GPT(
        GPTConfig(vocab_size=TOK.vocab_size, block_size=16, n_layer=1, n_head=1, n_embd=8)
    ).eval()
    anchor = exact_anchor(ref, all_completions("a", 2))
    first = anchor.host_state()
    assert anchor.host_state() is first, "made once"
    state = anchor.state_dict()
    assert list(first) == list(state)
    assert all(
        torch.equal(first[k], v) if torch.is_tensor(v) else first[k] == v for k, v in state.items()
    )
