"""A population in lockstep: P GRPO or PPO runs of one configuration (their seeds, folders, rates,
rewards, β's and people apart: OWN; GRPO's recipes too: RECIPES) as one computation.

    results = train_lockstep(trainer, cfgs, logs)  # trainer: minigrpo.grpo or minigrpo.ppo
    # cfgs[p]: member p's config; results[p]: its summary, or its error line

Each member is an rl/loop.Run, each step rl/loop.run's over all members at once (one rollout
batch, one π_ref forward, the update over a leading member dim, the trust region over the stack),
then each member's own Run.end_step. A member that stops or fails leaves the stack. Its metrics are
its single run's to float rounding, in the same folder (tests/test_lockstep.py). Departures: members
of one --person share their set-up (Run(like=)); of one reward, β and person, step 0's evaluation.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from functools import partial

import torch

from minigrpo.lm.logprobs import generation_logprobs
from minigrpo.lm.optim import AdamW
from minigrpo.population import grpo_update, ppo_update
from minigrpo.population.anchor import MembersAnchor, own_rows
from minigrpo.population.checkpoint import host_copies, member_trained
from minigrpo.population.evaluation import alike, evaluate_members
from minigrpo.population.progress import Progress
from minigrpo.population.rows import Rollouts, stacked_rows
from minigrpo.population.stacked import Stack, keep
from minigrpo.rl.bookkeeping import finite_losses
from minigrpo.rl.loop import Run
from minigrpo.rl.report import (
    INTERRUPTED,
    StopOnCtrlC,
    batch_figures,
    interrupted_line,
    stopped_line,
)
from minigrpo.rl.rollout import collect_all
from minigrpo.rl.run_state import nonfinite_gradient
from minigrpo.rl.trust_region import StepGuard, step_probes
from minigrpo.tools.pool import STOPPING
from minigrpo.util.cli import UsageError

# what members may differ in (lr: the optimiser's per member; reward, β, person: each member's
# own scores, loss, prompts and anchor), and settings that change no result
OWN = ("seed", "out", "lr", "reward", "beta", "person")
RECIPES = {"grpo": grpo_update.RECIPE, "ppo": ()}  # GRPO's: compare's presets of one μ
QUIET = ("overwrite", "quiet", "verbose")


# each trainer's members' update (population/*_update.py: (cfg, anchor, algos) -> the update); a
# member's algorithm (its state, for its checkpoint) is the trainer's ALGORITHM
KINDS = {"grpo": grpo_update.LockstepGRPO, "ppo": ppo_update.LockstepPPO}


def trainer_name(trainer) -> str:
    """A trainer module's command name: minigrpo.grpo -> 'grpo'."""
    return trainer.__name__.rsplit(".", 1)[-1]


def shared(trainer, cfg, mixed: bool = True) -> dict:
    """The settings of `cfg` that a lockstep population's members share: all but OWN's and QUIET's
    (and with `mixed`, the RECIPES')."""
    apart = (*OWN, *QUIET, *(RECIPES[trainer_name(trainer)] if mixed else ()))
    return {k: v for k, v in asdict(cfg).items() if k not in apart}


def unsupported(trainer, cfgs: list) -> str | None:
    """Why these configs of `trainer` cannot run in lockstep (None: they can). The sampled anchor
    cannot: its single run's π_ref logits come from another forward than its policy's, so that at
    π_θ = π_ref their gradient is rounding that Adam's first step amplifies."""
    name = trainer_name(trainer)
    if name not in KINDS:
        return f"{trainer.__name__} has no lockstep"
    if any(shared(trainer, c) != shared(trainer, cfgs[0]) for c in cfgs):
        return f"members differ in more than their {', '.join(OWN)}" + (
            " and recipe" if RECIPES[name] else ""
        )
    if cfgs[0].resume is not None:
        return "--resume"
    if cfgs[0].preserve and cfgs[0].preserve_anchor == "sampled":
        return "--preserve-anchor sampled"
    return None


class Member:
    """One member's run, its algorithm (its state, for its checkpoint) and its open metrics file."""

    def __init__(self, trainer, cfg, log, like: Run | None = None):
        trainer.check_config(cfg)
        self.run = Run(cfg, trainer_name(trainer), log, like)
        self.algo = trainer.ALGORITHM(self.run)  # grpo.GRPO, ppo.PPO
        self.logger, self.batch, self.error = None, None, None


