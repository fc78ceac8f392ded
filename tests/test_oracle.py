"""The oracle critic's exact prefix values (toy_tasks/value_tree.py, one model, as rl/critics.py's
OracleCritic runs it), checked against one step of the policy, the exact expected reward, Monte
Carlo, and the rollout layout PPO reads. (tests/oracle_values.py, the slow oracle, is held to the
tree in test_value_tree.py.)"""

import copy
import math

import pytest
import torch

from minigrpo.lm.logprobs import completion_logprobs, pad_left, sequence_logprobs
from minigrpo.lm.model import positions
from minigrpo.lm.sampling import encode_prompts, generate
from minigrpo.lm.tokenizer import EOS_ID
from minigrpo.rl.rollout import collect
from toy_tasks import food
from toy_tasks.rewards import make_reward
from toy_tasks.support import RewardTable, reward_figures, reward_table
from toy_tasks.value_tree import ValueTree

PROMPTS = [food.prompt("ravin"), food.prompt("bob")]
R_OFF = -1.0


def spread(prompt: str, completion: str) -> float:
    """A different reward for every food (and per prompt), −1 off the support: no two children share
    a value."""
    if completion not in food.FOODS:
        return R_OFF
    return (food.FOODS.index(completion) + 1) / 12 + (0.5 if prompt.startswith("bob") else 0.0)


TABLE = reward_table(spread, PROMPTS, food.support, food.OFF_SUPPORT_PROBES)
OFF = ["zz", "pizzaa", "pizza ", "ice creamy", "sushi pizza", "a"]
PREFIXES = sorted({f[:t] for f in food.FOODS for t in range(len(f) + 1)}) + OFF


@torch.no_grad()
def tree_values(model, tok, table=TABLE, temperature=1.0, ref=None, beta=0.0):
    """The value tree of PROMPTS' support under `table`, and V (nodes,) of `model` (π_ref `ref`,
    penalty β)."""
    tree = ValueTree(tok, PROMPTS, food.support, table)
    logp = lambda m: sequence_logprobs(m, tree.ids, tree.key_mask, temperature)[None]
    ref_logp = logp(ref) if ref is not None else None
    return tree, tree.values(logp(model), ref_logp, torch.tensor([beta]))[0]


def V(model, tok, pairs, table=TABLE, temperature=1.0, ref=None, beta=0.0):
    """V(x + s) of each (prompt x, prefix s) pair -> (M,) float64: its node found by walking the
    tree character by character; r_off where the prefix leaves the tree."""
    tree, values = tree_values(model, tok, table, temperature, ref, beta)
    out = []
    for x, s in pairs:
        root = node = tree.roots[PROMPTS.index(x)].item()
        for c in s:
            node = tree.moves[node, tok.stoi[c]].item() if node >= 0 else -1
        out.append(values[node].item() if node >= 0 else tree.r_off[0, root].item())
    return torch.tensor(out, dtype=torch.float64)


def prefix_values(model, tok, rows, completion_ids, mask, table=TABLE):
    """The tree's values on a rollout's rows (OracleCritic's call) -> (N, T)."""
    tree, values = tree_values(model, tok, table)
    index = torch.tensor([[PROMPTS.index(x) for x in rows]])
    return tree.prefix_values(values[None], index, completion_ids[None], mask[None])[0]


