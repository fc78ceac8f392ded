"""compare's figures of a sweep's runs (intervals.png is interval_figure.py's):

curves.png    exact target rate against wall seconds and against sampled tokens (mean and
              min–max band over seeds)
frontier.png  where the runs ended, each algorithm as the median of its runs with their
              interquartile range as a cross (its runs as faint dots): on food its final E[r]
              against its exact KL(π_θ‖π_ref) over the 13 outcomes on the EXACT reward–KL
              frontier (exact/frontier.py: no policy lies above it), once whole and once
              zoomed to the runs; elsewhere E[r] against the exact KL per token; and E[r]
              against the worst other-person drift
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from minigrpo.tools.interval_figure import style


def _value(v) -> float:
    return float("nan") if v is None else float(v)


def draw_curves(results: dict[str, list[dict]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    fig.suptitle(f"{title}\nexact target rate, mean and min–max over seeds", fontsize=9)
    for i, (algo, runs) in enumerate(results.items()):
        if not runs:
            continue
        for ax, key, label in (
            (axes[0], "secs", "wall seconds (sum of step times)"),
            (axes[1], "tokens", "sampled tokens"),
        ):
            n = min(len(c["target"]) for c in runs)
            xs = np.mean([c[key][:n] for c in runs], axis=0)
            ys = np.array([c["target"][:n] for c in runs])
            ax.plot(xs, ys.mean(0), color=f"C{i % 10}", label=algo)
            ax.fill_between(xs, ys.min(0), ys.max(0), color=f"C{i % 10}", alpha=0.2)
            ax.set_xlabel(label)
    for ax in axes:
        ax.set_ylabel("exact target rate (higher is better)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _crosses(ax, results: dict, x_key: str, y_key: str) -> None:
    """Each algorithm: its runs as faint dots, their median with the interquartile range a cross."""
    for k, (algo, runs) in enumerate(results.items()):
        xs = np.array([_value(c["final"].get(x_key)) for c in runs])
        ys = np.array([_value(c["final"].get(y_key)) for c in runs])
        ok = np.isfinite(xs) & np.isfinite(ys)
        if not ok.any():
            continue
        xs, ys, st = xs[ok], ys[ok], style(k)
        ax.scatter(xs, ys, s=8, color=st["color"], alpha=0.3, lw=0)
        (x25, x50, x75), (y25, y50, y75) = (
            np.percentile(xs, [25, 50, 75]),
            np.percentile(ys, [25, 50, 75]),
        )
        ax.errorbar(
            [x50],
            [y50],
            xerr=[[x50 - x25], [x75 - x50]],
            yerr=[[y50 - y25], [y75 - y50]],
            color=st["color"],
            marker=st["marker"],
            ms=6,
            lw=1.5,
            capsize=2,
            label=algo,
        )


def draw_frontier(results: dict[str, list[dict]], path: Path, title: str, curve=None) -> None:
    """frontier.png (module docstring); `curve`: the exact frontier {kl, expected_reward} (food),
    None elsewhere."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import MaxNLocator

    results = {a: runs for a, runs in results.items() if runs}
    panels = 3 if curve is not None else 2
    fig, axes = plt.subplots(1, panels, figsize=(4.6 * panels + 1.6, 4.2))
    fig.suptitle(
        f"{title}\nwhere each run ended: median and interquartile range over seeds (dots: runs)",
        fontsize=9,
    )
    y = "expected_reward" if curve is not None else "exact_reward"
    if curve is not None:
        whole, zoom, drift = axes
        for ax in (whole, zoom):
            ax.plot(curve["kl"], curve["expected_reward"], color="black", lw=1, zorder=0)
        _crosses(zoom, results, "kl_ref", y)
        whole.plot([], [], color="black", lw=1, label="exact frontier (no policy above it)")
        ends = [
            (_value(c["final"]["kl_ref"]), _value(c["final"][y]))
            for r in results.values()
            for c in r
        ]
        ends = np.array([e for e in ends if np.isfinite(e).all()] or [(0.0, 0.0)])
        (x0, y0), (x1, y1) = ends.min(0), ends.max(0)
        dx, dy = max(x1 - x0, 1e-3) * 0.15, max(y1 - y0, 1e-4) * 0.15
        zoom.set_xlim(x0 - dx, x1 + dx)
        zoom.set_ylim(y0 - dy, min(y1 + dy, 1.0 + dy))
        whole.add_patch(
            Rectangle((x0 - dx, y0 - dy), x1 - x0 + 2 * dx, y1 - y0 + 2 * dy, fill=False, lw=1)
        )
        whole.set_xlim(0, 1.15 * max(x1, 0.1))
        whole.set_title("whole frontier (the box: the next panel)", fontsize=8)
        zoom.set_title("zoomed to the runs", fontsize=8)
        whole.legend(fontsize=7, loc="lower right")
        for ax in (whole, zoom):
            ax.set_xlabel("exact KL(π‖π_ref) over the target prompt's outcomes", fontsize=8)
    else:
        zoom, drift = axes
        _crosses(zoom, results, "kl_exact", y)
        zoom.set_xlabel("exact KL to π_ref per token (lower = closer)", fontsize=8)
    _crosses(drift, results, "worst_drift", y)
    drift.set_xlabel("worst other-person drift, TV (lower is better)", fontsize=8)
    for ax in axes:
        ax.set_ylabel("final exact expected reward (higher is better)", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.grid(alpha=0.3)
    handles, labels = drift.get_legend_handles_labels()
    if handles:
        drift.legend(
            handles,
            labels,
            fontsize=7,
            loc="center left",
            bbox_to_anchor=(1.01, 0.5),
            frameon=False,
        )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
