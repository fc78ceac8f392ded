"""The oracle critic's values: the exact value of every completion prefix under a policy, for one
model or many at once (rl/critics.OracleCritic: one; P models' stacked weights: many).

In a world whose completions are enumerable (food: the 12 foods; arithmetic: the 12 declared answers
of each prompt, `support(prompt)`), the states "prompt x, then the prefix s" of the support form a
tree, and the value of PPO's return r − β·Σ_t k1_t, k1_t = log π(c_t) − log π_ref(c_t), is its
backward recursion from the leaves up,

    V(s) = Σ_{c: s + c on the tree} π(c | x + s)·(V(s + c) − β·k1(c))
           + (1 − Σ_{c: s + c on the tree} π(c | x + s))·r_off(x),     V(s + EOS) = r(x, s);

a state off the tree (a prefix that left the support, or a line that ended) is worth r_off(x). One
teacher-forced forward of π (and of π_ref where β > 0) over (x + y + EOS) for every support
completion y gives every π(c | x + s) on the tree. At β = 0 it is the expected task reward,
Σ_y π(y + EOS | x + s)·r(x, y) + (1 − Σ_y …)·r_off(x).

Exact where the reward is constant off the support (every food reward: 0 for pizza and food:<food>,
−1 for graded; the run's `RewardTable.off_constant` says whether its probes agreed). Elsewhere r_off
is the lowest probed off-support reward and V is a lower bound. With β > 0 the penalty of a
continuation after it leaves the tree is not counted (that mass is the malformed mass, ~1e-3 for a
pretrained model). Without the penalty the values would miss the return's expected KL remainder,
which grows with the characters still to come: after whitening, that position-dependent offset
pushes down the tokens of every sampled completion, even at the optimum.

Source: the exact value of a prefix is what VinePPO (Kazemnejad et al. 2410.01679) estimates by
Monte Carlo rollouts from each intermediate state; here enumeration makes it exact.

    tree = ValueTree(tok, prompts, support, tables, device)  # once: every prompt's support
                                                             # completions, as a tree; tables: one
                                                             # RewardTable for every model, or one
                                                             # each
    tree.ids, tree.key_mask                                  # (M, W) left-padded BOS + prompt +
                                                             # completion + EOS
    V = tree.values(logp, ref_logp, beta)    # logp, ref_logp (P, M, W − 1): P models' next-token
                                             # log-probs of those rows (π's, π_ref's; ref_logp None:
                                             # β's term 0); beta (P,) -> (P, nodes) float64:
                                             # V(prefix) of every node of the tree
    v = tree.prefix_values(V, prompt_index, completion_ids, mask)   # (P, N) which prompt, (P, N, T)
                                                                    # -> (P, N, T)

The recursion runs as tensor operations, every model's in one pass: the nodes of one depth at a
time; each rollout row's prefixes are found by walking the tree token by token. The model's forward
is the caller's (one GPT, or P models' stacked weights). Tests: tests/test_oracle.py checks the
values against one step of the policy, the exact expected reward and Monte Carlo;
tests/test_value_tree.py holds them to the slow oracle (tests/oracle_values.py: the same recursion
in Python, model by model, prefixes as strings), to rounding (the sums over a node's children are
taken in another order).
"""

from __future__ import annotations

import torch

from minigrpo.lm.logprobs import pad_left
from minigrpo.lm.tokenizer import CharTokenizer
from toy_tasks.support import RewardTable


