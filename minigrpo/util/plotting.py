"""A grid of metric plots (PNG). matplotlib is imported here only, and lazily, so no algorithm module pulls in a
plotting library."""

from __future__ import annotations

import math


def plot_panels(rows: list[dict], panels: list[tuple[str, list[str]]], path, x: str = "step",
                ncols: int = 3, title: str | None = None) -> None:
    """One subplot per (title, [keys]) panel, all sharing the x axis; rows missing a key are skipped.

    Drawn for speed: a bare Figure on the Agg canvas (pyplot is never imported), margins fixed in inches instead of
    tight_layout (which draws every tick label once more to measure it), titles at a fixed height (matplotlib
    otherwise measures each axis' tick labels to place them)."""
    from matplotlib.figure import Figure

    panels = [(t, keys) for t, keys in panels if any(k in r for r in rows for k in keys)]
    if not panels:
        return
    nrows = math.ceil(len(panels) / ncols)
    width, height = 4.2 * ncols, 2.8 * nrows + (0.4 if title else 0)
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=0.6 / width, right=1 - 0.15 / width, bottom=0.5 / height,
                        top=1 - (0.75 if title else 0.35) / height, wspace=0.25, hspace=0.3)
    axes = fig.subplots(nrows, ncols, sharex=True, squeeze=False)
    for ax, (panel_title, keys) in zip(axes.flat, panels):
        for key in keys:
            pts = [(r[x], r[key]) for r in rows if key in r and r[key] is not None and x in r]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=key, lw=1.2, marker="." if len(pts) < 30 else None)
        ax.set_title(panel_title, fontsize=9, y=1.0, pad=4)
        ax.locator_params(nbins=5)  # matplotlib's default (up to 10) builds twice the tick objects
        ax.grid(alpha=0.3)
        if len(keys) > 1 and ax.lines:
            ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel(x)
    if title:
        fig.suptitle(title, y=1 - 0.1 / height, va="top")
    fig.savefig(path, dpi=90)
