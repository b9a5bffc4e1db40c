"""Notebook 03's readings of its tables: verdict sentences built from the measurements, and the
charts (achieved bandwidth per dtype and candidate, and against hidden size)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from helpers import fusion, plots
from helpers.norm_bench import NORMS, PASSES


def bars(df, pass_: str, copy_gbps: float):
    """Grouped bars: GB/s per dtype and candidate, one panel per norm, the copy ceiling dashed."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, norm in zip(axes, NORMS, strict=True):
        sub = df[(df["norm"] == norm) & (df["pass"] == pass_)]
        wide = sub.pivot(index="dtype", columns="candidate", values="gbps")
        wide = wide.reindex(list(dict.fromkeys(sub["dtype"])))
        wide.plot.bar(ax=ax, rot=0, width=0.8)
        ax.axhline(copy_gbps, ls="--", color="gray", lw=1, label="copy ceiling")
        ax.set_title(f"{norm}, {pass_}")
        ax.set_xlabel("dtype (input->output where they differ)")
        ax.set_ylabel("achieved bandwidth (GB/s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def sweep(df, copy_gbps: float):
    """GB/s against hidden size, one line per candidate, one panel per norm and pass."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5), sharex=True)
    for row, pass_ in zip(axes, PASSES, strict=True):
        for ax, norm in zip(row, NORMS, strict=True):
            sub = df[(df["norm"] == norm) & (df["pass"] == pass_)]
            plots.line_chart(sub, "hidden", "gbps", hue="candidate", xlabel="hidden size",
                             ylabel="achieved bandwidth (GB/s)", title=f"{norm}, {pass_}",
                             logx=True, ax=ax)
            ax.axhline(copy_gbps, ls="--", color="gray", lw=1)
            ax.set_xticks(sorted(set(sub["hidden"])), [str(h) for h in sorted(set(sub["hidden"]))])
            ax.minorticks_off()
            ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    fig.tight_layout()
    return fig


def eager_only_note(df, dtype: str) -> str:
    """' (eager torch only: ...)' for a mixed dtype when the table has torch.compile rows
    elsewhere (:meth:`helpers.norm_bench.Candidate.applies` runs no compiled candidate on mixed
    dtypes), else ''."""
    compiled = df["candidate"].str.startswith("torch.compile").any()
    if "->" not in dtype or not compiled:
        return ""
    return " (vs eager torch only: torch.compile is not run on mixed dtypes)"


def verdicts(df) -> str:
    """Per norm, dtype and pass: the fastest candidate (with any indistinguishable from it),
    and Apex against native and compiled."""
    lines = []
    for (norm, dtype, pass_), group in df.groupby(["norm", "dtype", "pass"], sort=False):
        names = list(group["candidate"])
        apex = [n for n in names if n.startswith("apex")]
        others = [n for n in names if not n.startswith("apex")]
        if len(names) == 1:
            lines.append(f"{norm} {dtype} {pass_}: only {names[0]} measured "
                         f"({float(group['median_ms'].iloc[0]):.3g} ms).")
            continue
        parts = [f"fastest {fusion.fastest_text(group)}{eager_only_note(df, dtype)}"]
        parts += [fusion.compare_rows(group, a, o) for a in apex for o in others]
        if not apex and len(others) > 1:
            parts += [fusion.compare_rows(group, others[1], others[0])]
        lines.append(f"{norm} {dtype} {pass_}: " + "; ".join(parts) + ".")
    return "\n".join(lines)


def fastest_summary(df, pass_: str = "forward+backward") -> str:
    """Per norm and dtype at one pass: the fastest candidate (and any indistinguishable from
    it, :func:`helpers.fusion.fastest_text`), its median time, GB/s and share of the copy
    ceiling."""
    lines = []
    for (norm, dtype), group in df[df["pass"] == pass_].groupby(["norm", "dtype"], sort=False):
        tied = fusion.tied_with_fastest(group)
        best = group[group["candidate"] == tied[0]].iloc[0]
        what = (f"only {best.candidate} measured" if len(group) == 1
                else f"fastest {fusion.fastest_text(group)}{eager_only_note(df, dtype)}")
        whose = f"; {best.candidate}" if len(tied) > 1 else ""  # the numbers are the first's
        lines.append(f"{norm} {dtype} {pass_}: {what}{whose}: {best.median_ms:.3g} ms, "
                     f"{best.gbps:.4g} GB/s ({best.pct_of_copy_ceiling:.0f}% of the copy "
                     "ceiling)")
    return "\n".join(lines)


def sweep_reading(df) -> str:
    """Per norm and pass: which candidate was fastest at each hidden size, as runs of sizes
    ("tie" where the two fastest cannot be told apart)."""
    lines = []
    for (norm, pass_), group in df.groupby(["norm", "pass"], sort=False):
        if group["candidate"].nunique() == 1:
            lines.append(f"{norm} {pass_}: only {group['candidate'].iloc[0]} measured")
            continue
        runs: list[list] = []
        for hidden, rows in group.groupby("hidden", sort=True):
            rows = rows.sort_values("median_ms")
            winner = rows.iloc[0]["candidate"]
            if len(rows) > 1:
                a, b = rows.iloc[0], rows.iloc[1]
                if fusion.is_tie(a.median_ms, b.median_ms, a_iqr=(a.q1_ms, a.q3_ms),
                                 b_iqr=(b.q1_ms, b.q3_ms)):
                    winner = "tie"
            if runs and runs[-1][0] == winner:
                runs[-1][2] = hidden
            else:
                runs.append([winner, hidden, hidden])
        text = ", ".join(f"{w} at {lo}" + (f"-{hi}" if hi != lo else "") for w, lo, hi in runs)
        lines.append(f"{norm} {pass_}: fastest {text}")
    return "\n".join(lines)


def overhead_reading(df, dtype: str, pass_: str = "forward+backward") -> str:
    """Per candidate at one dtype: ``call_ms`` (back-to-back calls, host included) next to the
    GPU time."""
    rows = df[(df["dtype"] == dtype) & (df["pass"] == pass_)]
    parts = [f"{r.candidate} {r.call_ms:.3g} vs {r.median_ms:.3g} ms" for r in rows.itertuples()]
    return f"{dtype} {pass_}, call_ms (host included) vs GPU time: " + "; ".join(parts)


def rounding_reading(correctness) -> str:
    """Per norm and half-precision dtype: Apex's output error next to torch's, from the table."""
    y = correctness[(correctness["tensor"] == "y") & ~correctness["dtype"].isin(["fp32"])]
    lines = []
    for (norm, dtype), group in y.groupby(["norm", "dtype"], sort=False):
        apex = group[group["candidate"].str.startswith("apex")]
        native = group[group["candidate"].str.startswith("torch ")]
        if apex.empty or native.empty:
            continue
        a, t = apex["max_rel_err"].max(), native["max_rel_err"].max()
        ratio = f"{a / t:.1f}x" if t > 0 else "n/a (torch exact)"
        lines.append(f"{norm} {dtype}: output error Apex {a:.1e}, torch {t:.1e} ({ratio})")
    if not lines:
        return "No Apex norm ran here, so there is no rounding comparison."
    return "\n".join(lines)