class ValueTree:
    def __init__(
        self,
        tok: CharTokenizer,
        prompts: list[str],
        support,
        tables: RewardTable | list[RewardTable],
        device=None,
    ):
        """tables: the reward of every model (models that share one reward), or a list of one per
        model, in the order of `values`' models (models whose rewards differ)."""
        tables = [tables] if isinstance(tables, RewardTable) else tables
        pairs = [
            (i, k, x, tok.encode(y))
            for i, x in enumerate(prompts)
            for k, y in enumerate(support(x))
        ]
        self.ids, self.key_mask = pad_left(
            [tok.encode(x, bos=True) + y + [tok.eos_id] for _, _, x, y in pairs], tok.pad_id, device
        )
        width = self.ids.size(1) - 1  # logp's columns: target j is token j + 1
        # (prompt, the prefix's ids[, "end"]) -> node; each node's depth, prompt
        nodes, depth, prompt = {}, [], []
        leaf_value, edges, moves = {}, {}, []

        def node(key: tuple, d: int, i: int) -> int:
            if key not in nodes:
                nodes[key] = len(nodes)
                depth.append(d)
                prompt.append(i)
            return nodes[key]

        self.roots = torch.tensor([node((i, ()), 0, i) for i in range(len(prompts))], device=device)
        for n, (i, k, _, y) in enumerate(pairs):
            # the completion and EOS: the last len(y) + 1 targets
            parent, first = nodes[(i, ())], width - (len(y) + 1)
            # from the state y[:t] to y[:t + 1], or to the end (EOS) at t = len(y)
            for t in range(len(y) + 1):
                child = (
                    node((i, tuple(y[: t + 1])), t + 1, i)
                    if t < len(y)
                    else node((i, tuple(y), "end"), t + 1, i)
                )
                # the first row to reach it
                edges.setdefault((parent, child), n * width + first + t)
                if t < len(y):
                    moves.append((parent, y[t], child))
                parent = child
            leaf_value[parent] = (i, k)  # the line ended: its reward
        as_tensor = lambda x, dtype=torch.long: torch.tensor(x, dtype=dtype, device=device)
        # (models or 1, nodes): each node's r_off (its prompt's), each leaf's reward (0 elsewhere),
        # per table
        self.r_off = torch.stack([t.off_support[prompt] for t in tables]).to(device)
        leaves, (i, k) = list(leaf_value), zip(*leaf_value.values())
        self.leaf_value = torch.zeros(len(tables), len(nodes), dtype=torch.float64, device=device)
        self.leaf_value[:, leaves] = torch.stack([t.support[list(i), list(k)] for t in tables]).to(
            device
        )
        depth, (parent, child, col) = (
            as_tensor(depth),
            (as_tensor(x) for x in zip(*[(p, c, j) for (p, c), j in edges.items()])),
        )
        # per depth, deepest first: its edges (parent, child, log-prob column) and its parents
        self.levels = []
        for d in range(int(depth.max()) - 1, -1, -1):
            here = depth[parent] == d
            self.levels.append((parent[here], child[here], col[here], torch.unique(parent[here])))
        self.moves = torch.full(
            (len(nodes), max(tok.vocab_size, int(self.ids.max()) + 1)),
            -1,
            dtype=torch.long,
            # node, token -> the child on the tree, −1 off it (or the line's
            # end)
            device=device,
        )
        for p, token, c in moves:
            self.moves[p, token] = c

    def values(
        self, logp: torch.Tensor, ref_logp: torch.Tensor | None, beta: torch.Tensor
    ) -> torch.Tensor:
        """Every node's V under each of P models -> (P, nodes) float64 (module docstring)."""
        lp = logp.double().flatten(1)  # (P, M·(W − 1))
        lr = lp if ref_logp is None else ref_logp.double().flatten(1)
        V = self.leaf_value.expand(lp.size(0), -1).clone()
        for parent, child, col, at in self.levels:
            p = lp[:, col].exp()  # π(c | x + s) of each edge out of this depth
            kl = beta.double()[:, None] * (lp[:, col] - lr[:, col])
            flow = torch.zeros_like(V).index_add_(1, parent, p * (V[:, child] - kl))
            mass = torch.zeros_like(V).index_add_(1, parent, p)
            V[:, at] = flow[:, at] + (1 - mass[:, at]) * self.r_off[:, at]
        return V

    def prefix_values(
        self,
        V: torch.Tensor,
        prompt_index: torch.Tensor,
        completion_ids: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """V (P, nodes); prompt_index (P, N) each row's prompt (its index in `prompts`);
        completion_ids (P, N, T), mask (P, N, T) bool -> (P, N, T) float32: entry t = V of the state
        before completion token t (the row's first t tokens), r_off off the tree, 0 where masked
        (PPO's critics' layout)."""
        state, at = self.roots[prompt_index], []
        for t in range(completion_ids.size(-1)):
            at.append(state)
            state = torch.where(
                state >= 0, self.moves[state.clamp(min=0), completion_ids[..., t]], -1
            )
        at = torch.stack(at, -1)  # (P, N, T) node, −1 off the tree
        P = V.size(0)
        on = V.gather(1, at.clamp(min=0).view(P, -1)).view(at.shape)
        # a prompt's nodes: its r_off
        off = self.r_off.expand(P, -1).gather(1, self.roots[prompt_index])[..., None]
        return torch.where(mask & (at >= 0), on, torch.where(mask, off, 0.0)).float()
