"""The RL run shared by every algorithm (GRPO and its variants, PPO): the outer loop `run()`. An
algorithm supplies `update`; the run's set-up and state are rl/run_state.py (Run), its per-step
bookkeeping rl/bookkeeping.py, its checkpoints rl/checkpoints.py.

Each step:  collect a rollout (rollout.py)  ->  algorithm.update (its inner updates)  ->  exact
evaluation (every --eval-every steps, default every step: one batched forward for all people)  ->
the stop rule (stopping.py: goal reached and stable, plateau, or the --steps cap). Checkpoints
(every --ckpt-every steps, at the end, and on Ctrl-C; rl/checkpoints.py) hold all the run, so
`--resume` gives the same metrics on CPU as an uninterrupted run. At the end: summary.json,
samples.txt and metrics.png (not with --no-plot; `python -m minigrpo.metrics <out>` draws it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from minigrpo.lm.optim import AdamW
from minigrpo.rl.algorithm import Algorithm, rollout_flags
from minigrpo.rl.config import RLConfig
from minigrpo.rl.report import StopOnCtrlC, stopped_line
from minigrpo.rl.rollout import collect
from minigrpo.rl.run_state import Run
from minigrpo.rl.trust_region import StepGuard, step_probes
from minigrpo.util.cli import UsageError
from toy_tasks.rewards import RewardError


def run(
    cfg: RLConfig, algo_factory: Callable[[Run], Algorithm], algo_name: str, panels, log=print
) -> dict:
    """Train with the algorithm built by `algo_factory(run)` (minigrpo/rl/algorithm.py); returns the
    summary."""
    r = Run(cfg, algo_name, log)
    algo = algo_factory(r)
    opt = AdamW(algo.parameters(), lr=cfg.lr)
    if r.resume_state:
        r.restore(algo, opt)
    logger = r.begin()
    trained = lambda: r.trained(algo, opt)  # what a checkpoint holds of the training
    last_batch, guard = None, None
    try:
        with StopOnCtrlC() as stop:
            while r.step < cfg.steps and not stop.requested and r.stop_reason is None:
                t0 = time.perf_counter()
                opt.param_groups[0]["lr"] = r.lr_now()
                batch = collect(
                    r.policy,
                    r.ref,
                    r.tok,
                    r.step_prompts(),
                    cfg.group_size,
                    r.reward,
                    r.gens["rollout"],
                    cfg.max_new_tokens,
                    cfg.temperature,
                    cfg.unfinished_reward,
                    progress=lambda k, n: r.log(
                        f"  step {r.step + 1}: scored {k}/{n} completions (the reward is slow)"
                    ),
                    **rollout_flags(algo),
                )
                anchor_rows = r.anchor_probe_rows if r.anchor is not None else None
                probes = step_probes(cfg, batch.gen, anchor_rows)  # the rollout, the anchor set
                # the trust region's snapshot
                guard = StepGuard(r.policy, probes, previous=guard) if probes else None
                stats = algo.update(batch, opt)
                if guard is not None:
                    stats.update({k: v.item() for k, v in guard.enforce(r.policy).items()})
                if r.renews_ref():
                    r.ref.load_state_dict(r.policy.state_dict())
                r.end_step(trained, batch, stats, time.perf_counter() - t0, logger)
                last_batch = batch
    # a user reward raised or returned a non-finite value: one line, no traceback
    except RewardError as e:
        raise UsageError(stopped_line(e, r.step)) from None
    finally:
        logger.close()
    # Ctrl-C: the step in flight was finished: a consistent checkpoint
    if stop.requested and r.stop_reason is None:
        r.interrupted(trained())
    return r.finish(last_batch, panels)
