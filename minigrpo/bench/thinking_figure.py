"""The thinking section's figure (bench/thinking.py): four panels over the steps, each algorithm's
median over its seeds with the 25th–75th percentile band.

    draw(curves, png)   curves: {panel title: {label: (steps (S,), values (R, S))}}
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def draw(curves: dict[str, dict[str, tuple]], png: Path) -> Path:
    import matplotlib  # here: the bench's other sections never pay for pyplot's import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.4))
    for ax, (title, lines) in zip(np.atleast_1d(axes), curves.items()):
        for label, (steps, values) in lines.items():
            q = np.nanpercentile(np.asarray(values, dtype=float), [25, 50, 75], axis=0)
            ax.plot(steps, q[1], label=label, lw=1.6)
            ax.fill_between(steps, q[0], q[2], alpha=0.25)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)
    return png
