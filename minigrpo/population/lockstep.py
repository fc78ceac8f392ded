"""A population in lockstep: P GRPO or PPO runs of one configuration, their seeds (and folders),
learning rates, rewards, β's and people apart (OWN), GRPO's recipes too (RECIPES), as one
computation.

    results = train_lockstep(trainer, cfgs, logs)  # trainer: minigrpo.grpo or minigrpo.ppo
    # cfgs[p]: member p's config; results[p]: its summary, or its error line

Each member is a run (rl/loop.Run: its folder, reward, anchor, generators, stop rule, files), and
each step does what rl/loop.run does, with its pieces (Run's, rl/rollout's, rl/trust_region's), for
all members at once:

    sample        every member's prompts and completions from its own generators, one KV-cache batch
                  (lm/sampling.generate_all), scored by its reward
    π_ref         one no-grad forward of every member's rows through their prefix trees
                  (population/rows.Rows)
    update        the trainer's update over a leading member dim (population/grpo_update.py,
                  ppo_update.py): one backward, one AdamW step on the stacked weights
                  (lm/optim.AdamW, a count and a rate per member)
    trust region  every member's step halved until its own probes allow it (rl/trust_region.py over
                  the stack; the anchor rows' logits carried from one step to the next)
    π_ref ← π_θ   the stack's, when Run.renews_ref
    the rest      each member's own: Run.end_step (exact evaluation, one forward for all:
                  population/evaluation.py; stop rule, metrics, checkpoints: checkpoint.py)
                  and, once it stops, Run.finish (summary.json, ...)

A member that stops (goal, plateau, cap) or fails (a NaN, a reward that raises) leaves the stack;
the others go on, untouched: every computation is per member. Each member's metrics are its single
run's to float rounding (tests/test_lockstep.py), and its folder is the one its single run writes
(`grpo --resume` or `ppo --resume` continues it); its step_time and tokens_per_s are the
population's step's. `unsupported(trainer, cfgs)` says what it cannot run (those runs then go
alone: population/engine.py). Departures: set-up is each --person's first member's,
taken by the others (Run(like=): the model, the tree anchor, the baseline), and so is the exact
evaluation of step 0 of the members of one reward, β and person (every member starts from the same
weights).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import torch

from minigrpo.lm.optim import AdamW
from minigrpo.lm.sampling import Request, generate_all
from minigrpo.population import grpo_update, ppo_update
from minigrpo.population.aids import Aids
from minigrpo.population.anchor import MembersAnchor
from minigrpo.population.checkpoint import host_copies, member_trained
from minigrpo.population.evaluation import SharedForward, alike, evaluate_members
from minigrpo.population.optim import keep
from minigrpo.population.progress import Progress
from minigrpo.population.rows import Rollouts, Rows
from minigrpo.population.sampling import PromptTable, read_completions
from minigrpo.population.stacked import Stack
from minigrpo.population.stale import StaleWeights
from minigrpo.rl.bookkeeping import finite_losses
from minigrpo.rl.loop import Run
from minigrpo.rl.report import (
    STOP_ALL,
    StopOnCtrlC,
    batch_figures,
    interrupted_line,
    stopped_line,
)
from minigrpo.rl.rollout import RolloutBatch, drawn, grouped
from minigrpo.rl.run_state import nonfinite_gradient
from minigrpo.rl.trust_region import step_probes
from minigrpo.util.cli import UsageError
from toy_tasks.rewards import RewardError, score

# what members may differ in, each a flag with a value (lr: optim.py; reward: each member's scores,
# evaluation and PPO's exact values; β: GRPO's in its loss and penalty (grpo_update.py), PPO's each
# member's already, adapted on its own; person: each member's prompts, anchor (anchor.py) and trust
# region's anchor rows), and settings that change no result
OWN = {trainer: ("seed", "out", "lr", "reward", "beta", "person") for trainer in ("grpo", "ppo")}
# and in their recipe: GRPO's presets of one μ, say, each recipe's members a part of the update
# (grpo_update.py)
RECIPES = {"grpo": grpo_update.RECIPE, "ppo": ()}
QUIET = ("overwrite", "quiet", "verbose")


@dataclass
class Kind:
    """What a lockstep population takes of a trainer (a command module, a layer above this one)."""

    name: str  # the run's algorithm name (config.json, checkpoints)
    check: Callable  # its flags' check: cfg -> None, or a UsageError
    algorithm: Callable  # run -> a member's algorithm object (its state: its checkpoint's)
    update: Callable  # (cfg, anchor, algos) -> the members' update (population/*_update.py)


# the trainers lockstep runs, by their command's name (trainer_name)
KINDS = {
    "grpo": lambda t: Kind("grpo", t.check_config, t.GRPO, grpo_update.LockstepGRPO),
    "ppo": lambda t: Kind("ppo", t.check_config, t.PPO, ppo_update.LockstepPPO),
}


def trainer_name(trainer) -> str:
    """A trainer module's command name: minigrpo.grpo -> 'grpo'."""
    return trainer.__name__.rsplit(".", 1)[-1]


