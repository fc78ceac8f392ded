"""PPO's update for P members at once: the single run's own (ppo.PPO.figures, written over a leading
member dim), given the members as its run, their critics and their exact values; what is here is
what is about many members.

    update = LockstepPPO(cfg, anchor, algos)       # algos: each member's ppo.PPO (critic, β)
    figures = update(stack, ref, opt, step)        # step: the members' rollouts
                                                   # (population/rows.Rollouts)
    row = update.row(mine, algo)                   # member p's figures {name: float} -> its row's
                                                   # part (its PPO.row: its β adapted)

`Members` is PPO's run (rl/algorithm.py's two calls back): the anchor term of every member and one
backward, each member's own gradient clip and one AdamW step for all. `Critics` stacks the members'
learned critics (`separate`, `head`; trained by the population's optimiser after the policy:
`stacks`), their values rl/critics.head_values over the stacked weights. `ExactValues` is every
member's oracle at once (rl/critics.exact_values: one value tree for the members' rewards and
prompts). Each member shuffles its minibatches with its own generator, so they are its single run's
rows (their prefix trees built as one: Rollouts.minibatches). Each member's figures are its single
run's to float rounding (tests/test_lockstep.py).
"""

from __future__ import annotations

import torch

from minigrpo.lm.model import Weights
from minigrpo.lm.optim import AdamW
from minigrpo.population.anchor import MembersAnchor
from minigrpo.population.optim import clip_and_step
from minigrpo.population.rows import Rollouts
from minigrpo.population.stacked import Stack
from minigrpo.rl.critics import exact_values, head_values
from minigrpo.rl.report import packed, unpacked
from toy_tasks.support import reward_table
from toy_tasks.value_tree import ValueTree


class Members:
    """The members as PPO's run: their stacked policy and π_ref (set each step), their runs."""

    def __init__(self, cfg, anchor: MembersAnchor | None):
        self.cfg, self.anchor = cfg, anchor
        self.policy: Stack | None = None
        self.ref: Stack | None = None
        self.runs: list = []  # each member's rl/loop.Run

    def anchor_term(self) -> torch.Tensor | None:
        """(P,) --preserve-coef × each member's anchor loss (None when off)."""
        if self.anchor is None:
            return None
        return self.anchor.term(self.policy, self.ref, [r.anchor for r in self.runs])

    def clip_and_step(self, opt: AdamW, loss: torch.Tensor, params) -> torch.Tensor:
        """Run.clip_and_step of every member (population/optim.clip_and_step)."""
        return clip_and_step(opt, loss, self.cfg.grad_clip)


class Critics(Stack):
    """The members' learned critics (rl/critics.py), their weights stacked by name
    (Critic.named_weights: the heads' weights (P, 1, C) and biases (P, 1), then the separate
    critic's trunks), trainable: the single run's order of parameters. The head critic has no
    trunk: its values come from the policy's hidden states, and their gradient reaches the
    policy."""

    learned = True

    def __init__(self, critics: list, cfg, members: Members):
        named = [c.named_weights() for c in critics]
        stacked = {
            k: torch.stack([n[k] for n in named]).detach().requires_grad_() for k in named[0]
        }
        Weights.__init__(self, cfg, stacked)
        self.separate, self.members = critics[0].trunk is not None, members

    def values(self, batch: Rollouts, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Critic.values of each member -> (P, N, T), 0 where masked. hidden: the policy's states
        (P, N, T, C), the head critic's input where the caller has them (else the policy's
        forward); the separate critic's trunks make their own."""
        w, b = self.w["head.weight"], self.w["head.bias"]
        if self.separate:
            return head_values(w, b, batch.gen, trunk=self)
        return head_values(w, b, batch.gen, hidden, self.members.policy)


