"""What a resumed run (--resume) must keep: the same experiment. Its config.json holds every setting
of the experiment, each of its type (check_saved_config), and a flag given with --resume may change
only how long the run goes and how it reports (RESUMABLE, check_resume_flags).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from minigrpo.util.cli import UsageError

# flags a resumed run may change: how long it runs and how it reports, never what experiment it is
RESUMABLE = {
    "steps",
    "goal",
    "goal_patience",
    "goal_malformed",
    "goal_drift",
    "plateau",
    "eval_every",
    "ckpt_every",
    "quiet",
    "verbose",
    "plot",
    "threads",
    "device",
    "resume",
    "out",
    "overwrite",
    "init",
}


def check_resume_flags(cfg, saved: dict, folder: str, argv) -> None:
    """A resumed run is the same experiment: refuse a flag that would change it, and an --out
    elsewhere."""
    out_given = any(a == "--out" or a.startswith("--out=") for a in argv or [])
    if out_given and Path(cfg.out).resolve() != Path(folder).resolve():
        raise UsageError(
            f"--resume {folder!r} writes into its own folder; drop --out {cfg.out!r} "
            f"(or copy the folder first)"
        )
    changed = [k for k, v in saved.items() if k not in RESUMABLE and getattr(cfg, k) != v]
    if changed:
        k = changed[0]
        raise UsageError(
            f"--resume {folder!r} continues the same experiment: --{k.replace('_', '-')} was "
            f"{saved[k]!r} and cannot become {getattr(cfg, k)!r} (start a new run with --out)"
        )


# a saved setting's type, from its field's annotation (int may stand for a float: JSON writes 1.0
# as 1 in other writers)
_TYPES = {
    "float": (int, float),
    "int": (int,),
    "bool": (bool,),
    "str": (str,),
    "None": (type(None),),
}


def check_saved_config(cls, saved: dict, path: Path) -> None:
    """A resumed run's config.json holds every setting of its experiment (all but RESUMABLE), each
    of its field's type: else one line naming the file and the key, never a default filled in or a
    flag the user never passed blamed."""
    for f in fields(cls):
        if f.name in RESUMABLE or f.init is False:
            continue
        if f.name not in saved:
            raise UsageError(
                f"{path}: the setting {f.name!r} is missing, so the run cannot be continued as "
                "the same experiment (restore the file, or start a new run with --out)"
            )
        kinds = [_TYPES.get(t.strip()) for t in str(f.type).split("|")]
        v = saved[f.name]
        ok = any(
            isinstance(v, k) and not (bool in (type(v),) and bool not in k) for k in kinds if k
        )
        if all(kinds) and not ok:
            raise UsageError(
                f"{path}: the setting {f.name!r} is {v!r}, not {f.type} (restore the file, or "
                "start a new run with --out)"
            )