def unsupported(trainer, cfgs: list) -> str | None:
    """Why these configs of `trainer` cannot run in lockstep (None: they can). Not in lockstep: the
    sampled anchor, each member's own rows, whose π_ref logits its single run takes from another
    forward than its policy's, so that at π_θ = π_ref their gradient is rounding that Adam's first
    step amplifies, and no lockstep member could match it."""
    name = trainer_name(trainer)
    if name not in KINDS:
        return f"{trainer.__name__} has no lockstep"
    own = (*OWN[name], *QUIET, *RECIPES[name])
    first = {k: v for k, v in asdict(cfgs[0]).items() if k not in own}
    if any({k: v for k, v in asdict(c).items() if k not in own} != first for c in cfgs):
        return f"members differ in more than their {', '.join(OWN[name])}" + (
            " and recipe" if RECIPES[name] else ""
        )
    if cfgs[0].resume is not None:
        return "--resume"
    if cfgs[0].preserve and cfgs[0].preserve_anchor == "sampled":
        return "--preserve-anchor sampled"
    return None


class Member:
    """One member's run, its algorithm (its state, for its checkpoint) and its open metrics file."""

    def __init__(self, kind: Kind, cfg, log, like: Run | None = None):
        kind.check(cfg)
        self.run = Run(cfg, kind.name, log, like)
        self.algo = kind.algorithm(self.run)
        self.logger, self.batch, self.error = None, None, None


