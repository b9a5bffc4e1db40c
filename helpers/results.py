"""Where results go, written atomically: CSV/JSON tables (with the environment) and PNG plots;
and the course's standard charts (labelled axes with units, error bars from the IQR)."""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from helpers.errors import CourseError
from helpers.settings import RESULTS_DIR_VAR


def repo_root() -> Path | None:
    """The course checkout when helpers is used from it (editable install), else None."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").exists() and (here / "notebooks").is_dir() else None


def results_dir() -> Path:
    """``$COURSE_RESULTS_DIR``, else ``<checkout>/results``, else ``./results``; created on use."""
    env = os.environ.get(RESULTS_DIR_VAR)
    if env:
        path = Path(env)
    else:
        root = repo_root()
        path = (root if root is not None else Path.cwd()) / "results"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise CourseError(f"Cannot write results to {path} ({exc.strerror or exc}): set "
                         f"{RESULTS_DIR_VAR} to a writable folder and run again.") from None
    return path


def slug(text: str) -> str:
    """A file-name-safe slug: 'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path | str, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename, so readers never see
    a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a result file is for sharing
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: Path | str, text: str) -> Path:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and value != value:  # NaN -> null
        return None
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def save_json(name: str, payload: dict, *, directory: Path | None = None) -> Path:
    """Write ``payload`` to ``<results>/<name>.json`` atomically."""
    target = (directory or results_dir()) / f"{name}.json"
    return atomic_write_text(target, json.dumps(_jsonable(payload), indent=2) + "\n")


def save_table(df, name: str, *, env: dict | None = None, directory: Path | None = None) -> Path:
    """Save a pandas table as ``<name>.csv`` and ``<name>.json`` (rows plus the environment)."""
    directory = directory or results_dir()
    csv_path = atomic_write_text(directory / f"{name}.csv", df.to_csv(index=False))
    save_json(
        name,
        {
            "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "environment": env or {},
            "rows": df.to_dict(orient="records"),
        },
        directory=directory,
    )
    return csv_path


def append_rows(rows: list[dict], name: str, *, env: dict | None = None,
                directory: Path | None = None):
    """Append rows to ``<name>.csv``/``.json`` (created if absent); returns the whole table."""
    import pandas as pd

    directory = directory or results_dir()
    csv_path = directory / f"{name}.csv"
    new = pd.DataFrame(rows)
    df = pd.concat([pd.read_csv(csv_path), new], ignore_index=True) if csv_path.exists() else new
    save_table(df, name, env=env, directory=directory)
    return df


def save_figure(fig, name: str, *, directory: Path | None = None, dpi: int = 120) -> Path:
    """Save a matplotlib figure as ``<name>.png`` atomically."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return atomic_write_bytes((directory or results_dir()) / f"{name}.png", buffer.getvalue())


# --- the standard charts ----------------------------------------------------------------------

def _pyplot():
    """matplotlib's pyplot, imported when a chart is drawn (child processes never need it)."""
    import matplotlib.pyplot as plt

    return plt


def value_label(value: float) -> str:
    """A bar's label: thousands separators from 1000 up (527,790), 3 significant digits below."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def bar_chart(df, x: str, y: str, *, ylabel: str, title: str = "", low: str | None = None,
              high: str | None = None, ax=None, annotate: bool = True):
    """Bars of ``df[y]`` per ``df[x]``; ``low``/``high`` columns (e.g. q1/q3) become error bars."""
    if ax is None:
        _, ax = _pyplot().subplots(figsize=(7, 3.2))
    values = df[y].to_numpy(dtype=float)
    yerr = None
    if low is not None and high is not None:
        yerr = [values - df[low].to_numpy(dtype=float), df[high].to_numpy(dtype=float) - values]
    bars = ax.bar(df[x].astype(str), values, yerr=yerr, capsize=3, color="#4C72B0")
    if annotate:
        for bar, value in zip(bars, values, strict=True):
            ax.annotate(value_label(value), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
    from matplotlib.ticker import FuncFormatter

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
        _, ax = _pyplot().subplots(figsize=(7, 3.6))
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
        _, ax = _pyplot().subplots(figsize=(7, 3.6))
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
