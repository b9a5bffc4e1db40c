"""The course's standard charts: labelled axes with units, error bars from the IQR."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter


def value_label(value: float) -> str:
    """A bar's label: thousands separators from 1000 up (527,790), 3 significant digits below."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def bar_chart(df, x: str, y: str, *, ylabel: str, title: str = "", low: str | None = None,
              high: str | None = None, ax=None, annotate: bool = True):
    """Bars of ``df[y]`` per ``df[x]``; ``low``/``high`` columns (e.g. q1/q3) become error bars."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    values = df[y].to_numpy(dtype=float)
    yerr = None
    if low is not None and high is not None:
        yerr = [values - df[low].to_numpy(dtype=float), df[high].to_numpy(dtype=float) - values]
    bars = ax.bar(df[x].astype(str), values, yerr=yerr, capsize=3, color="#4C72B0")
    if annotate:
        for bar, value in zip(bars, values, strict=True):
            ax.annotate(value_label(value), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: value_label(v)))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=20)
    ax.figure.tight_layout()
    return ax


def line_chart(df, x: str, y: str, *, hue: str | None = None, xlabel: str, ylabel: str,
               title: str = "", logx: bool = False, logy: bool = False, ax=None):
    """One line per ``hue`` group of ``df[y]`` against ``df[x]``."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.6))
    groups = df.groupby(hue, sort=False) if hue else [(y, df)]
    for name, group in groups:
        ax.plot(group[x], group[y], marker="o", markersize=3, label=str(name))
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if hue:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.figure.tight_layout()
    return ax


def difference_chart(df, x: str, y: str, *, hue: str, baseline: str, xlabel: str, ylabel: str,
                     title: str = "", ax=None):
    """``df[y]`` minus the ``baseline`` group's ``df[y]`` at the same ``x``, one line per other
    ``hue`` group: curves that lie on top of each other become readable. The y axis is
    symmetric-log, linear up to a thousandth of the largest difference (or the smallest one seen,
    when larger), so rounding noise near zero does not fill the plot while both signs show."""
    base = df[df[hue] == baseline].set_index(x)[y]
    others = df[df[hue] != baseline]
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.6))
    smallest, largest = None, 0.0
    for name, group in others.groupby(hue, sort=False):
        diff = group.set_index(x)[y] - base.reindex(group[x]).to_numpy()
        ax.plot(diff.index, diff.to_numpy(), marker="o", markersize=2, lw=1, label=str(name))
        nonzero = diff.abs()[diff.abs() > 0]
        if not nonzero.empty:
            low = float(nonzero.min())
            smallest = low if smallest is None else min(smallest, low)
            largest = max(largest, float(nonzero.max()))
    ax.axhline(0.0, color="gray", lw=0.8)
    if smallest is not None:
        ax.set_yscale("symlog", linthresh=max(smallest, 1e-3 * largest))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.figure.tight_layout()
    return ax
