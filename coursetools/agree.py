"""Do two runs of the course give the same verdicts? Every verdict-like cell of every table two
report folders share, compared row by row.

    python -m coursetools.agree reports/h200 reports/h200-rehearsals/repeat [--markdown]

A verdict-like column is one whose name says it holds a reading (``verdict``, ``label``,
``target``, ``stable``, ``fastest``, ``ok``, ...: :data:`VERDICT_COLUMN`). Two cells give the
same verdict when they are equal once their figures are set aside ("faster 1.40x" and "faster
1.38x" agree, "faster 1.40x" and "tie" do not); a few columns whose figure is the verdict
itself (06's measured crossover width) are compared as they are. Exit status 1 when any cell
differs, 2 when a folder has no tables.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

VERDICT_COLUMN = re.compile(
    r"^(verdict|label|target|reading|on this run|stable|settled|fastest|tied_with_fastest|ok"
    r"|learned|agrees|agrees_with_step|decides|within_tolerance|faster|speeds_up"
    r"|launch_bound|fused_kernels|recipe_vs_legacy|vs_baseline|crossover|matches|finite"
    r"|healthy|fits_gpu_ckpt|auto_filter_converts|python_import|cuda_extension|gpu_smoke_run"
    r"|scale_halved|params_unchanged|next_step_updates|apex_options_match|torch_restored"
    r"|legacy_trained|recipe_trained|overflow_skipped|apex_checked|pytorch_found|\d+"
    r"|.*_verdict|.*_fastest|.*_stable|.*_label|.*_vs_.*)$")
# columns whose figure is the verdict: compared as written
EXACT = {"crossover"}
FIGURE = re.compile(r"[-+]?(\d[\d,]*\.?\d*|\.\d+)(e[-+]?\d+)?")


def verdict_of(value: object, exact: bool = False) -> str:
    """A cell as a verdict: its text with every figure replaced by '#' (unless ``exact``)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = str(value).strip()
    return text if exact else FIGURE.sub("#", text)


@dataclass
class Cell:
    table: str
    row: str
    column: str
    a: str
    b: str

    @property
    def same_text(self) -> bool:
        return self.a == self.b

    @property
    def same_verdict(self) -> bool:
        exact = self.column in EXACT
        return verdict_of(self.a, exact) == verdict_of(self.b, exact)


def _row_name(df, i: int) -> str:
    """A row's name: its first text cells outside the verdict columns (the row's key: candidate,
    dtype, pass...), else its number. ``df`` is the table as read with its own dtypes."""
    import pandas as pd

    parts = []
    for col in df.columns:
        if VERDICT_COLUMN.match(str(col)) or pd.api.types.is_numeric_dtype(df[col]) \
                or pd.api.types.is_bool_dtype(df[col]):
            continue
        v = df.iloc[i][col]
        if isinstance(v, str):
            parts.append(v)
        if len(parts) == 3:
            break
    return " / ".join(parts) or f"row {i}"


def compare(a_dir: Path, b_dir: Path) -> tuple[list[Cell], list[str]]:
    """Every verdict-like cell of the tables both folders hold (``results/*.csv``), and the
    tables that could not be compared row by row (a different number of rows)."""
    import pandas as pd

    cells, skipped = [], []
    a_tables = {p.name: p for p in sorted((a_dir / "results").glob("*.csv"))}
    for name, a_path in a_tables.items():
        b_path = b_dir / "results" / name
        if not b_path.exists():
            continue
        a, b = pd.read_csv(a_path, dtype=str), pd.read_csv(b_path, dtype=str)
        columns = [c for c in a.columns if c in b.columns and VERDICT_COLUMN.match(str(c))]
        if not columns:
            continue
        if len(a) != len(b):
            skipped.append(f"{name}: {len(a)} rows in one run, {len(b)} in the other")
            continue
        table = name.removesuffix(".csv")
        typed = pd.read_csv(a_path)
        for i in range(len(a)):
            row = _row_name(typed, i)
            for col in columns:
                cells.append(Cell(table, row, str(col), verdict_of(a.iloc[i][col], True),
                                  verdict_of(b.iloc[i][col], True)))
    return cells, skipped


def summary(cells: list[Cell]):
    """One row per table: cells compared, identical, the same verdict, different."""
    import pandas as pd

    rows = {}
    for c in cells:
        r = rows.setdefault(c.table, {"table": c.table, "compared": 0, "identical": 0,
                                      "same_verdict": 0, "differ": 0})
        r["compared"] += 1
        r["identical"] += c.same_text
        r["same_verdict"] += c.same_verdict
        r["differ"] += not c.same_verdict
    return pd.DataFrame(list(rows.values()),
                        columns=["table", "compared", "identical", "same_verdict", "differ"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coursetools.agree", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="a report folder (holding results/)")
    parser.add_argument("b", type=Path, help="another report folder of the same notebooks")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--all", action="store_true",
                        help="list every compared cell, not only the ones that differ")
    args = parser.parse_args(argv)
    for d in (args.a, args.b):
        if not any((d / "results").glob("*.csv")):
            print(f"agree: error: {d} holds no results/*.csv: give a report folder "
                  "(make report writes one)", file=sys.stderr)
            return 2
    cells, skipped = compare(args.a, args.b)
    table = summary(cells)
    listed = [c for c in cells if args.all or not c.same_verdict]
    detail = [{"table": c.table, "row": c.row, "column": c.column, "a": c.a, "b": c.b,
               "same": "yes" if c.same_verdict else "NO"} for c in listed]
    import pandas as pd

    detail = pd.DataFrame(detail, columns=["table", "row", "column", "a", "b", "same"])
    total = table[["compared", "identical", "same_verdict", "differ"]].sum()
    if args.markdown:
        print(table.to_markdown(index=False))
        print()
        if len(detail):
            print(detail.to_markdown(index=False))
            print()
    else:
        with pd.option_context("display.width", 200, "display.max_rows", None,
                               "display.max_colwidth", 60):
            print(table.to_string(index=False))
            if len(detail):
                print()
                print(detail.to_string(index=False))
    for s in skipped:
        print(f"not compared: {s}")
    print(f"{total.compared} verdict cells compared: {total.identical} identical, "
          f"{total.same_verdict} the same verdict, {total.differ} different")
    return 1 if total.differ or skipped else 0


if __name__ == "__main__":
    raise SystemExit(main())
