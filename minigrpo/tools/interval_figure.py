"""intervals.png: compare's interval estimates (intervals.Comparison) drawn, one panel per figure
(each algorithm's IQM with its 95 % interval, the baseline's IQM as a dashed line, an algorithm
called better or worse than the baseline drawn filled, any other hollow), and a last panel of the
target rate by step over the climb (each algorithm's IQM with its interval as a band), the
algorithms named in a legend beside it."""

from __future__ import annotations

from pathlib import Path

from minigrpo.tools.bars import BARS
from minigrpo.tools.intervals import SCORES, Bootstraps, Comparison, band_calls, verdict

MARKERS = "osD^vP<>Xph*"
STYLES = ["-", "--", "-.", ":"]


def style(k: int) -> dict:
    """The k-th algorithm's colour, marker and line style (ten colours, then the styles differ)."""
    return {"color": f"C{k % 10}", "marker": MARKERS[k % len(MARKERS)], "ls": STYLES[k // 10 % 4]}


def draw_intervals(
    c: Comparison,
    results: dict[str, list[dict]],
    path: Path,
    title: str,
    boot: Bootstraps | int = 1,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    boot = Bootstraps.of(boot)
    algos, figures = c.algos, c.figures
    fig, axes = plt.subplots(
        1,
        len(figures) + 1,
        figsize=(3.6 * len(figures) + 6.2, 1.6 + 0.32 * len(algos)),
        gridspec_kw={"width_ratios": [1] * len(figures) + [1.6]},
    )
    fig.suptitle(
        f"{title}\nIQM and 95 % BCa bootstrap interval over seeds; dashed: the baseline "
        f"{c.baseline}'s IQM; filled: called better or worse than it, hollow: not called",
        fontsize=9,
    )
    for ax, s in zip(axes, figures):
        ax.axvline(c.iqm[c.baseline][s].value, color="grey", ls="--", lw=0.8)
        for y, a in enumerate(algos):
            e, st = c.iqm[a][s], style(y)
            ax.plot([e.low, e.high], [y, y], color=st["color"], lw=4, alpha=0.5)
            called = a == c.baseline or verdict(c, s, a) in ("better", "worse")
            ax.plot(
                [e.value],
                [y],
                st["marker"],
                color=st["color"],
                mfc=st["color"] if called else "white",
            )
        ax.set_yticks(range(len(algos)), algos if ax is axes[0] else [""] * len(algos))
        ax.tick_params(labelsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4), useOffset=False)
        what = SCORES[s][0].split(":")[0]
        ax.set_xlabel(f"{what} ({'higher' if SCORES[s][1] else 'lower'} is better)", fontsize=8)
        ax.set_ylim(len(algos) - 0.5, -0.5)  # the first algorithm on top
        ax.grid(alpha=0.3, axis="x")
    ax = axes[-1]
    found = iter(boot.made([call for a in algos for call in band_calls(results[a])]))
    last = 0
    for k, a in enumerate(algos):
        length = min(len(cv["target"]) for cv in results[a])
        steps = results[a][0]["steps"][:length]
        band = [next(found) for _ in steps]
        st = style(k)
        ax.plot(steps, [e.value for e in band], color=st["color"], ls=st["ls"], label=a)
        ax.fill_between(
            steps, [e.low for e in band], [e.high for e in band], color=st["color"], alpha=0.15
        )
        # the climb: until the IQM first holds 0.99
        last = max(last, next((t for t, e in zip(steps, band) if e.value >= 0.99), steps[-1]))
    ax.axhline(BARS["final"], color="black", ls="--", lw=0.8, label=f"goal {BARS['final']}")
    ax.set_xlim(0, max(1, 1.25 * last))
    ax.set_xlabel("step (the climb; the runs go on to their last step)", fontsize=8)
    ax.set_ylabel("exact target rate (higher is better)", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
