"""The course's headline: Apex against its native replacement, topic by topic, from a report.

    python -m coursetools.headline reports/h200     # prints the markdown table

Every figure comes from the report's ``results/*.csv`` (what the notebooks saved): which rows
to compare is chosen here, the numbers never are. The reading of each timing pair is the
course's tie rule (``helpers.verdicts``): two timings whose medians are within 3% or whose
inter-quartile ranges overlap "cannot be told apart on this run". A topic whose table the
report lacks (a notebook that skipped its Apex rows, say) is left out of the table.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

from helpers import verdicts

COLUMNS = ("topic", "notebook", "measure", "unit", "apex", "apex_value", "native",
           "native_value", "ratio", "reading")


def _timing(df: pd.DataFrame, key: str, name: str) -> tuple[float, tuple[float, float] | None]:
    """A timing row's median and (q1, q3) where the table has them."""
    row = df.loc[df[key] == name].iloc[0]
    iqr = (float(row.q1_ms), float(row.q3_ms)) if "q1_ms" in df and "q3_ms" in df else None
    return float(row.median_ms), iqr


def _reading(apex_ms: float, native_ms: float, apex_iqr, native_iqr) -> str:
    """'Apex faster', 'native faster' or 'cannot tell apart' by the course's tie rule."""
    if verdicts.tie_reason(apex_ms, native_ms, a_iqr=apex_iqr, b_iqr=native_iqr):
        return verdicts.TIE_WORD
    return "Apex faster" if apex_ms < native_ms else "native faster"


def _row(topic: str, notebook: str, measure: str, apex: str, apex_value: float, native: str,
         native_value: float, reading: str) -> dict:
    measure, unit = re.fullmatch(r"(.*) \((.+)\)", measure).groups()  # "step time (ms)"
    return dict(topic=topic, notebook=notebook, measure=measure, unit=unit, apex=apex,
                apex_value=apex_value, native=native, native_value=native_value,
                ratio=apex_value / native_value, reading=reading)


def _timing_pair(df: pd.DataFrame, key: str, topic: str, notebook: str, measure: str,
                 apex: str, native: str) -> dict | None:
    if df is None or not {apex, native} <= set(df[key]):
        return None
    apex_ms, apex_iqr = _timing(df, key, apex)
    native_ms, native_iqr = _timing(df, key, native)
    return _row(topic, notebook, measure, apex, apex_ms, native, native_ms,
                _reading(apex_ms, native_ms, apex_iqr, native_iqr))


def _read(results: Path, name: str) -> pd.DataFrame | None:
    path = results / f"{name}.csv"
    return pd.read_csv(path) if path.exists() else None


def _optimizer(results: Path) -> list[dict | None]:
    """02: one optimizer step, Apex FusedAdam against AdamW(fused=True), read from the
    interleaved rounds' pairs (02_step_pairs) where the run saved them."""
    pairs = _read(results, "02_step_pairs")
    if pairs is not None:
        pair = pairs[(pairs["candidate"] == "apex FusedAdam") & (pairs["vs"] == "fused")]
        if pair.empty:
            return []
        r = pair.iloc[0]
        word = {"faster": "Apex faster", "slower": "native faster"}.get(r.verdict, r.verdict)
        return [_row("AdamW", "02", "one step (ms)", "apex FusedAdam", float(r.candidate_ms),
                     "torch AdamW(fused=True)", float(r.vs_ms), word)]
    df = _read(results, "02_optimizer_step")  # an earlier run: its medians and IQRs
    row = _timing_pair(df, "candidate", "AdamW", "02", "one step (ms)",
                       "apex FusedAdam", "fused")
    if row:  # the notebook's candidate names are AdamW's modes
        row["native"] = "torch AdamW(fused=True)"
    return [row]


def _winner(family: str, label: str) -> str:
    """A ranking's winner and label (03_rankings) as the headline's reading."""
    if not str(label).startswith("faster"):
        return verdicts.TIE_WORD if label == "tie" else str(label)
    return "Apex faster" if family.startswith("apex") else "native faster"


