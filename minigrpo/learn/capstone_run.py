"""The capstone's real run: `python -m minigrpo.grpo --reward pizza` with every function the learner
wrote plugged in, from the repository's pretrained model; it passes when ravin's exact P(pizza)
reaches GOAL. It runs in a child process that ends with the command (child.run), for at most
CAPSTONE_LIMIT_S; a run that does not learn names the exercises whose own tests fail.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from minigrpo.learn import child, workspace
from minigrpo.learn.path import PATH, TRAINER
from minigrpo.learn.runner import repo_root, run_tests

GOAL = 0.9  # the capstone passes when ravin's exact P(pizza) reaches this
CAPSTONE_LIMIT_S = 600  # the capstone's training run


def pretrained_model(root: Path) -> Path:
    """The checkpoint the capstone starts from by default: `python -m minigrpo.pretrain`'s, in the
    repository."""
    return root / "runs" / "pretrain" / "model.pt"


def capstone(
    folder, log=print, extra_args: tuple[str, ...] = (), init=None
) -> tuple[bool, float | None]:
    """Train with every function the learner wrote plugged in, from `init` (default: the
    repository's runs/pretrain/model.pt) -> (P(pizza) >= GOAL, the final P(pizza)); (False, None)
    and "pretrain first" when there is no pretrained model to start from."""
    root = repo_root()
    init = Path(init).resolve() if init is not None else pretrained_model(root)
    if not init.is_file():
        log(
            f"capstone: no pretrained model at {init}: pretrain first: python -m minigrpo.pretrain "
            f"(in {root}), then run the capstone again"
        )
        return False, None
    out = Path(folder).resolve() / "capstone"
    plugged = [ex for ex in PATH if workspace.status(ex, folder) == "written"]
    log(
        "capstone: python -m minigrpo.grpo --reward pizza with your "
        f"{', '.join(e.name for e in plugged)}"
    )
    argv = ["--reward", "pizza", "--init", str(init), "--out", str(out), "--overwrite", *extra_args]
    code = (
        "import sys; from minigrpo.learn.child import die_with_parent; die_with_parent(); "
        "from minigrpo.learn.workspace import install; install(sys.argv[1]); "
        "from minigrpo.grpo import main; main(sys.argv[2:])"
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    returncode, stdout, stderr = child.run(
        [sys.executable, "-c", code, str(Path(folder).resolve()), *argv],
        watch=lambda elapsed: elapsed > CAPSTONE_LIMIT_S,
        cwd=root,
        env=env,
    )
    lines = (stdout + stderr).strip().splitlines()
    for line in lines[-4:]:
        log("  " + line)
    summary = out / "summary.json"
    rate = (
        json.loads(summary.read_text()).get("target_rate")
        if summary.exists() and returncode is not None
        else None
    )
    ok = returncode == 0 and rate is not None and rate >= GOAL
    if ok:
        log(
            f"capstone passed: your GRPO took ravin's exact P(pizza) to {rate:.3f} (>= {GOAL}); "
            f"the metrics: {out / 'metrics.png'}"
        )
        lines = len((root / TRAINER).read_text().splitlines()) if (root / TRAINER).exists() else 0
        log(
            f"  now read {TRAINER}: GRPO in one file ({lines} lines), where your pieces make one "
            "step: the group advantages, the clipped surrogate, the exact KL and the aggregation; "
            "then minigrpo/grpo.py for what a real run adds (the anchor, the trust region, the "
            "stop rule) and where the variants plug in"
        )
        return True, rate
    if returncode is None:
        log(
            f"capstone: the run ran past {CAPSTONE_LIMIT_S} s: does one of your functions loop "
            "forever?"
        )
    else:
        log(
            f"capstone: the run did not learn: ravin's exact P(pizza) ended at "
            f"{'n/a' if rate is None else f'{rate:.3f}'} (needs >= {GOAL}); the metrics: "
            f"{out / 'metrics.png'}"
        )
    broken = [
        ex
        for ex in plugged
        if any(r["outcome"] == "failed" for r in run_tests(ex, folder)["results"])
    ]
    for ex in broken:
        log(
            f"  revisit exercise {ex.number} {ex.name}: it fails its own tests "
            f"({workspace.command(f'check {ex.number}', folder)})"
        )
    if not broken:
        log(
            "  every piece you wrote passes its tests: look at how grpo_loss puts them together "
            "(exercise 12)"
        )
    return False, rate
