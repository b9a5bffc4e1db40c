"""The course's standard charts, drawn one way in every notebook: labelled axes with units, plain
numbers on bars and ticks, error bars from the IQR, differences to a baseline, and dashed
reference lines (a ceiling, a floor). matplotlib is imported when a chart is drawn (child
processes never need it); ``helpers.results.save_figure`` writes the PNG."""

from __future__ import annotations

LEGEND_FONTSIZE = 8
BAR_COLOR = "#4C72B0"


def _pyplot():
    """matplotlib's pyplot, imported when a chart is drawn."""
    import matplotlib.pyplot as plt

    return plt


def _axes(ax, figsize: tuple[float, float]):
    """``ax``, or the axes of a new figure of ``figsize``."""
    if ax is None:
        _, ax = _pyplot().subplots(figsize=figsize)
    return ax


def value_label(value: float) -> str:
    """A bar's label: thousands separators from 1000 up (527,790), 3 significant digits below."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def plain_numbers(axis) -> None:
    """Tick labels of ``axis`` (``ax.yaxis``, ``ax.xaxis``) in :func:`value_label`'s numbers."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _pos: value_label(v)))


def iqr_errors(df, y: str, low: str | None, high: str | None):
    """Error bars (below, above) for ``df[y]`` from the ``low``/``high`` columns (q1/q3), or
    None when either is not given."""
    if low is None or high is None:
        return None
    values = df[y].to_numpy(dtype=float)
    return [values - df[low].to_numpy(dtype=float), df[high].to_numpy(dtype=float) - values]


def data_ticks(ax, values, *, rotation: float = 0) -> None:
    """x ticks at the data's own values, in plain numbers (a log axis shows 4, 16, 64, not
    powers of ten or 2^k)."""
    sizes = sorted(set(values))
    ax.set_xticks(sizes, [value_label(v) for v in sizes])
    ax.minorticks_off()
    if rotation:
        ax.tick_params(axis="x", labelrotation=rotation, labelsize=8)


def reference_line(ax, y: float, label: str) -> None:
    """A dashed horizontal line at ``y`` (a ceiling, a floor), named in the legend."""
    ax.axhline(y, ls="--", color="gray", lw=1, label=label)
    ax.legend(fontsize=LEGEND_FONTSIZE)


def _finish(ax, *, xlabel: str, ylabel: str, title: str, legend: bool, grid: bool,
            layout: bool):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if legend:
        ax.legend(fontsize=LEGEND_FONTSIZE)
    if grid:
        ax.grid(alpha=0.3)
    if layout:
        ax.figure.tight_layout()
    return ax


def bar_chart(df, x: str, y: str, *, ylabel: str, hue: str | None = None, xlabel: str = "",
              title: str = "", low: str | None = None, high: str | None = None, ax=None,
              annotate: bool = True, rotation: float = 20, layout: bool = True):
    """Bars of ``df[y]`` per ``df[x]``; ``low``/``high`` columns (e.g. q1/q3) become error bars.

    With ``hue``: grouped bars, one colour per ``hue`` value beside each other at each ``x``,
    both in the order they first appear (a missing pair leaves a gap). ``layout=False`` leaves
    the figure's layout to a caller drawing several panels."""
    ax = _axes(ax, (7, 3.2))
    if hue is None:
        cats, groups = list(df[x].astype(str)), [(None, df)]
    else:
        cats = list(dict.fromkeys(df[x].astype(str)))
        groups = [(name, group.assign(**{x: group[x].astype(str)}).set_index(x).reindex(cats))
                  for name, group in df.groupby(hue, sort=False)]
    width = 0.8 / len(groups)
    for i, (name, group) in enumerate(groups):
        values = group[y].to_numpy(dtype=float)
        where = [k + (i - (len(groups) - 1) / 2) * width for k in range(len(cats))]
        bars = ax.bar(where, values, width=width, yerr=iqr_errors(group, y, low, high),
                      capsize=3, color=BAR_COLOR if hue is None else f"C{i}",
                      label=None if hue is None else str(name))
        if annotate:
            for bar, value in zip(bars, values, strict=True):
                if value == value:  # no label over a gap
                    ax.annotate(value_label(value),
                                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(cats)), cats)
    plain_numbers(ax.yaxis)
    ax.tick_params(axis="x", labelrotation=rotation)
    return _finish(ax, xlabel=xlabel, ylabel=ylabel, title=title, legend=hue is not None,
                   grid=False, layout=layout)


def line_chart(df, x: str, y: str, *, hue: str | None = None, xlabel: str, ylabel: str,
               title: str = "", low: str | None = None, high: str | None = None,
               logx: bool = False, logy: bool = False, ticks_at_data: bool = False, ax=None,
               layout: bool = True):
    """One line per ``hue`` group of ``df[y]`` against ``df[x]``; ``low``/``high`` columns
    (e.g. q1/q3) become error bars; ``ticks_at_data`` puts the x ticks at the measured x
    values (:func:`data_ticks`)."""
    ax = _axes(ax, (7, 3.6))
    groups = df.groupby(hue, sort=False) if hue else [(y, df)]
    for name, group in groups:
        yerr = iqr_errors(group, y, low, high)
        if yerr is None:
            ax.plot(group[x], group[y], marker="o", markersize=3, label=str(name))
        else:
            ax.errorbar(group[x], group[y], yerr=yerr, marker="o", markersize=3, capsize=2,
                        label=str(name))
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    if ticks_at_data:
        data_ticks(ax, df[x], rotation=45)
    return _finish(ax, xlabel=xlabel, ylabel=ylabel, title=title, legend=bool(hue), grid=True,
                   layout=layout)


def difference_chart(df, x: str, y: str, *, hue: str, baseline: str, xlabel: str, ylabel: str,
                     title: str = "", ax=None, layout: bool = True):
    """``df[y]`` minus the ``baseline`` group's ``df[y]`` at the same ``x``, one line per other
    ``hue`` group: curves that lie on top of each other become readable. The y axis is
    symmetric-log, linear up to a thousandth of the largest difference (or the smallest one seen,
    when larger), so rounding noise near zero does not fill the plot while both signs show."""
    base = df[df[hue] == baseline].set_index(x)[y]
    others = df[df[hue] != baseline]
    ax = _axes(ax, (7, 3.6))
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
    return _finish(ax, xlabel=xlabel, ylabel=ylabel, title=title, legend=True, grid=True,
                   layout=layout)