class ExactValues:
    """Each member's exact values under its policy now (rl/critics.OracleCritic), all at once:
    rl/critics.exact_values over the stacked weights (and π_ref's), under each member's reward (one
    tree for all where they share it), over every member's prompts (its --person's), at each
    member's β (`beta`, (P, 1, 1), set by PPO)."""

    learned = False
    beta: torch.Tensor

    def __init__(self, run, members: Members):
        self.run, self.members, self.trees = run, members, {}

    def parameters(self) -> list:
        return []

    def tree(self, runs: list) -> tuple[ValueTree, dict]:
        """The value tree of these members' rewards and prompts, and each prompt's place in it (made
        once for each set of members)."""
        specs, prompts = (
            [r.cfg.reward for r in runs],
            list(dict.fromkeys(x for r in runs for x in r.prompts)),
        )
        key = (specs[0] if len(set(specs)) == 1 else tuple(specs), tuple(prompts))
        if key not in self.trees:
            r = self.run
            alone = prompts == r.prompts  # else each member's reward on every member's prompts
            table = lambda x: (
                x.rewards
                if alone
                else reward_table(x.reward, prompts, x.task.support, x.task.OFF_SUPPORT_PROBES)
            )
            tables = [table(x) for x in runs] if isinstance(key[0], tuple) else table(runs[0])
            self.trees[key] = (
                ValueTree(r.tok, prompts, r.task.support, tables, r.device),
                {x: i for i, x in enumerate(prompts)},
            )
        return self.trees[key]

    @torch.no_grad()
    def values(self, step: Rollouts, hidden=None) -> torch.Tensor:
        """-> (P, N, T), 0 where masked (any value in a failed member's slot)."""
        rows, (tree, place) = step.rows, self.tree(step.runs)
        N = rows.ids.size(1)
        index = torch.tensor(
            [[place[x] for x in b.prompts] if b is not None else [0] * N for b in step.batches],
            device=rows.ids.device,
        )
        completions, m = rows.ids[..., rows.prompt_len :], self.members
        betas = self.beta.flatten().tolist()
        return exact_values(
            tree, m.policy, m.ref, betas, self.run.cfg.temperature, index, completions, step.mask
        )


class LockstepPPO:
    # as PPO: the KL penalty in the reward, and π_old's log-probs before any update
    needs_ref = True
    needs_old_logp = True

    def __init__(self, cfg, anchor: MembersAnchor | None, algos: list):
        self.members = Members(cfg, anchor)
        learned = algos[0].critic.learned
        policy_cfg = algos[0].policy.cfg
        self.critics = (
            Critics([a.critic for a in algos], policy_cfg, self.members) if learned else None
        )
        exact = ExactValues(algos[0].run, self.members)
        # the trainer's own PPO (ppo.PPO, a layer above) over the members
        self.ppo = type(algos[0])(self.members, self.critics if learned else exact, exact)

    @property
    def stacks(self) -> list[Stack]:
        """What the optimiser updates besides the policy (after it, in this order)."""
        return [self.critics] if self.critics is not None else []

    def host_state(self, algo, copies, p: int) -> dict:
        """Member p's PPO.state_dict() for its checkpoint: its learned critic's weights from the
        host copies of the step's stacks (their group "critic": the Critics'), in the layout of
        its own critic's tensors."""
        if self.critics is None:
            return algo.state_dict()
        return algo.state_dict(copies.member("critic", p, algo.critic.named_weights()))

    def __call__(self, stack: Stack, ref: Stack, opt: AdamW, step: Rollouts) -> dict:
        """PPO.figures of every member -> {name: (P,)}: the rollout's, then each update's
        (rl/report.packed), read back by the caller in one go."""
        m = self.members
        m.policy, m.ref, m.runs, self.ppo.policy = stack, ref, step.runs, stack
        # each member's β, adapted on its own (its PPO.row)
        self.ppo.beta = torch.tensor([a.beta for a in step.algos], device=step.mask.device)
        self.ppo.beta = self.ppo.beta[:, None, None]
        per_update, rollout = self.ppo.figures(step, opt, [r.gens["shuffle"] for r in step.runs])
        self.updates, self.n = len(per_update), step.mask.size(1)
        return {**rollout, **packed(per_update)}

    def row(self, mine: dict, algo) -> dict:
        """Member p's figures -> its row as its PPO.update makes it (PPO.row: its minibatch updates
        combined, then the rollout's; its β adapted towards --kl-target)."""
        rollout = {k: v for k, v in mine.items() if isinstance(k, str)}
        return algo.row(unpacked(mine, self.updates), rollout, self.n)