@dataclass
class Population:
    """The live members [(their index in cfgs, Member)] and what their steps share."""

    members: list
    stack: Stack  # their policies' weights, trainable
    ref: Stack
    opt: AdamW  # over stack's and the update's stacks, a count and a rate per member
    update: object  # grpo_update.LockstepGRPO or ppo_update.LockstepPPO
    cfg: object  # the first member's: every setting but OWN (and RECIPES) is theirs
    anchor_rows: tuple | None = None  # the trust region's anchor probe (anchor_probe_rows)
    guard: StepGuard | None = None  # the last step's trust region (its anchor logits go on)

    def adopt(self) -> None:
        """At the start and when members left: every member samples from the one stale sampler
        (GRPO's --sample-stale: its record is of the stacked weights), and the anchor probe's
        rows are these members' (each --person's chosen once, own_rows)."""
        algos, cfg, self.guard = [m.algo for _, m in self.members], self.cfg, None
        if algos[0].sampler is not None and algos[0].sampler.stale:
            for a in algos:
                a.sampler = algos[0].sampler
        runs = [m.run for _, m in self.members]
        if runs[0].anchor is not None and cfg.trust_region_anchor > 0:
            # one run's rows for each anchor (Run.anchor_probe_rows: chosen once, kept)
            probe = {id(r.anchor): r.anchor_probe_rows for r in runs}
            gens, weights, groups = zip(*[probe[id(r.anchor)]() for r in runs])
            rows, (w, g) = own_rows(list(gens), [list(weights), list(groups)])
            self.anchor_rows = (rows, w, g)

    def leave(self, ended: list[int]) -> None:
        """Members `ended` (their places) leave the stacks, the optimiser and the stale record."""
        live = [j for j in range(len(self.members)) if j not in ended]
        self.members = [self.members[j] for j in live]
        if not self.members:
            return
        keep([self.stack, *self.update.stacks], self.opt, live)
        self.ref = self.ref.rows(live)
        sampler = self.members[0][1].algo.sampler
        if sampler is not None and sampler.states:
            sampler.states = [{k: w[live] for k, w in s.items()} for s in sampler.states]
        self.adopt()


def train_lockstep(trainer, cfgs: list, logs: list) -> list:
    """Every member's run (module docstring) -> per member its summary (dict) or its error (str).
    `trainer`: the module minigrpo.grpo or minigrpo.ppo."""
    members, results = [], [None] * len(cfgs)
    likes = {}
    for k, (cfg, log) in enumerate(zip(cfgs, logs)):
        try:
            members.append((k, Member(trainer, cfg, log, likes.get(cfg.person))))
            # each --person's first: its anchor, the others'
            likes.setdefault(cfg.person, members[-1][1].run)
        except UsageError as e:
            results[k] = str(e)
    if not members:
        return results
    cfg, first = cfgs[members[0][0]], members[0][1].run
    stack = Stack([m.run.policy for _, m in members], trainable=True)
    anchor = MembersAnchor(cfg) if first.anchor is not None else None
    update = KINDS[trainer_name(trainer)](cfg, anchor, [m.algo for _, m in members])
    params = stack.parameters() + [w for s in update.stacks for w in s.parameters()]
    opt = AdamW(params, lr=cfg.lr, t=torch.zeros(len(members), dtype=torch.long))
    pop = Population(members, stack, Stack([m.run.ref for _, m in members]), opt, update, cfg)
    pop.adopt()
    # step 0: every member's weights are the first's, evaluated once for each reward, β and person
    start = {}
    for _, m in members:
        if alike(m.run.cfg) not in start:
            start[alike(m.run.cfg)] = m.run.exact_evaluation()
        m.logger = m.run.begin(start[alike(m.run.cfg)])
    progress = Progress([m.run for _, m in members])
    try:
        with StopOnCtrlC() as stop:  # STOPPING: a pool's Ctrl-C
            while pop.members and not (stop.requested or any(s.is_set() for s in STOPPING)):
                _step(pop)
                ended = [j for j, (_, m) in enumerate(pop.members) if m.error or m.run.stop_reason]
                for j in ended:
                    k, m = pop.members[j]
                    m.logger.close()
                    results[k] = m.error or m.run.finish(m.batch, trainer.PANELS)
                if ended:
                    pop.leave(ended)
                progress.tick([m.run for _, m in pop.members])
    # a second Ctrl-C, or a reward's own KeyboardInterrupt: the step in flight is half applied, so
    # no checkpoint of it; each member still in the stack says so
    except KeyboardInterrupt:
        for k, m in pop.members:
            step = f"{INTERRUPTED} at once during step {m.run.step + 1}"
            results[k] = f"{step}: the checkpoints already written are intact"
        return results
    finally:
        for _, m in pop.members:
            m.logger.close()
    copies = host_copies(pop.stack, pop.ref, pop.opt, *update.stacks)
    for j, (k, m) in enumerate(pop.members):  # Ctrl-C: each member's step in flight was finished
        m.run.save(member_trained(copies, j, m, update, pop.opt))
        results[k] = interrupted_line(m.run.step, m.run.out)
    return results


