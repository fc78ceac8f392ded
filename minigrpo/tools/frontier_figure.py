"""frontier.png of `python -m minigrpo.optimum`: the exact reward–KL frontier, π_ref and the β → 0
limit marked, and a few β along the way (spread_marks); and how its tables print a number."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

from minigrpo.util.outputs import write_atomic

# frontier.png marks a β of the table's only this far (× the β → 0 KL) from the others
MARK_SPACING = 0.08


def spread_marks(points: list[dict]) -> list[dict]:
    """The finite, non-zero β points at least MARK_SPACING·(the β → 0 KL) apart in KL, and from both
    ends."""
    room = MARK_SPACING * points[-1]["kl"]
    kept = [points[0], points[-1]]
    for p in points[1:-1]:
        if all(abs(p["kl"] - k["kl"]) >= room for k in kept):
            kept.append(p)
    return kept[2:]


def draw_frontier(points: list[dict], marks: list[dict], path: Path, title: str) -> None:
    """frontier.png: E[r] against KL(π‖π_ref), π_ref and the β → 0 limit marked, and a few β along
    the way."""
    # a reward near a float's limit overflows the tick arithmetic: nothing to say
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(
            [p["kl"] for p in points],
            [p["expected_reward"] for p in points],
            lw=1.5,
            label="exact frontier",
        )
        ax.plot(points[0]["kl"], points[0]["expected_reward"], "ko", label="π_ref (β = ∞)")
        ax.plot(points[-1]["kl"], points[-1]["expected_reward"], "k*", ms=10, label="β → 0")
        for m in marks:
            ax.plot(m["kl"], m["expected_reward"], "o", color="tab:orange", ms=4)
            ax.annotate(
                f"β={m['beta']:g}",
                (m["kl"], m["expected_reward"]),
                textcoords="offset points",
                xytext=(6, -10),
                fontsize=8,
            )
        ax.set(xlabel="KL(π ‖ π_ref), nats", ylabel="E_π[r]", title=title)
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
        plt.close(fig)
        write_atomic(path, buf.getvalue(), what="figure")


def number(x: float) -> str:
    """Four decimals, or four significant digits where that would print dozens of digits (a reward
    of 1e308)."""
    return f"{x:.4f}" if abs(x) < 1e6 else f"{x:.4g}"