def train_lockstep(trainer, cfgs: list, logs: list) -> list:
    """Every member's run (module docstring) -> per member its summary (dict) or its error (str).
    `trainer`: the module minigrpo.grpo or minigrpo.ppo, whose checks, algorithm state, loss and
    panels the members use."""
    kind, members, results = KINDS[trainer_name(trainer)](trainer), [], [None] * len(cfgs)
    likes = {}
    for k, (cfg, log) in enumerate(zip(cfgs, logs)):
        try:
            members.append((k, Member(kind, cfg, log, likes.get(cfg.person))))
            # each --person's first: its anchor, the others'
            likes.setdefault(cfg.person, members[-1][1].run)
        except UsageError as e:
            results[k] = str(e)
    if not members:
        return results
    cfg, first = cfgs[members[0][0]], members[0][1].run
    stack = Stack([m.run.policy for _, m in members], trainable=True)
    ref = Stack([m.run.ref for _, m in members])
    update = kind.update(
        cfg, MembersAnchor(cfg) if first.anchor is not None else None, [m.algo for _, m in members]
    )
    params = stack.parameters() + [w for s in update.stacks for w in s.parameters()]
    opt = AdamW(params, lr=cfg.lr, t=torch.zeros(len(members), dtype=torch.long))  # a count each
    sampler = members[0][1].algo.sampler  # GRPO's --sample-*: alike for all members
    aids = Aids(
        SharedForward(),
        PromptTable(
            first.tok,
            list(dict.fromkeys(x for _, m in members for x in m.run.prompts)),
            first.device,
        ),
        first.anchor is not None and cfg.trust_region_anchor > 0,
        StaleWeights(sampler.stale) if sampler is not None and sampler.stale else None,
    )
    aids.adopt(members)
    # step 0: every member's weights are the first's, evaluated by its own forward once for each
    # reward, β and person (alike) as its single run (figures that compare π_θ with π_ref see them
    # equal)
    start = {}
    for _, m in members:
        if alike(m.run.cfg) not in start:
            start[alike(m.run.cfg)] = m.run.exact_evaluation()
    for _, m in members:
        m.logger = m.run.begin(start[alike(m.run.cfg)])
    progress = Progress([m.run for _, m in members])
    try:
        with StopOnCtrlC() as stop:
            # STOP_ALL: a pool's Ctrl-C
            while members and not (stop.requested or STOP_ALL.is_set()):
                _step(members, stack, ref, opt, update, cfg, aids)
                ended = [
                    j
                    for j, (_, m) in enumerate(members)
                    if m.error or m.run.stop_reason is not None
                ]
                for j in ended:
                    k, m = members[j]
                    results[k] = _end(m, trainer.PANELS)
                if ended:
                    live = [j for j in range(len(members)) if j not in ended]
                    members = [members[j] for j in live]
                    if members:
                        keep([stack, *update.stacks], opt, live)
                        ref = ref.rows(live)
                        if aids.stale is not None:
                            aids.stale.keep(live)
                        aids.adopt(members)
                progress.tick([m.run for _, m in members])
    finally:
        for _, m in members:
            m.logger.close()
    copies = host_copies(stack, ref, opt, *update.stacks)
    for j, (k, m) in enumerate(members):  # Ctrl-C: each member's step in flight was finished; its
        m.run.save(member_trained(copies, j, m, update, opt))  # checkpoint
        results[k] = interrupted_line(m.run.step, m.run.out)
    return results


def _step(members: list, stack: Stack, ref: Stack, opt: AdamW, update, cfg, aids: Aids) -> None:
    """One step of every member (the module docstring's table); a member that fails gets its error
    and its row no update that counts."""
    t0, runs = time.perf_counter(), [m.run for _, m in members]
    # each member's --lr, at the same step of the same schedule
    opt.param_groups[0]["lr"] = torch.tensor([r.lr_now() for r in runs], dtype=torch.float64)
    batches = _collect(
        members, aids.stale.pick(stack) if aids.stale is not None else stack, cfg, aids.prompts
    )
    some = next((b for b in batches if b is not None), None)
    if some is None:  # every member failed
        return
    # a failed member's slot: any rows, its update not kept
    rows = Rows.of([(b or some).gen for b in batches])
    rewards, completion_mask = (
        torch.stack([(b or some).rewards for b in batches]),
        rows.completion_mask,
    )
    with torch.no_grad():
        ref_logp, ref_logits = (
            rows.logprobs(ref, cfg.temperature) if update.needs_ref else (None, None)
        )
        old_logp = rows.logprobs(stack, cfg.temperature)[0] if update.needs_old_logp else None
    anchor_rows = None if aids.anchor_rows is None else lambda: aids.anchor_rows
    guard = aids.trust_region(stack, step_probes(cfg, rows, anchor_rows))
    figures = update(
        stack,
        ref,
        opt,
        Rollouts(
            rows,
            rewards,
            ref_logp,
            ref_logits,
            old_logp,
            batches,
            runs,
            [m.algo for _, m in members],
        ),
    )
    trust = guard.enforce(stack) if guard is not None else {}
    aids.evaluation.fresh(stack)  # the members' evaluation, one forward for all
    step_time, rows = time.perf_counter() - t0, _rows(members, update, figures, trust)
    # a member whose losses are not finite ends in end_step, unevaluated
    evaluated = [members[j][1] for j, row in rows.items() if finite_losses(row)]
    evaluations = evaluate_members([m for m in evaluated if m.run.evaluating()])
    figures = _figures(rewards, completion_mask, list(rows))
    # π_ref ← π_θ, as rl/loop.run's
    if runs[0].renews_ref():
        with torch.no_grad():
            for name, w in ref.w.items():
                w.copy_(stack.w[name])
    # the checkpoints' host copies: made on the first, once for all
    copies = host_copies(stack, ref, opt, *update.stacks)
    for j, row in rows.items():
        m = members[j][1]
        try:
            m.run.end_step(
                partial(member_trained, copies, j, m, update, opt),
                batches[j],
                row,
                step_time,
                m.logger,
                evaluations.get(id(m)),
                figures[j],
            )
        except UsageError as e:
            m.error = str(e)
        except Exception as e:  # noqa: BLE001 (its own failure, bad weights: the others go on)
            m.error = f"{type(e).__name__}: {e}"
        m.batch = batches[j]


