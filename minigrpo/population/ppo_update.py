"""PPO's update for P members at once: the single run's own (ppo.PPO.figures) over a leading member
dim, given the members as its run, their critics and their exact values; on the CPU its functions
of one run's tensors go member by member at its own width (grpo_update.Members.each), so each
member's figures are its single run's, to the bit (tests/test_lockstep.py).

    update = LockstepPPO(cfg, anchor, algos)    # algos: each member's ppo.PPO (critic, β)
    figures = update(stack, ref, opt, step)     # step: the members' rollouts (rows.Rollouts)
    row = update.row(mine, algo)                # member p's figures -> its row (its PPO.row)
"""

from __future__ import annotations

import torch

from minigrpo.lm.model import Weights
from minigrpo.lm.optim import AdamW
from minigrpo.population.anchor import MembersAnchor
from minigrpo.population.grpo_update import Members as Slices
from minigrpo.population.rows import Rollouts
from minigrpo.population.stacked import Stack, stacked
from minigrpo.rl.critics import (
    completion_hidden,
    exact_values,
    head_values,
    value_head,
    value_tree,
)
from minigrpo.rl.report import packed, unpacked
from minigrpo.rl.run_state import clip_and_step
from toy_tasks.value_tree import ValueTree


class Critics(Stack):
    """The members' learned critics (rl/critics.py), trained after the policy: Critic.named_weights
    stacked (heads (P, 1, C), (P, 1), then the separate critic's trunks), trainable."""

    learned = True

    def __init__(self, critics: list, cfg, members: LockstepPPO):
        named = [c.named_weights() for c in critics]
        w = {k: stacked([n[k] for n in named]).detach().requires_grad_() for k in named[0]}
        Weights.__init__(self, cfg, w)
        self.separate, self.members = critics[0].trunk is not None, members

    def values(self, batch: Rollouts, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Critic.values of each member -> (P, N, T), 0 where masked (on the CPU each member's head
        at its own width); hidden: the policy's states (P, N, T, C), where the caller has them."""
        if self.separate or hidden is None:
            hidden = completion_hidden(self if self.separate else self.members.policy, batch.gen)
        w, b = self.w["head.weight"], self.w["head.bias"]
        if self.members.slices is None:  # on a GPU: every member's head in one product
            return head_values(w, b, batch.gen, hidden)
        head = lambda _, h, w, b, mask: torch.where(mask, value_head(h, w, b), 0.0)
        return self.members.slices.each(head, hidden, [*w], [*b], batch.mask)


class ExactValues:
    """Each member's rl/critics.OracleCritic at its β (`beta`, (P, 1, 1), set by PPO): exact_values
    of the members of one set of prompts (--person) at once, over their value tree."""

    learned = False
    beta: torch.Tensor

    def __init__(self, members: LockstepPPO):
        self.members, self.trees = members, {}

    def parameters(self) -> list:
        return []

    def tree(self, runs: list) -> tuple[ValueTree, dict]:
        """rl/critics.value_tree of these members (one set of prompts), made once."""
        specs = tuple(x.cfg.reward for x in runs)
        key = (specs[:1] if len(set(specs)) == 1 else specs, tuple(runs[0].prompts))
        if key not in self.trees:
            self.trees[key] = value_tree(runs)
        return self.trees[key]

    @torch.no_grad()
    def values(self, step: Rollouts, hidden=None) -> torch.Tensor:
        """-> (P, N, T), 0 where masked; the members of each set of prompts at once."""
        groups: dict = {}
        for p, r in enumerate(step.runs):
            groups.setdefault(tuple(r.prompts), []).append(p)
        rows, N, m, batches = step.gen, step.mask.size(1), self.members, step.batches
        out, betas = torch.zeros(step.mask.shape, device=step.mask.device), self.beta.flatten()
        for at in groups.values():
            tree, place = self.tree([step.runs[p] for p in at])
            index = [[place[x] for x in batches[p].prompts] if batches[p] else [0] * N for p in at]
            out[at] = exact_values(
                tree, m.policy.rows(at), m.ref.rows(at), betas[at].tolist(),
                m.cfg.temperature, torch.tensor(index, device=rows.ids.device),
                rows.completion_ids[at], step.mask[at],
            )  # fmt: skip
        return out


class LockstepPPO:
    """The members' update, and the members as the run of its PPO: their stacked policy, π_ref and
    rl/loop.Run's (set each step, as `slices`, the step's), their anchor term and optimiser step."""

    # as PPO: the KL penalty in the reward, and π_old's log-probs before any update
    needs_ref = True
    needs_old_logp = True

    def __init__(self, cfg, anchor: MembersAnchor | None, algos: list):
        self.cfg, self.anchor, self.runs = cfg, anchor, []  # runs: each member's rl/loop.Run
        self.policy = self.ref = self.slices = None  # set each step (Stack, Stack, Slices)
        exact, critics = ExactValues(self), [a.critic for a in algos]
        self.critics = Critics(critics, algos[0].policy.cfg, self) if critics[0].learned else None
        # what the optimiser updates besides the policy (after it, in this order)
        self.stacks = [] if self.critics is None else [self.critics]
        # the trainer's own PPO (ppo.PPO, a layer above) with these members as its run
        self.ppo = type(algos[0])(self, exact if self.critics is None else self.critics, exact)

    def anchor_term(self) -> torch.Tensor | None:
        """(P,) --preserve-coef × each member's anchor loss (None when off)."""
        anchors = [r.anchor for r in self.runs]
        return None if self.anchor is None else self.anchor.term(self.policy, self.ref, anchors)

    def clip_and_step(self, opt: AdamW, loss: torch.Tensor, params) -> torch.Tensor:
        """Run.clip_and_step of every member (rl/run_state.clip_and_step)."""
        return clip_and_step(opt, loss, opt.params, self.cfg.grad_clip, 0)

    def host_state(self, algo, copies, p: int) -> dict:
        """Member p's PPO.state_dict() for its checkpoint: its learned critic's weights from the
        step's host copies (their group "critic"), in the layout of its own critic's tensors."""
        if self.critics is None:
            return algo.state_dict()
        return algo.state_dict(copies.member("critic", p, algo.critic.named_weights()))

    def __call__(self, stack: Stack, ref: Stack, opt: AdamW, step: Rollouts) -> dict:
        """PPO.figures of every member -> {name: (P,)}: the rollout's, then each update's
        (rl/report.packed), read back by the caller in one go."""
        self.policy, self.ref, self.runs, self.ppo.policy = stack, ref, step.runs, stack
        # each member's β, adapted on its own (its PPO.row)
        self.ppo.beta = torch.tensor([[[a.beta]] for a in step.algos], device=step.mask.device)
        # PPO's functions of one run's tensors: on the CPU member by member at its own width (its
        # single run's sums), on a GPU PPO's vmap (one kernel for all)
        self.slices = None if step.mask.is_cuda else Slices(step)
        one = lambda f: lambda *x: self.slices.each(lambda _, *y: f(*y), *x)
        each = None if self.slices is None else lambda f, lead: one(f)
        shuffles = [r.gens["shuffle"] for r in step.runs]
        per_update, rollout = self.ppo.figures(step, opt, shuffles, each)
        self.updates, self.n = len(per_update), step.mask.size(1)
        return {**rollout, **packed(per_update)}

    def row(self, mine: dict, algo) -> dict:
        """Member p's figures -> its row as its PPO.update makes it (PPO.row: its minibatch updates
        combined, then the rollout's; its β adapted towards --kl-target)."""
        rollout = {k: v for k, v in mine.items() if isinstance(k, str)}
        return algo.row(unpacked(mine, self.updates), rollout, self.n)
