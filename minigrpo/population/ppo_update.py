"""PPO's update (ppo.py, `PPO.update`) for P members at once: the KL-shaped rewards, the critic's
values, GAE and whitening, then epochs × minibatches of clipped policy and value updates, every
tensor with a leading member dim.

    update = LockstepPPO(cfg, anchor, algos)       # algos: each member's ppo.PPO (its critic, its
                                                   # β)
    figures = update(stack, ref, opt, step)        # step: the members' rollouts
                                                   # (population/rows.Rollouts)
    row = update.row(mine, algo)                   # member p's figures {name: float} -> its metrics
                                                   # row's part

The critic's values are the single run's functions over the members' stacked weights
(rl/critics.head_values, exact_values); this module keeps their stacking and life-cycle: `separate`
and `head` are `Critics`, the members' heads (and trunks) stacked, trained by the population's
optimiser after the policy (`stacks`); `oracle` is each member's exact values (`ExactValues`: one
value tree for the members' rewards and prompts; the learned critics' explained_variance_oracle
reads them too). GAE runs over the (P, N, T) rows as they are. Each member shuffles its minibatches
with its own generator, so they are its single run's rows, gathered (Rows.select: every minibatch of
the step at once, their prefix trees built as one). Each member's figures are its single run's to
float rounding (tests/test_lockstep.py). Not in lockstep (`unsupported`): the sampled anchor.
"""

from __future__ import annotations

import torch
from torch.func import vmap

from minigrpo.lm.model import Weights
from minigrpo.lm.optim import AdamW, clip_grad_norm
from minigrpo.objectives.advantages import explained_variance, gae, kl_shaped_rewards, whiten
from minigrpo.objectives.ppo_objective import ppo_objective
from minigrpo.population.anchor import MembersAnchor
from minigrpo.population.rows import Rollouts, Rows
from minigrpo.population.stacked import Stack
from minigrpo.rl.critics import exact_values, head_values
from minigrpo.rl.report import combine_stats, packed, unpacked
from toy_tasks.support import reward_table
from toy_tasks.value_tree import ValueTree


def unsupported(cfgs: list) -> str | None:
    """Why a lockstep population cannot run these members' configs (None: it can)."""
    cfg = cfgs[0]
    reasons = {"--preserve-anchor sampled": cfg.preserve and cfg.preserve_anchor == "sampled"}
    return next((name for name, yes in reasons.items() if yes), None)


