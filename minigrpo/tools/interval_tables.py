"""compare's interval estimates (intervals.Comparison) as text: what table.md and the terminal say.

statement(c)         -> lines   the runs counted, the method, and a warning below MIN_RUNS runs
figure_table(c, s)   -> lines   per algorithm: runs, IQM [95 % CI], its IQM minus the
                                baseline's [95 % CI], P(better than the baseline) [95 % CI],
                                the permutation test's p and the verdict
better_matrix(c, s)  -> lines   P(row better than column) [95 % CI] for every pair
statistics_markdown(c) -> lines   all of it, a heading per figure (table.md)
printed_statistics(c)  -> lines   the terminal's: per figure the IQMs and the differences
"""

from __future__ import annotations

from minigrpo.tools.intervals import MIN_RUNS, SCORES, Comparison, verdict
from minigrpo.tools.stats import METHOD


def direction(figure: str) -> str:
    return "higher is better" if SCORES[figure][1] else "lower is better"


def statement(c: Comparison) -> list[str]:
    """What a reader needs before the numbers (module docstring)."""
    counts = {a: sorted(set(c.n[a].values())) for a in c.algos}
    runs = ", ".join(f"{a} {'/'.join(map(str, n))}" for a, n in counts.items())
    few = [f"{a} {min(n)}" for a, n in counts.items() if min(n) < MIN_RUNS]
    lines = [
        f"Runs counted per algorithm: {runs}. Figures: interquartile means (IQM) with {METHOD}. "
        f"Better: {'; '.join(f'{s}: {direction(s)}' for s in c.figures)}. Baseline: "
        f"{c.baseline} (the first algorithm). A difference from it is called only with "
        f"{MIN_RUNS} or more runs on both sides, when its interval leaves out 0 and its p, "
        f"Holm-adjusted over the {len(c.algos) - 1} algorithms tested against {c.baseline}, is "
        "< 0.05."
    ]
    if few:
        lines.append(
            f"**Fewer than {MIN_RUNS} runs** ({', '.join(few)}): the intervals are unreliable at "
            f"that n (a 95 % bootstrap interval covers less than 95 % of the time) and no "
            f"difference is called; run more seeds (--seeds {MIN_RUNS} or more)."
        )
    lines += [f"Left out: {line}." for line in c.left_out]
    return lines


def figure_table(c: Comparison, figure: str) -> list[str]:
    base = c.baseline
    lines = [
        f"| algorithm | runs | IQM [95 % CI] | IQM − {base} [95 % CI] | P(better than {base}) "
        f"[95 % CI] | permutation p | Holm p | against {base} |",
        "|---" * 8 + "|",
    ]
    for a in c.algos:
        n = f"{c.n[a][figure]}" + (
            f", {c.never[a]} never" if figure == "steps to 0.95" and c.never[a] else ""
        )
        cells = [a, n, c.iqm[a][figure].text()]
        if a == base:
            cells += ["baseline"] + ["-"] * 4
        else:
            cells += [
                c.difference[figure][a].text(),
                c.better[figure][a, base].text("{:.2f}"),
                f"{c.p[figure][a]:.3g}",
                f"{c.p_holm[figure][a]:.3g}",
                verdict(c, figure, a),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def better_matrix(c: Comparison, figure: str) -> list[str]:
    lines = [
        "| P(row better than column) | " + " | ".join(c.algos) + " |",
        "|---" * (1 + len(c.algos)) + "|",
    ]
    for a in c.algos:
        cells = ["-" if a == b else c.better[figure][a, b].text("{:.2f}") for b in c.algos]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    return lines


def statistics_markdown(c: Comparison) -> list[str]:
    lines = ["## Intervals and differences", "", *[x for line in statement(c) for x in (line, "")]]
    for figure in c.figures:
        lines += [
            f"### {SCORES[figure][0]} ({direction(figure)})",
            "",
            *figure_table(c, figure),
            "",
            f"P(row better than column) on the {figure} ({direction(figure)}; ties count half; "
            "0.5: no difference), each pair one bootstrap, so a cell and its mirror add to 1:",
            "",
            *better_matrix(c, figure),
            "",
        ]
    return lines


def printed_statistics(c: Comparison) -> list[str]:
    """Per figure: each algorithm's runs, IQM [95 % CI] and, against the baseline, the difference
    [95 % CI], p and the verdict, aligned; the statement's lines first."""
    lines = [line.replace("**", "") for line in statement(c)]  # no markdown in a terminal
    for figure in c.figures:
        rows = [
            [
                a,
                str(c.n[a][figure]),
                c.iqm[a][figure].text(),
                *(
                    ["baseline", "", ""]
                    if a == c.baseline
                    else [
                        c.difference[figure][a].text(),
                        f"p {c.p[figure][a]:.3g} (Holm {c.p_holm[figure][a]:.3g})",
                        verdict(c, figure, a),
                    ]
                ),
            ]
            for a in c.algos
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += [
            "",
            f"{SCORES[figure][0].split(':')[0]} ({direction(figure)}): runs, IQM [95 % CI], "
            f"IQM − {c.baseline} [95 % CI], permutation p (Holm-adjusted):",
            *["  " + "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows],
        ]
    return lines
