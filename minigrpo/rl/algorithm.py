"""What an RL algorithm must provide to the shared run (rl/loop.py), written down. GRPO (grpo.py)
and PPO (ppo.py) implement it; `rl.run(cfg, factory, name, panels)` builds one with `factory(run)`.

The run owns the policy, π_ref, the optimiser, the anchor, the generators and the loop; an algorithm
owns its update and any extra state (PPO's critic, its adaptive β). During `update` it may call back
into the run for two things only: `run.anchor_term()` (the preservation loss on a fresh anchor
minibatch) and `run.clip_and_step(opt, loss, params)` (backward, gradient clip, optimiser step).
"""

from __future__ import annotations

from typing import Protocol

import torch

from minigrpo.rl.rollout import RolloutBatch, Sampler


class Algorithm(Protocol):
    # compute π_ref's log-probs at rollout time (False: the rollout's ref_logp is None)
    needs_ref: bool
    needs_ref_logits: bool  # keep π_ref's full logits in the rollout (the exact KL needs them)
    # compute π_old's log-probs at rollout time (else the first update's forward gives them)
    needs_old_logp: bool
    # where rollouts come from when not π_old (rollout.Sampler; GRPO's --sample-* flags)
    sampler: Sampler | None

    def parameters(self) -> list[torch.nn.Parameter]:
        """Everything the optimiser updates (the policy, and e.g. PPO's critic)."""

    def update(self, batch: RolloutBatch, opt) -> dict[str, float]:
        """All inner updates for one rollout; returns the step's statistics (numbers only)."""

    def state_dict(self) -> dict:
        """The algorithm's own state for checkpoints (not the policy's, not the optimiser's)."""

    def load_state_dict(self, state: dict) -> None: ...


def rollout_flags(algo: Algorithm) -> dict:
    """What rollout.collect takes from an algorithm: which log-probs and logits to compute, and the
    sampler."""
    return {
        "ref_logp": algo.needs_ref,
        "keep_ref_logits": algo.needs_ref_logits,
        "old_logp": algo.needs_old_logp,
        "sampler": algo.sampler,
    }