class Critics(Stack):
    """The members' learned critics (rl/critics.py), their weights stacked by name
    (Critic.named_weights: the heads' weights (P, 1, C) and biases (P, 1), then the separate
    critic's trunks), trainable: the single run's order of parameters. Their values are
    rl/critics.head_values over these weights. The head critic has no trunk: its values come from
    the policy's hidden states, and their gradient reaches the policy."""

    def __init__(self, critics: list, cfg):
        named = [c.named_weights() for c in critics]
        stacked = {
            k: torch.stack([n[k] for n in named]).detach().requires_grad_() for k in named[0]
        }
        Weights.__init__(self, cfg, stacked)
        self.separate = critics[0].trunk is not None

    def values(self, rows: Rows, policy: Stack, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """V(s_t) before each completion token of every member's rows -> (P, N, T), 0 where masked
        (Critic.values of each member). hidden: the policy's states there (P, N, T, C), the head
        critic's input where the caller has them (else the policy's forward); the separate
        critic's trunks make their own."""
        w, b = self.w["head.weight"], self.w["head.bias"]
        if self.separate:
            return head_values(w, b, rows, trunk=self)
        return head_values(w, b, rows, hidden, policy)

    def host_state(self, critic, copies, p: int) -> dict:
        """Member p's critic.state_dict() (rl/critics.Critic's keys) from the host copies of the
        step's stacks (their group "critic": this stack's), in the layout of its own critic's
        tensors."""
        return critic.state_dict(copies.member("critic", p, critic.named_weights()))


class ExactValues:
    """Each member's exact values under its policy now (rl/critics.OracleCritic), all at once:
    rl/critics.exact_values over the stacked weights (and π_ref's), under each member's reward (one
    tree for all where they share it), over every member's prompts (its --person's)."""

    def __init__(self, run):
        self.run, self.trees, self.temperature = run, {}, run.cfg.temperature

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

    def __call__(
        self, stack: Stack, ref: Stack, step: Rollouts, betas: list[float]
    ) -> torch.Tensor:
        """-> (P, N, T), 0 where masked (any value in a failed member's slot)."""
        rows, (tree, place) = step.rows, self.tree(step.runs)
        N = rows.ids.size(1)
        index = torch.tensor(
            [[place[x] for x in b.prompts] if b is not None else [0] * N for b in step.batches],
            device=rows.ids.device,
        )
        completions = rows.ids[..., rows.prompt_len :]
        return exact_values(
            tree, stack, ref, betas, self.temperature, index, completions, rows.completion_mask
        )


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (P, N, ...) -> (P, n, ...): member p's rows index[p]."""
    return x.gather(1, index.view(*index.shape, *[1] * (x.dim() - 2)).expand(-1, -1, *x.shape[2:]))


class LockstepPPO:
    # as PPO: the KL penalty in the reward, and π_old's log-probs before any update
    needs_ref = True
    needs_old_logp = True

    def __init__(self, cfg, anchor: MembersAnchor | None, algos: list):
        self.cfg, self.anchor = cfg, anchor
        learned = algos[0].critic.learned
        self.critics = Critics([a.critic for a in algos], algos[0].policy.cfg) if learned else None
        self.exact = ExactValues(algos[0].run)
        self.learned = self.critics is not None
        self.whiten = vmap(whiten)
        self.explained = vmap(explained_variance)
        # objectives/ppo_objective, each member's own minibatch (a single run's call, mapped)
        self.objective = vmap(lambda *tensors: ppo_objective(*tensors[:6], cfg, *tensors[6:]))

    @property
    def stacks(self) -> list[Stack]:
        """What the optimiser updates besides the policy (after it, in this order)."""
        return [self.critics] if self.critics is not None else []

    def host_state(self, algo, copies, p: int) -> dict:
        """Member p's PPO.state_dict() for its checkpoint: its learned critic's weights from the
        host copies."""
        if self.critics is None:
            return algo.state_dict()
        return {**self.critics.host_state(algo.critic, copies, p), "beta": algo.beta}

    @torch.no_grad()
    def advantages(self, stack: Stack, ref: Stack, step: Rollouts, betas: list[float]):
        """PPO.advantages of every member -> V_old, the whitened advantages, returns (P, N, T); the
        (P, N) KL per sequence; the exact values (None with the oracle critic: they are V_old)."""
        cfg, mask = self.cfg, step.rows.completion_mask
        exact_values = self.exact(stack, ref, step, betas)
        if not self.learned:
            old_values = exact_values
        else:  # the head critic reads the policy's states: a forward of its own, as HeadCritic's
            old_values = self.critics.values(step.rows, stack)
        beta = torch.tensor(betas, device=mask.device)[:, None, None]  # each member's
        r, kl_seq = kl_shaped_rewards(step.rewards, step.old_logp, step.ref_logp, mask, beta)
        adv, returns = gae(r, old_values, mask, cfg.gamma, cfg.lam)
        return old_values, adv, returns, kl_seq, exact_values if self.learned else None

    def __call__(self, stack: Stack, ref: Stack, opt: AdamW, step: Rollouts) -> dict:
        cfg, mask = self.cfg, step.rows.completion_mask
        old_values, raw, returns, kl_seq, exact_values = self.advantages(
            stack, ref, step, [a.beta for a in step.algos]
        )
        adv = self.whiten(raw, mask)
        P, N = mask.shape[:2]
        per_update = []
        passes = [
            torch.stack([torch.randperm(N, generator=r.gens["shuffle"]) for r in step.runs]).to(
                mask.device
            )
            # each member's shuffles, drawn in its single run's order
            for _ in range(cfg.epochs)
        ]
        chunks = [rows for order in passes for rows in order.chunk(cfg.minibatches, dim=1)]
        # the minibatches' prefix trees, built as one
        for rows, sub in zip(chunks, step.rows.select(chunks)):
            m, old, a = sub.completion_mask, _take(step.old_logp, rows), _take(adv, rows)
            logp, logits, hidden = sub.logprobs(stack, cfg.temperature, states=True)
            ref_logits = _take(step.ref_logits, rows)
            if self.learned:
                values, v_old = self.critics.values(sub, stack, hidden), _take(old_values, rows)
                loss, s = self.objective(
                    logp, old, a, logits, ref_logits, m, values, v_old, _take(returns, rows)
                )
            else:
                loss, s = self.objective(logp, old, a, logits, ref_logits, m)
            anchor = (
                None
                if self.anchor is None
                else self.anchor.term(stack, ref, [r.anchor for r in step.runs])
            )
            if anchor is not None:
                loss = loss + anchor
                s["preserve_loss"] = anchor.detach()
            s = {"policy_loss": s.pop("policy_loss"), "loss": loss.detach(), **s}  # ppo.py's order
            opt.zero_grad()
            loss.sum().backward()  # each member's loss reaches only its own slices of the weights
            s["grad_norm"] = clip_grad_norm(
                opt.params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"), per_slice=True
            )
            opt.step()
            per_update.append({k: v.detach() for k, v in s.items()})
        self.updates = len(per_update)
        n = mask.sum((1, 2))
        adv_mean = torch.where(mask, adv, 0.0).sum((1, 2)) / n
        adv_var = torch.where(mask, (adv - adv_mean[:, None, None]) ** 2, 0.0).sum((1, 2)) / (
            n - 1
        ).clamp(min=1)
        out = {
            "kl_k1_seq": kl_seq.mean(-1),
            "value_mean": old_values.sum((1, 2)) / n.clamp(min=1),
            "explained_variance": self.explained(old_values, returns, mask),
            "adv_mean": adv_mean,
            "adv_std": torch.where(n > 1, adv_var.sqrt(), 0.0),
        }
        if exact_values is not None:
            out["explained_variance_oracle"] = self.explained(old_values, exact_values, mask)
        return {**out, **packed(per_update)}

    def row(self, mine: dict, algo) -> dict:
        """Member p's figures -> its row as PPO.update returns it (its minibatch updates combined,
        then the step's); its β adapted towards --kl-target as PPO.update adapts it."""
        N = self.cfg.group_size * self.cfg.prompts_per_step
        out = combine_stats(unpacked(mine, self.updates))
        kl_mean = mine["kl_k1_seq"]
        algo.adapt_beta(kl_mean, N)  # its own β, as its PPO.update adapts it
        out.update(
            kl_k1_seq=kl_mean,
            beta=algo.beta,
            **{k: mine[k] for k in ("value_mean", "explained_variance", "adv_mean", "adv_std")},
        )
        if "explained_variance_oracle" in mine:
            out["explained_variance_oracle"] = mine["explained_variance_oracle"]
        return out