def _norms(results: Path) -> list[dict | None]:
    """03: forward+backward of each norm at the widest size, in bf16 and fp32 in / bf16 out,
    Apex against eager torch twice: by GPU time alone (the tie rule on the repeats) and per
    call with the host included, what an eager training step pays (the interleaved rounds'
    ranking of the eager candidates)."""
    df = _read(results, "03_norm_timings")
    if df is None:
        return []
    ranks, calls = _read(results, "03_rankings"), _read(results, "03_call_rounds")
    rows = []
    widest = df.loc[df["hidden"] == df["hidden"].max()]
    for (norm, dtype), part in widest[widest["pass"] == "forward+backward"].groupby(
            ["norm", "dtype"], sort=False):
        if dtype not in ("bf16", "fp32->bf16"):
            continue
        names = list(part["candidate"])
        apex = next((n for n in names if n.startswith("apex ")), None)
        native = next((n for n in names if n.startswith("torch ")), None)
        if not (apex and native):
            continue
        rows.append(_timing_pair(part, "candidate", f"{norm} {dtype}", "03",
                                 "fwd+bwd, GPU time (ms)", apex, native))
        if ranks is None or calls is None:
            continue
        rank = ranks[(ranks["norm"] == norm) & (ranks["dtype"] == dtype)
                     & (ranks["pass"] == "forward+backward")]
        call = calls[(calls["norm"] == norm) & (calls["dtype"] == dtype)
                     & (calls["pass"] == "forward+backward")].set_index("candidate")
        if rank.empty or not {apex, native} <= set(call.index):
            continue
        r = rank.iloc[0]
        rows.append(_row(f"{norm} {dtype}", "03", "fwd+bwd, per call (ms)", apex,
                         float(call.loc[apex, "median_ms"]), native,
                         float(call.loc[native, "median_ms"]),
                         _winner(str(r.eager_call_fastest), str(r.eager_call_verdict))))
    return rows


def _amp(results: Path) -> list[dict | None]:
    """04: the legacy apex.amp opt levels against the torch.amp code that replaces each, read
    from the interleaved rounds (04_speed_pairs: the verdict of ``candidate`` against ``vs``)."""
    df = _read(results, "04_speed_pairs")
    if df is None:
        return []
    df = df.rename(columns={"run": "candidate", "run_ms": "candidate_ms"})  # earlier runs' names
    rows = []
    for r in df.itertuples():
        a, b = str(r.candidate), str(r.vs)
        if a.startswith("apex.amp") and b.startswith("torch.amp"):
            apex, native, apex_ms, native_ms = a, b, r.candidate_ms, r.vs_ms
            word = {"faster": "Apex faster", "slower": "native faster"}.get(r.verdict, r.verdict)
        elif b.startswith("apex.amp") and a.startswith("torch.amp"):
            apex, native, apex_ms, native_ms = b, a, r.vs_ms, r.candidate_ms
            word = {"faster": "native faster", "slower": "Apex faster"}.get(r.verdict, r.verdict)
        else:
            continue
        rows.append(_row(f"mixed precision {apex.removeprefix('apex.amp ')}", "04",
                         "one step (ms)", apex, float(apex_ms), native, float(native_ms), word))
    return rows


def _end_to_end(results: Path) -> list[dict | None]:
    """05: the GPT's Apex path against the native fused path: step time and peak memory."""
    df = _read(results, "05_paths")
    if df is None:
        return []
    df = df[df["status"] == "ran"] if "status" in df else df
    apex = next((p for p in df["label"] if str(p).startswith("Apex")), None)
    native = next((p for p in df["label"] if str(p).startswith("Native fused")), None)
    if apex is None or native is None:
        return []
    timed = df.rename(columns={"step_ms": "median_ms", "step_ms_q1": "q1_ms",
                               "step_ms_q3": "q3_ms"})
    a, n = (df.loc[df["label"] == x].iloc[0] for x in (apex, native))
    # peak memory has no spread to read it against: within the timing tie margin is a tie
    memory = float(a.peak_mem_gib) / float(n.peak_mem_gib) - 1.0
    word = "cannot tell apart" if abs(memory) < verdicts.TIE_FRACTION else (
        "Apex uses less" if memory < 0 else "native uses less")
    best = next((p for p in df["label"] if "compile" in str(p)), None)  # the native best
    return [_timing_pair(timed, "label", "GPT training", "05", "one step (ms)",
                         apex, native),
            best and _timing_pair(timed, "label", "GPT training", "05", "one step (ms)",
                                  apex, best),
            _row("GPT training", "05", "peak GPU memory (GiB)", apex,
                 float(a.peak_mem_gib), native, float(n.peak_mem_gib), word)]


def headline_table(report_dir: Path | str) -> pd.DataFrame:
    """Apex against native per topic, from ``report_dir/results``: one row per comparison, with
    both values, the ratio Apex / native (below 1: Apex takes less) and the reading."""
    results = Path(report_dir) / "results"
    rows = [r for part in (_optimizer, _norms, _amp, _end_to_end) for r in part(results)]
    return pd.DataFrame([r for r in rows if r is not None], columns=list(COLUMNS))