def _step(pop: Population) -> None:
    """One step of every member; a member that fails gets its error, its update not kept."""
    t0, members, cfg, stack = time.perf_counter(), pop.members, pop.cfg, pop.stack
    runs = [m.run for _, m in members]
    # each member's --lr, at the same step of the same schedule
    pop.opt.param_groups[0]["lr"] = torch.tensor([r.lr_now() for r in runs], dtype=torch.float64)
    batches = collect_all(
        stack,
        runs[0].tok,
        [r.step_prompts() for r in runs],
        cfg.group_size,
        [r.reward for r in runs],
        [r.gens["rollout"] for r in runs],
        cfg.max_new_tokens,
        cfg.temperature,
        members[0][1].algo.sampler,
        cfg.unfinished_reward,
    )
    for j, (_, m) in enumerate(members):  # it leaves after this step (its update is never kept)
        if isinstance(batches[j], ValueError):
            m.error, batches[j] = stopped_line(batches[j], m.run.step), None
    some = next((b for b in batches if b is not None), None)
    if some is None:  # every member failed
        return
    # a failed member's slot: any rows, its update not kept
    rows = stacked_rows([(b or some).gen for b in batches])
    rewards = torch.stack([(b or some).rewards for b in batches])
    with torch.no_grad():
        logprobs = lambda weights: generation_logprobs(weights, rows, cfg.temperature, True)
        ref_logp, ref_logits = logprobs(pop.ref) if pop.update.needs_ref else (None, None)
        old_logp = logprobs(stack)[0] if pop.update.needs_old_logp else None
    probes = step_probes(cfg, rows, None if pop.anchor_rows is None else lambda: pop.anchor_rows)
    pop.guard = StepGuard(stack, probes, previous=pop.guard) if probes else None
    algos = [m.algo for _, m in members]
    step = Rollouts(
        [], [], rows, rewards, cfg.group_size, old_logp, ref_logp, ref_logits, batches, runs, algos
    )
    figures = pop.update(stack, pop.ref, pop.opt, step)
    trust = pop.guard.enforce(stack) if pop.guard is not None else {}
    stack.copy_to([r.policy for r in runs])  # each member's own GPT, for its own forwards
    step_time, rows = time.perf_counter() - t0, _rows(members, pop.update, figures, trust)
    # a member whose losses are not finite ends in end_step, unevaluated
    evaluated = [members[j][1] for j, row in rows.items() if finite_losses(row)]
    evaluations = evaluate_members([m for m in evaluated if m.run.evaluating()])
    outcome = batch_figures(rewards, step.mask.sum(-1).float()).tolist()  # rewards, lengths
    if runs[0].renews_ref():  # π_ref ← π_θ (a detached copy), as rl/loop.run's
        pop.ref = stack.rows(list(range(len(runs))))
    copies = host_copies(stack, pop.ref, pop.opt, *pop.update.stacks)  # made once, on first use
    for j, row in rows.items():
        m = members[j][1]
        try:
            trained = partial(member_trained, copies, j, m, pop.update, pop.opt)
            args = (batches[j], row, step_time, m.logger, evaluations.get(id(m)), outcome[j])
            m.run.end_step(trained, *args)
        except UsageError as e:
            m.error = str(e)
        except Exception as e:  # noqa: BLE001 (its own failure, bad weights: the others go on)
            m.error = f"{type(e).__name__}: {e}"
        m.batch = batches[j]


def _rows(members: list, update, figures: dict, trust: dict) -> dict:
    """Each live member's metrics row {j: row} (the update's `row`, then the trust region's),
    every member's read back at once; a member whose gradient was not finite gets its single run's
    error instead."""
    values = torch.stack([*figures.values(), *trust.values()]).tolist()  # one read
    own, region = dict(zip(figures, values)), dict(zip(trust, values[len(figures) :]))
    norms = [v for k, v in own.items() if isinstance(k, tuple) and k[-1] == "grad_norm"]
    rows = {}
    for j, (_, m) in enumerate(members):
        bad = next((n[j] for n in norms if not math.isfinite(n[j])), None)
        if bad is not None and not m.error:
            m.error = nonfinite_gradient(bad, m.run.step + 1)
        if not m.error:
            mine = update.row({k: v[j] for k, v in own.items()}, m.algo)
            rows[j] = {**mine, **{k: v[j] for k, v in region.items()}}
    return rows