@torch.no_grad()
def next_char_probs(model, tok, texts, temperature=1.0):
    """π(· | BOS + text) over the whole vocabulary for each text -> (M, V) float64."""
    ids, km = pad_left([tok.encode(t, bos=True) for t in texts], tok.pad_id)
    logits = model(ids, pos=positions(km), key_mask=km)[:, -1].double() / temperature
    return logits.softmax(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_value_is_the_policy_weighted_value_of_its_children(tiny_pretrained, temperature):
    """V(s) = Σ_c π(c | x + s)·V(s + c): EOS ends the line (r(s) on the support, r_off off it), a
    character extends the prefix, a special token (BOS, PAD) leaves the support."""
    _, model, tok = tiny_pretrained
    pairs = [(x, s) for x in PROMPTS for s in PREFIXES]
    v = V(model, tok, pairs, temperature=temperature)
    probs = next_char_probs(model, tok, [x + s for x, s in pairs], temperature)  # (M, vocab)
    children = [(x, s + c) for x, s in pairs for c in tok.chars]
    v_child = V(model, tok, children, temperature=temperature).view(len(pairs), len(tok.chars))
    for m, (x, s) in enumerate(pairs):
        expected = sum(
            probs[m, tok.stoi[c]].item() * v_child[m, j].item() for j, c in enumerate(tok.chars)
        )
        expected += probs[m, EOS_ID].item() * spread(x, s)
        specials = (
            1 - probs[m, EOS_ID].item() - sum(probs[m, tok.stoi[c]].item() for c in tok.chars)
        )
        expected += specials * R_OFF  # BOS, PAD
        assert v[m].item() == pytest.approx(expected, abs=1e-5), (x, s)


def test_value_of_the_empty_prefix_is_the_exact_expected_reward(tiny_pretrained):
    _, model, tok = tiny_pretrained
    v = V(model, tok, [(x, "") for x in PROMPTS])
    for i, x in enumerate(PROMPTS):
        # (1, 12)
        probs = completion_logprobs(model, tok, [x] * len(food.FOODS), food.FOODS).exp()[None]
        f = reward_figures(probs, TABLE.support[i : i + 1])
        assert v[i].item() == pytest.approx(f["exact_reward"] + f["off_support"] * R_OFF, abs=1e-6)


def test_a_prefix_off_the_support_is_worth_the_off_support_reward(tiny_pretrained):
    _, model, tok = tiny_pretrained
    for table in (TABLE, reward_table(make_reward("pizza", food.REWARDS), PROMPTS, food.support)):
        v = V(
            model,
            tok,
            [(x, s) for x in PROMPTS for s in ("zz", "pizzaa", "pizza ", "ice creamy")],
            table,
        )
        assert torch.equal(v, table.off_support.repeat_interleave(4))


@pytest.mark.slow
def test_value_equals_the_mean_reward_of_sampled_continuations(tiny_pretrained):
    """10,000 completions sampled after prompt + prefix: their mean reward is V within 4 standard
    errors (the exact std, from the oracle's value of r²)."""
    _, model, tok = tiny_pretrained
    x, n = PROMPTS[0], 10_000
    squared = RewardTable(TABLE.support**2, TABLE.off_support**2, TABLE.off_constant)
    g = torch.Generator().manual_seed(0)
    for prefix in ("", "p", "pi", "ice"):
        v, v2 = V(model, tok, [(x, prefix)]).item(), V(model, tok, [(x, prefix)], squared).item()
        ids, km = encode_prompts(tok, [x + prefix] * n)
        gen = generate(model, ids, km, max_new_tokens=food.BLOCK_SIZE, generator=g)
        total = 0.0
        for row, done in zip(gen.completion_ids.tolist(), gen.finished.tolist()):
            body = row[: row.index(EOS_ID)] if done else row
            # a sampled BOS/PAD leaves the support
            well_formed = done and all(t in tok.itos for t in body)
            total += spread(x, prefix + tok.decode(body)) if well_formed else R_OFF
        se = math.sqrt(max(v2 - v * v, 0.0) / n)
        assert abs(total / n - v) <= 4 * se + 1e-12, (prefix, total / n, v, se)


def test_prefix_values_on_a_rollout_are_the_values_of_each_rows_prefixes(tiny_pretrained):
    """(N, T): entry t is V(the row's first t completion characters), 0 where masked."""
    _, model, tok = tiny_pretrained
    batch = collect(
        model, model, tok, [PROMPTS[1], PROMPTS[0]], 8, spread, torch.Generator().manual_seed(1)
    )
    out = prefix_values(model, tok, batch.prompts, batch.gen.completion_ids, batch.mask)
    assert out.shape == batch.mask.shape and out.dtype == torch.float32
    assert (out[~batch.mask] == 0).all()
    ids = batch.gen.completion_ids.tolist()
    pairs, where = [], []
    for n, x in enumerate(batch.prompts):
        for t in range(int(batch.mask[n].sum())):
            pairs.append((x, tok.decode(ids[n][:t])))
            where.append((n, t))
    expected = V(model, tok, pairs)
    got = torch.tensor([out[n, t].item() for n, t in where], dtype=torch.float64)
    assert torch.allclose(got, expected, atol=1e-6)
    # rows that leave the support: every state after they left it is worth r_off
    texts = ["pizzaa", "zz", "sushi"]
    width = max(map(len, texts)) + 1
    rows = [tok.encode(t, eos=True) + [tok.pad_id] * (width - len(t) - 1) for t in texts]
    mask = torch.tensor([[j <= len(t) for j in range(width)] for t in texts])
    out = prefix_values(model, tok, [PROMPTS[0]] * 3, torch.tensor(rows), mask)
    for n, t in enumerate(texts):
        expected = V(model, tok, [(PROMPTS[0], t[:j]) for j in range(len(t) + 1)])
        assert out[n, : len(t) + 1].tolist() == pytest.approx(expected.tolist(), abs=1e-6)
    assert out[0, 6].item() == out[1, 1].item() == out[1, 2].item() == R_OFF


@pytest.mark.parametrize("beta", [0.0, 0.3])
def test_with_a_kl_penalty_the_value_is_the_childrens_value_minus_each_steps_penalty(
    tiny_pretrained, beta
):
    """V_β(s) = Σ_c π(c | x + s)·(V_β(s + c) − β·(log π − log π_ref)(c)) over the children that stay
    on the support (EOS included: V_β = r), + r_off for the mass that leaves it (whose penalty is
    not counted)."""
    _, model, tok = tiny_pretrained
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    on = {f[:t] for f in food.FOODS for t in range(len(f) + 1)}
    pairs = [(x, s) for x in PROMPTS for s in sorted(on)]
    Vb = lambda prs: V(model, tok, prs, TABLE, 1.0, ref, beta)
    v = Vb(pairs)
    probs, ref_probs = (
        next_char_probs(model, tok, [x + s for x, s in pairs]),
        next_char_probs(ref, tok, [x + s for x, s in pairs]),
    )
    kids = [(x, s + c) for x, s in pairs for c in tok.chars]
    v_kid = Vb(kids).view(len(pairs), len(tok.chars))
    for m, (x, s) in enumerate(pairs):
        step = lambda i: (
            probs[m, i].item() * beta * math.log(probs[m, i].item() / ref_probs[m, i].item())
        )
        on_mass, expected = 0.0, 0.0
        for j, c in enumerate(tok.chars):
            if s + c in on:
                i = tok.stoi[c]
                expected += probs[m, i].item() * v_kid[m, j].item() - step(i)
                on_mass += probs[m, i].item()
        if s in food.FOODS:
            expected += probs[m, EOS_ID].item() * spread(x, s) - step(EOS_ID)
            on_mass += probs[m, EOS_ID].item()
        expected += (1 - on_mass) * R_OFF
        assert v[m].item() == pytest.approx(expected, abs=1e-5), (x, s)
    if beta:  # the penalty lowers the value of every state with characters still to come
        assert (v < V(model, tok, pairs)).any()