def _number(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.1f}"


def _short(name: str) -> str:
    """'apex FusedAdam' -> 'FusedAdam': the column already says whose it is."""
    return re.sub(r"^(apex|torch) ", "", name)


def headline_markdown(table: pd.DataFrame) -> str:
    """The table as markdown (a pipe table), for the book's landing page and the README."""
    lines = ["| topic (notebook) | Apex | native | Apex / native | reading |",
             "|---|---|---|---:|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.topic}: {r.measure} ({r.notebook}) "
                     f"| {_short(r.apex)}: {_number(r.apex_value)} {r.unit} "
                     f"| {_short(r.native)}: {_number(r.native_value)} {r.unit} "
                     f"| {r.ratio:.2f}x | {r.reading} |")
    return "\n".join(lines)


# The README's generated blocks: what sits between "<!-- NAME:start -->" and "<!-- NAME:end -->"
README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = "<!-- {name}:start -->\n{body}\n<!-- {name}:end -->"


def measured_on(summary: dict) -> str:
    """One line naming the run: GPU, driver, torch, CUDA, Apex, date, profile."""
    apex = summary.get("apex_commit") or "not built"
    return (f"Measured on **{summary.get('gpu_name', '?')}** (driver {summary.get('driver', '?')})"
            f", torch {summary.get('torch', '?')} with CUDA {summary.get('cuda', '?')}, Apex "
            f"`{apex[:8]}`, {str(summary.get('date', '?'))[:10]}, {summary.get('profile', '?')} "
            "profile.")


def notebooks_markdown(report_dir: Path | str, notebooks: Path) -> str:
    """One row per notebook: its title (linked), and its time and peak GPU memory on the run
    of ``report_dir`` (summary.json's own record of each notebook)."""
    import json

    import nbformat

    summary = json.loads((Path(report_dir) / "summary.json").read_text())
    lines = ["| notebook | reference run: time | peak GPU memory |", "|---|---:|---:|"]
    for path in sorted(notebooks.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        title = next((ln.lstrip("# ").strip() for c in nb.cells if c.cell_type == "markdown"
                      for ln in c.source.splitlines() if ln.startswith("# ")), path.stem)
        own = summary.get("notebooks", {}).get(path.name, {})
        seconds, peak = own.get("seconds"), own.get("peak_gpu_gib")
        lines.append(f"| [{title}](notebooks/{path.name}) "
                     f"| {'-' if seconds is None else f'{seconds:.0f} s'} "
                     f"| {'-' if peak is None else f'{peak:.1f} GiB'} |")
    return "\n".join(lines)


def readme_blocks(report_dir: Path | str, notebooks: Path | None = None) -> dict[str, str]:
    """The README's generated blocks from the report in ``report_dir``: ``answers`` (the run's
    line and :func:`headline_markdown`) and ``notebooks`` (:func:`notebooks_markdown`)."""
    import json

    report_dir = Path(report_dir)
    notebooks = notebooks or README.parent / "notebooks"
    summary = json.loads((report_dir / "summary.json").read_text())
    return {"answers": f"{measured_on(summary)}\n\n"
                       f"{headline_markdown(headline_table(report_dir))}",
            "notebooks": notebooks_markdown(report_dir, notebooks)}


def with_blocks(text: str, blocks: dict[str, str]) -> str:
    """``text`` with each block's body replaced (a block missing from ``text`` is an error)."""
    for name, body in blocks.items():
        pattern = re.compile(re.escape(f"<!-- {name}:start -->") + r"\n.*?"
                             + re.escape(f"<!-- {name}:end -->"), re.S)
        if not pattern.search(text):
            raise ValueError(f"the README has no {name} block (<!-- {name}:start -->)")
        text = pattern.sub(lambda _m, n=name, b=body: BLOCK.format(name=n, body=b), text)
    return text


def main(argv: list[str] | None = None) -> int:
    """Print a report's headline table as markdown (``--readme``: rewrite the README's
    generated blocks from it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, nargs="?", default=Path("reports/h200"),
                        help="a report folder with results/ (default: reports/h200)")
    parser.add_argument("--readme", action="store_true",
                        help="rewrite the README's generated blocks from this report")
    args = parser.parse_args(argv)
    if args.readme:
        README.write_text(with_blocks(README.read_text(), readme_blocks(args.report)))
        print(f"headline: {README.name}'s blocks now show {args.report}")
        return 0
    table = headline_table(args.report)
    if table.empty:
        print(f"headline: error: {args.report}/results holds none of the tables compared",
              file=sys.stderr)
        return 2
    print(headline_markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
