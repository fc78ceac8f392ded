"""What an RL run's checkpoint holds, and --resume: the part of rl/loop.Run that reads and writes
model.pt.

A checkpoint is a regular one (lm/checkpoint.py: loadable by sample.py, usable as --init) whose
extra["rl"] holds the rest of the run: π_ref, the algorithm's own state, every generator's state
(the global ones a reward may draw from too), the anchor, the baseline, the reward window, the stop
rule and the peaks, so `--resume` gives the same metrics on CPU as an uninterrupted run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from minigrpo.lm.checkpoint import (
    CheckpointError,
    host_state,
    read_checkpoint,
    save_checkpoint,
    to_host,
)
from minigrpo.rl.preserve import Anchor
from minigrpo.rl.stopping import Peaks
from minigrpo.util.cli import UsageError
from minigrpo.util.runtime import global_rng_state, set_global_rng_state


@dataclass
class Trained:
    """What a run has trained, as its checkpoint holds it (RunCheckpoints.save)."""

    policy: dict  # the policy's weights by name, on the host
    ref: dict  # π_ref's
    algo: dict  # the algorithm's state_dict
    optimizer: dict  # AdamW's (lm/optim.adamw_state)


class RunCheckpoints:
    """rl/loop.Run's checkpoints (a base class: it reads and sets the run's own attributes)."""

    def _read_resume(self) -> dict:
        path = Path(self.cfg.resume) / "model.pt"
        try:
            state = read_checkpoint(path)
        except CheckpointError as e:
            raise UsageError(
                f"--resume {self.cfg.resume!r} has no usable checkpoint: {e}"
            ) from None
        rl = state.get("extra", {}).get("rl", {})
        # older minigrpo
        if "gens" not in rl or (rl.get("anchor") is not None and "weights" not in rl["anchor"]):
            raise UsageError(
                f"--resume {self.cfg.resume!r}: {path} is not an RL checkpoint of this version"
            )
        return state

    def trained(self, algo, opt) -> Trained:
        """What the run has trained, for its checkpoint (`save`)."""
        return Trained(
            host_state(self.policy), host_state(self.ref), algo.state_dict(), opt.state_dict()
        )

    def save(self, trained: Trained) -> None:
        """A regular checkpoint (loadable by sample.py, usable as --init) of the run's `trained`
        state (as Run.trained makes it) plus the rest of the run under extra["rl"], so --resume
        continues exactly."""
        rl_state = {
            "algo": self.algo_name,
            "config": asdict(self.cfg),
            "ref": trained.ref,
            "algo_state": to_host(trained.algo),
            "gens": {k: g.get_state() for k, g in self.gens.items()},
            "anchor": self.anchor.host_state() if self.anchor is not None else None,
            "baseline": self.baseline,
            "rewards_window": self.rewards_window,
            "stop_rule": self.stop_rule.state_dict(),
            "peaks": self.peaks.values,
            "stop_reason": self.stop_reason,
            "global_rng": global_rng_state(),  # what a user's reward may draw from
        }
        save_checkpoint(
            self.out / "model.pt",
            self.policy,
            self.tok,
            self.cfg.task,
            self.step,
            trained.optimizer,
            extra={"rl": rl_state},
            weights=trained.policy,
        )

    def restore(self, algo, opt) -> None:
        state = self.resume_state
        rl = state["extra"]["rl"]
        if rl["algo"] != self.algo_name:
            raise UsageError(
                f"--resume {self.cfg.resume!r} holds a {rl['algo']} run, not {self.algo_name}"
            )
        self.policy.load_state_dict(state["model"])
        self.ref.load_state_dict(rl["ref"])
        opt.load_state_dict(state["optimizer"])
        algo.load_state_dict(rl["algo_state"])
        for k, g in self.gens.items():
            g.set_state(rl["gens"][k])
        self.anchor = (
            Anchor.from_state_dict(rl["anchor"], self.device) if rl["anchor"] is not None else None
        )
        self.baseline = rl["baseline"]
        self.rewards_window = list(rl["rewards_window"])
        # the new flags win
        settings = ("goal", "patience", "plateau", "max_malformed", "max_drift")
        self.stop_rule.load_state_dict(
            {k: v for k, v in rl["stop_rule"].items() if k not in settings}
        )
        self.peaks = Peaks(rl["peaks"])
        if "global_rng" in rl:  # a checkpoint of an older minigrpo holds none
            set_global_rng_state(rl["global_rng"])
        self.step = state["step"]
        ended = rl["stop_reason"]
        if self.step >= self.cfg.steps:
            raise UsageError(
                f"--resume {self.cfg.resume!r}: the run already took {self.step} steps; "
                f"pass --steps N with N > {self.step} (the new cap, counted from step 0)"
            )
        if ended and not ended.startswith("cap"):
            if self.stop_rule.reason(self.step) is not None:  # it would stop again at once
                raise UsageError(
                    f"--resume {self.cfg.resume!r}: the run stopped at step {self.step} ({ended}); "
                    f"to train on, pass --goal 0 --plateau 0 (or a higher --goal) with --steps N"
                )
            self.log(
                f"resuming a run that had stopped ({ended}): the new --goal/--plateau let it "
                "continue"
            )
