"""Verdicts with the course's tie rule: "faster", "slower" or "indistinguishable", chosen from
measured medians and inter-quartile ranges, never written by hand."""

from __future__ import annotations

# Below this relative difference two medians are called a tie, whatever their spreads.
TIE_FRACTION = 0.03


def is_tie(a_ms: float, b_ms: float, *, a_iqr: tuple[float, float] | None = None,
           b_iqr: tuple[float, float] | None = None, tie: float = TIE_FRACTION) -> bool:
    """True when two timings cannot be told apart: medians within ``tie`` or IQRs overlapping."""
    if a_ms <= 0 or b_ms <= 0:
        raise ValueError("timings must be positive")
    if abs(a_ms / b_ms - 1.0) < tie:
        return True
    if a_iqr is not None and b_iqr is not None:
        return a_iqr[0] <= b_iqr[1] and b_iqr[0] <= a_iqr[1]
    return False


def compare(a_name: str, a_ms: float, b_name: str, b_ms: float, *,
            a_iqr: tuple[float, float] | None = None, b_iqr: tuple[float, float] | None = None,
            tie: float = TIE_FRACTION) -> str:
    """One sentence comparing ``a`` with ``b`` from their medians (and IQRs, when given)."""
    if is_tie(a_ms, b_ms, a_iqr=a_iqr, b_iqr=b_iqr, tie=tie):
        why = "IQRs overlap" if abs(a_ms / b_ms - 1.0) >= tie else f"within {tie:.0%}"
        return (f"{a_name} ({a_ms:.3g} ms) and {b_name} ({b_ms:.3g} ms) are indistinguishable "
                f"on this run ({why})")
    if a_ms < b_ms:
        ratio, word = b_ms / a_ms, "faster"
    else:
        ratio, word = a_ms / b_ms, "slower"
    return f"{a_name} ({a_ms:.3g} ms) is {ratio:.2f}x {word} than {b_name} ({b_ms:.3g} ms)"


def compare_rows(df, a: str, b: str, *, key: str = "candidate") -> str:
    """:func:`compare` for two rows of a timing table (columns median_ms, q1_ms, q3_ms)."""
    ra = df.loc[df[key] == a].iloc[0]
    rb = df.loc[df[key] == b].iloc[0]
    return compare(a, float(ra.median_ms), b, float(rb.median_ms),
                   a_iqr=(float(ra.q1_ms), float(ra.q3_ms)),
                   b_iqr=(float(rb.q1_ms), float(rb.q3_ms)))


def fastest(df, *, key: str = "candidate", among: list[str] | None = None) -> str:
    """The name of the row with the lowest median (optionally among some names only)."""
    rows = df if among is None else df[df[key].isin(among)]
    if rows.empty:
        raise ValueError("no rows to choose from")
    return str(rows.loc[rows["median_ms"].idxmin(), key])


def tied_with_fastest(df, *, key: str = "candidate", among: list[str] | None = None) -> list[str]:
    """The rows that cannot be told apart from the fastest (:func:`is_tie`), fastest first.

    IQRs are used when the table has ``q1_ms``/``q3_ms`` columns, else medians alone.
    """
    rows = df if among is None else df[df[key].isin(among)]
    if rows.empty:
        raise ValueError("no rows to choose from")
    rows = rows.sort_values("median_ms")
    best = rows.iloc[0]
    has_iqr = {"q1_ms", "q3_ms"} <= set(rows.columns)

    def iqr(r):
        return (float(r.q1_ms), float(r.q3_ms)) if has_iqr else None

    return [str(r[key]) for _, r in rows.iterrows()
            if r[key] == best[key] or is_tie(float(best.median_ms), float(r.median_ms),
                                            a_iqr=iqr(best), b_iqr=iqr(r))]


def fastest_text(df, *, key: str = "candidate", among: list[str] | None = None) -> str:
    """'X' when one row is clearly fastest, else 'X (indistinguishable from Y, Z)'."""
    names = tied_with_fastest(df, key=key, among=among)
    if len(names) == 1:
        return names[0]
    return f"{names[0]} (indistinguishable from {', '.join(names[1:])})"


def verdict_table(df, by: list[str], *, key: str = "candidate", value: str = "median_ms",
                  iqr: tuple[str, str] | None = ("q1_ms", "q3_ms"), label=None,
                  tie: float = TIE_FRACTION):
    """One row per group of ``by``: the fastest ``key`` by ``value``, the others that cannot be
    told apart from it (:func:`is_tie`, with the ``iqr`` columns when given), its value, and
    each candidate's value over the fastest's (1.0 for the fastest, NaN where absent).

    ``label`` maps a candidate to its ratio column's name (default: the name itself), so
    candidates of different groups can share a column; the columns are ``<label> x``."""
    import pandas as pd

    label = label or str
    columns = list(dict.fromkeys(f"{label(name)} x" for name in df[key]))
    rows = []
    for keys, group in df.groupby(list(by), sort=False):
        keys = keys if isinstance(keys, tuple) else (keys,)
        ranked = group.sort_values(value, kind="stable")
        best = ranked.iloc[0]

        def spread(r):
            return (float(r[iqr[0]]), float(r[iqr[1]])) if iqr else None

        tied = [str(r[key]) for _, r in ranked.iloc[1:].iterrows()
                if is_tie(float(best[value]), float(r[value]), a_iqr=spread(best),
                          b_iqr=spread(r), tie=tie)]
        row = {**dict(zip(by, keys, strict=True)), "fastest": str(best[key]),
               "tied_with_fastest": ", ".join(tied), "fastest_ms": float(best[value])}
        row.update(dict.fromkeys(columns, float("nan")))
        for _, r in group.iterrows():
            row[f"{label(r[key])} x"] = float(r[value]) / float(best[value])
        rows.append(row)
    return pd.DataFrame(rows, columns=[*by, "fastest", "tied_with_fastest", "fastest_ms",
                                       *columns])
