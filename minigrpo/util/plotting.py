"""A grid of metric plots (PNG). matplotlib is imported here only, and lazily, so no algorithm
module pulls in a plotting library."""

from __future__ import annotations

import math


def plot_panels(
    rows: list[dict],
    panels: list[tuple],
    path,
    x: str = "step",
    ncols: int = 3,
    title: str | None = None,
    log_y: tuple[str, ...] = (),
    log_x: bool = False,
    fit: bool = False,
) -> None:
    """One subplot per (title, [keys]) or (title, [keys], [(y, label)]) panel, all sharing the x
    axis; rows missing a key are skipped. Each (y, label) is a dashed horizontal line, labelled on
    it (a bar the curves are judged by); the panel's y-range includes it. Panels titled in `log_y`
    get a logarithmic y axis; `log_x`: x on a log scale past 1, linear below (0 shows).

    Drawn for speed: a bare Figure on the Agg canvas (pyplot is never imported), margins fixed in
    inches instead of tight_layout (which draws every tick label once more to measure it), titles at
    a fixed height (matplotlib otherwise measures each axis' tick labels to place them). `fit`: laid
    out to its labels instead (matplotlib's constrained layout, slower: docs/performance.md, "Small
    choices"), for a figure whose tick labels may be wide."""
    from matplotlib.figure import Figure

    panels = [
        (p[0], p[1], p[2] if len(p) > 2 else [])
        for p in panels
        if any(k in r for r in rows for k in p[1])
    ]
    if not panels:
        return
    nrows = math.ceil(len(panels) / ncols)
    width, height = 4.2 * ncols, 2.8 * nrows + (0.4 if title else 0)
    fig = Figure(figsize=(width, height), layout="constrained" if fit else None)
    if not fit:
        fig.subplots_adjust(
            left=0.75 / width,
            right=1 - 0.15 / width,
            bottom=0.5 / height,
            top=1 - (0.75 if title else 0.35) / height,
            wspace=0.25,
            hspace=0.3,
        )
    axes = fig.subplots(nrows, ncols, sharex=True, squeeze=False)
    for ax, (panel_title, keys, lines) in zip(axes.flat, panels):
        for key in keys:
            pts = [(r[x], r[key]) for r in rows if key in r and r[key] is not None and x in r]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=key, lw=1.2, marker="." if len(pts) < 30 else None)
        # labels of close bars never overlap
        places = [(0.02, "left"), (0.98, "right"), (0.5, "center")]
        for (y, label), color, (at, align) in zip(lines, ("C3", "C2", "C4"), places):
            ax.axhline(y, color=color, ls="--", lw=1)
            ax.text(
                at,
                y,
                label,
                color=color,
                fontsize=7,
                ha=align,
                va="bottom",
                transform=ax.get_yaxis_transform(),
            )  # x in the axes' width, y in data
        if lines:
            ax.margins(y=0.12)  # room for the label of a bar at the top of the range
        ax.set_title(panel_title, fontsize=9, y=1.0, pad=4)
        if panel_title in log_y:
            ax.set_yscale("log")
        else:
            # matplotlib's default (up to 10) builds twice the tick objects
            ax.locator_params(nbins=5)
        ax.grid(alpha=0.3)
        if len(keys) > 1 and ax.lines:
            ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel(x + (" (log scale)" if log_x else ""))
        if log_x:
            ax.set_xscale("symlog", linthresh=1, linscale=0.5)
    if title:
        fig.suptitle(title, **({} if fit else {"y": 1 - 0.1 / height, "va": "top"}))
    fig.savefig(path, dpi=90)