def _collect(members: list, stack: Stack, cfg, table: PromptTable) -> list:
    """Every member's rollout (rl/rollout.collect's, without the log-probs: those are batched) from
    the weights `stack` (the policy's, or a stale sampler's) -> its RolloutBatch, or None where it
    failed (its error set: a sampling that met NaN, a reward that raised)."""
    # GRPO's --sample-*: alike for all
    runs, sampler = [m.run for _, m in members], members[0][1].algo.sampler
    (temperature, top_p), n = drawn(cfg.temperature, sampler), cfg.max_new_tokens
    prompts = [grouped(r.step_prompts(), cfg.group_size) for r in runs]
    requests = [
        Request(ids, mask, n, temperature, None, top_p, r.gens["rollout"], ids.size(1))
        for r, (ids, mask) in zip(runs, table.encode(prompts))
    ]
    gens = generate_all(stack, requests)
    batches, scored = [], []
    # one read
    for (_, m), rows, gen, read in zip(members, prompts, gens, read_completions(runs[0].tok, gens)):
        if isinstance(gen, Exception):  # a sampling that met NaN
            m.error = stopped_line(gen, m.run.step)
        else:
            completions, finished = read
            try:
                rewards = score(m.run.reward, rows, completions, finished, cfg.unfinished_reward)
            except RewardError as e:
                m.error = stopped_line(e, m.run.step)
        # it leaves after this step; its rows still fill the batch (its update is never kept)
        if m.error:
            batches.append(None)
            scored.append([0.0] * len(rows))
            continue
        batches.append((rows, completions, gen))
        scored.append(rewards)
    # every member's rewards, one copy to the device
    values = torch.tensor(scored, device=table.ids.device)
    return [
        None if b is None else RolloutBatch(*b, values[p], cfg.group_size, None, None)
        for p, b in enumerate(batches)
    ]


def _rows(members: list, update, figures: dict, trust: dict) -> dict:
    """Each live member's metrics row {j: row}, every member's figures read back in one go: the
    update's (its `row`), then the trust region's, as the single run logs them; a member whose
    gradient was not finite gets its single run's error instead."""
    values = torch.stack([*figures.values(), *trust.values()]).tolist()  # one read
    own, region = dict(zip(figures, values)), dict(zip(trust, values[len(figures) :]))
    rows = {}
    for j, (_, m) in enumerate(members):
        if m.error:
            continue
        bad = next(
            (
                v[j]
                for k, v in own.items()
                if isinstance(k, tuple) and k[-1] == "grad_norm" and not math.isfinite(v[j])
            ),
            None,
        )
        if bad is not None:
            m.error = nonfinite_gradient(bad, m.run.step + 1)
            continue
        rows[j] = {
            **update.row({k: v[j] for k, v in own.items()}, m.algo),
            **{k: v[j] for k, v in region.items()},
        }
    return rows


def _figures(rewards: torch.Tensor, completion_mask: torch.Tensor, live: list[int]) -> dict:
    """Each live member's logged reward and length figures (rl/report.batch_figures) from the step's
    rewards (P, N) and completion mask (P, N, T), every member's read at once."""
    if not live:
        return {}
    at = torch.tensor(live, device=rewards.device)
    values = batch_figures(
        rewards.index_select(0, at), completion_mask.index_select(0, at).sum(-1).float()
    )
    return dict(zip(live, values.tolist()))


def _end(m: Member, panels):
    """A member that stopped: its files -> its summary; or its error."""
    m.logger.close()
    if m.error:
        return m.error
    return m.run.finish(m.batch, panels)
