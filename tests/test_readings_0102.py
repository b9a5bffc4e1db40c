"""The reading and summary cells of notebooks 01 and 02, run without a kernel on planted
tables: a ceiling check that fired keeps its figures out of every reading, and noisy timings
give 'cannot tell apart on this run', never a ratio."""

import contextlib
import io
import math
import re
import types
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import torch

from helpers import bench, ceilings, verdicts
from helpers.chapters import optimizers as chapter

ROOT = Path(__file__).resolve().parent.parent


def cell(notebook: str, starts: str) -> str:
    """The source of the one code cell of ``notebook`` that starts with ``starts``."""
    nb = nbformat.read(ROOT / "notebooks" / notebook, as_version=4)
    found = [c.source for c in nb.cells if c.cell_type == "code" and c.source.startswith(starts)]
    assert len(found) == 1, (notebook, starts, len(found))
    return found[0]


def run(sources: list[str], space: dict) -> str:
    """Execute the cells in ``space`` and return what they printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for source in sources:
            exec(source, space)
    return out.getvalue()


def timing(label, median, spread=0.01, n=25):
    """A Timing whose IQR is about ``spread`` of its median on each side."""
    lo, hi = median * (1 - spread), median * (1 + spread)
    samples = [lo + (hi - lo) * i / (n - 1) for i in range(n)]
    return bench.Timing(label, samples, "cpu")


# ------------------------------------------------------------------ 01, section 6 and summary
def space_01(gap_ms: dict, *, ceiling_tflops: float, spread=0.01, device="cuda",
             earlier_ms: dict | None = None, rounds_ms: dict | None = None):
    """01's section 6 namespace: gap_ms = the first round, the last round, then this cell's
    conditions; earlier_ms = section 5's timings, label -> (ms, the condition read against);
    rounds_ms = a condition's five round medians (default: five rounds at its gap_ms)."""
    n, k = 1024, 5
    flops = ceilings.matmul_flops(n, n, n) / 1e12
    extra = {label: (timing(label, ms, spread), against)
             for label, (ms, against) in (earlier_ms or {}).items()}
    gap = {label: timing(label, ms, spread) for label, ms in gap_ms.items()}
    labels = list(gap)
    gap.update({label: t for label, (t, _) in extra.items()})
    pct = {label: ceilings.pct_of(flops / (t.median_ms * 1e-3), ceiling_tflops)
           for label, t in gap.items()}
    runs = {label: gap[label] for label in labels[2:]}
    rounds_ms = {label: [gap_ms[label]] * 5 for label in runs} | (rounds_ms or {})
    blocks = {label: [timing(label, ms, spread) for ms in rounds_ms[label]] for label in runs}
    gap_table = pd.DataFrame({"condition": list(gap),
                              "median_ms": [t.median_ms for t in gap.values()],
                              "pct_of_ceiling": list(pct.values())})
    return {"n": n, "k": k, "gap": gap, "pct": pct, "runs": runs, "first": labels[0],
            "blocks": blocks,
            "extra": extra, "earlier": [label for label in extra if label.startswith("section 5")],
            "gap_table": gap_table, "pd": pd, "display": SHOWN.append, "math": math,
            "last": labels[1], "ceiling_tflops": ceiling_tflops, "ceiling_key": "bf16",
            "ceiling": {"matmul_n": n, "matmul_tflops": {"bf16": ceiling_tflops},
                        "device": "GPU", "copy_gbps": 3000.0},
            "results": types.SimpleNamespace(save_table=save), "env": {},
            "device": torch.device(device), "ceilings": ceilings, "verdicts": verdicts}


SHOWN: list = []  # what the cells display()
SAVED: dict = {}  # name -> the table the cells saved


def save(df: pd.DataFrame, name: str, **_) -> None:
    """results.save_table for the planted runs: keeps the table in SAVED."""
    SAVED[name] = df


GAP = {"back to back, repeats 1-5": 0.010, "back to back, repeats 21-25": 0.0101,
       "back to back": 0.0100, "L2 flush before each repeat": 0.0120,
       "idle 50 ms before each repeat": 0.0130}


def shown_01(space: dict, starts: tuple[str, ...], saved: str, key: str) -> pd.DataFrame:
    """Run 01's cells that start with ``starts``: they print nothing, save ``saved`` (the
    namespace's ``key``) and display one table, returned indexed by its first column."""
    sources = [cell("01_environment_and_apex_build.ipynb", s) for s in starts]
    assert run(sources, space) == ""
    assert SAVED[saved] is space[key]
    shown = SHOWN[-1]
    return shown.set_index(shown.columns[0])


def table_01(space: dict) -> pd.DataFrame:
    """Run 01's section 6 verdict and display cells: one table (condition, ..., vs, label,
    why, too_noisy), indexed by condition."""
    return shown_01(space, ("flagged = any(", "hidden = ["), "01_ceiling_gap_verdicts",
                    "gap_verdicts")


def test_01_table_hides_percentages_the_ceiling_check_flagged():
    # a ceiling planted 100x too low: every share would read above 10000%
    space = space_01(GAP, ceiling_tflops=2.0)
    assert all(ceilings.is_above(v) for v in space["pct"].values())
    shown = table_01(space)
    assert "pct_of_ceiling" not in shown  # a share the check rejected is not displayed
    row = shown.loc["L2 flush before each repeat"]
    assert (row.vs, row.label, row.why) == ("back to back", "slower 0.83x", "")
    assert not shown["too_noisy"].any()


def test_01_table_reads_each_condition_against_its_reference():
    space = space_01(GAP, ceiling_tflops=250.0)  # 214.7 TFLOP/s back to back: 86%
    shown = table_01(space)
    pct = shown["pct_of_ceiling"]
    assert round(pct["back to back, repeats 1-5"]) == 86
    assert round(pct["L2 flush before each repeat"] - pct["back to back"], 1) == -14.3
    last = shown.loc["back to back, repeats 21-25"]
    assert (last.vs, last.label, last.why) == ("back to back, repeats 1-5", "tie", "within 3%")
    assert shown.loc["idle 50 ms before each repeat", "label"] == "slower 0.77x"
    assert tuple(shown.loc["back to back", ["vs", "label"]]) == ("-", "-")  # the reference


def test_01_section_5s_call_is_read_against_the_same_call_in_a_row():
    # the reference run's figures: section 5's flushed call 1.618 ms, the same call in the rounds
    # 1.480 ms; planted here, the last block of products in a row as slow as section 5's call
    start, end = "L2 flush, products 1-5 of 30 in a row", "L2 flush, products 26-30 of 30 in a row"
    gap = dict(GAP, **{"L2 flush before each repeat": 0.01480})
    extra = {start: (0.01470, "L2 flush before each repeat"), end: (0.01620, start),
             "section 5, L2 flush (earlier)": (0.01618, end),
             "section 5, no flush (earlier)": (0.01300, "back to back")}
    shown = table_01(space_01(gap, ceiling_tflops=250.0, earlier_ms=extra))
    read = shown[["vs", "label"]].apply(tuple, axis=1).to_dict()
    assert read[start] == ("L2 flush before each repeat", "tie")
    assert read[end] == (start, "slower 0.91x")
    assert read["section 5, L2 flush (earlier)"] == (end, "tie")
    assert shown.loc["section 5, L2 flush (earlier)", "why"] == "within 5%"  # half the drift
    assert read["section 5, no flush (earlier)"] == ("back to back", "slower 0.77x")
    # section 5's call as fast as the first block: nearer it than half the drift, not a tie
    extra["section 5, L2 flush (earlier)"] = (0.01480, end)
    shown = table_01(space_01(gap, ceiling_tflops=250.0, earlier_ms=extra))
    assert shown.loc["section 5, L2 flush (earlier)", "label"] == "faster 1.09x"


def test_01_conditions_that_took_turns_are_read_round_by_round():
    # the flush slower in four rounds of five, level in one: a tie, whatever the medians say
    rounds = {"L2 flush before each repeat": [0.0120, 0.0121, 0.0100, 0.0119, 0.0120],
              "idle 50 ms before each repeat": [0.013, 0.020, 0.011, 0.013, 0.013]}
    shown = table_01(space_01(GAP, ceiling_tflops=250.0, rounds_ms=rounds))
    row = shown.loc["L2 flush before each repeat"]
    assert row.label == "tie" and row.why.startswith("the rounds disagree")
    assert shown.loc["idle 50 ms before each repeat", "label"] == "slower 0.77x"  # every round


def timing_01(space: dict, naive_ms: float, synced_ms: float, benchmark_ms: float) -> pd.DataFrame:
    """Run 01's section 5 table cells on planted timings: they display one table, by method."""
    space.update(naive_ms=naive_ms, synced_ms=synced_ms, helper_ms=benchmark_ms, torch=torch,
                 timing=timing("bench.benchmark", benchmark_ms), dtype=torch.bfloat16,
                 matmul_tflop=ceilings.matmul_flops(1024, 1024, 1024) / 1e12)
    return shown_01(space, ("ceiling_key = ", "# each method against bench"), "01_timing_demo",
                    "timing_table")


def test_01_section_5_reads_the_naive_timer_against_bench_benchmark():
    # the reference run's figures: a 1.62 ms product timed at 0.015 ms without synchronize
    shown = timing_01(space_01(GAP, ceiling_tflops=250.0), 0.015, 1.616, 1.618)
    assert shown["label"].tolist() == ["faster 107.87x", "tie", "tie", "reference"]
    assert shown["why"].tolist()[1:] == ["within 3%", "within 3%", ""]
    slow = timing_01(space_01(GAP, ceiling_tflops=250.0), 3.0, 1.0, 1.618)
    assert slow["label"].tolist()[:2] == ["slower 0.54x", "faster 1.62x"]


def summary_01(space: dict) -> pd.DataFrame:
    """Run 01's summary cell after sections 5 and 6: it saves its table and shows it (the
    cell's last expression), indexed by item."""
    table_01(space)
    timing_01(space, 0.015, 1.616, 1.618)
    space.update(extension_imports={"amp_C": True, "apex_C": False}, hand_checks={},
                 apexcheck=types.SimpleNamespace(AVAILABLE="available"), warning="",
                 table=pd.DataFrame({"verdict": ["available", "not installed"]}),
                 peak_dtype="bf16", peak=space["ceiling_tflops"], ridge=100.0)
    source = cell("01_environment_and_apex_build.ipynb", "verdict_of = ")
    assert run([source.replace("summary.round(3)", "")], space) == ""
    assert SAVED["01_summary"] is space["summary"]
    return space["summary"].set_index("item")


def test_01_summary_counts_and_labels_from_the_run():
    summary = summary_01(space_01(GAP, ceiling_tflops=250.0))
    assert tuple(summary.loc["extensions that import", ["value", "unit"]]) == (1, "of 2")
    assert tuple(summary.loc["features available", ["value", "unit"]]) == (1, "of 2")
    assert summary.loc["time.time(), no synchronize", "label"] == "faster 107.87x"
    assert summary.loc["% of ceiling, L2 flush before each repeat", "label"] == "slower 0.83x"
    assert summary.loc["% of ceiling, back to back", "vs"] == "-"


def test_01_summary_says_100_for_a_share_just_above_the_ceiling():
    space = space_01(GAP, ceiling_tflops=213.0)  # 214.7 TFLOP/s back to back: 100.8%
    summary = summary_01(space)
    assert summary.loc["% of ceiling, back to back", "value"] == 100.0
    assert summary.loc[summary["unit"] == "%", "value"].max() <= 100.0


def test_01_noisy_conditions_are_not_read_as_a_change():
    # IQRs 30% of their medians: the one-block rows are too noisy to read; the conditions that
    # took turns are read by their rounds' medians, which here agree in every round
    space = space_01(GAP, ceiling_tflops=250.0, spread=0.3)
    shown = table_01(space)
    last = shown.loc["back to back, repeats 21-25"]
    assert last.label == "tie" and last.why.startswith("a spread of 30%")
    assert shown["too_noisy"].all()
    assert shown.loc["L2 flush before each repeat", "label"] == "slower 0.83x"


def test_01_summary_does_not_show_a_flagged_percentage():
    summary = summary_01(space_01(GAP, ceiling_tflops=2.0))
    shares = summary.loc[summary["unit"] == "%", "value"]
    assert len(shares) == 3 and shares.isna().all()


# ------------------------------------------------------------------ 02, summary
def space_02(step: dict, sweep_rows: list, *, copy_gbps: float):
    """02's summary namespace: step = name -> its rounds' samples (one list per round); sweep
    rows as the sweep table's."""
    timings = {name: [bench.Timing(name, samples, "cpu",
                                   meta={"bytes_per_step": 28_000_000, "round": k})
                      for k, samples in enumerate(rounds)] for name, rounds in step.items()}
    table = chapter.step_table(timings, 1_000_000, copy_gbps)
    step_rounds = bench.round_medians(timings)
    correct = pd.DataFrame({"candidate": list(step), "max_abs_vs_ref_float64": 1e-7})
    launches = pd.DataFrame({"candidate": list(step), "tensors": 48,
                             "per_step": [96.0 * (k + 1) for k in range(len(step))]})
    tables = {"step": table, "step_rounds": step_rounds, "kernels": launches,
              "sweep_ends": chapter.sweep_table(pd.DataFrame(sweep_rows)),
              "correctness": correct,
              "verdicts": verdicts.rounds_table(step_rounds, [("fused", "foreach")])}
    return {"tables": tables, "verdicts": verdicts, "chapter": chapter, "ceilings": ceilings,
            "optimizers": dict.fromkeys(step), "pd": pd, "display": SHOWN.append,
            "results": types.SimpleNamespace(save_table=save), "env": {},
            "table": table, "step_rounds": step_rounds}


def summary_02(space: dict) -> pd.DataFrame:
    """Run 02's summary cell: it prints nothing, saves its table and shows it (the cell's last
    expression); returned indexed by candidate."""
    source = cell("02_fused_adam_vs_adamw.ipynb", 'step_times = tables["step"]')
    assert run([source], space) == ""
    saved = SAVED["02_summary"].set_index("candidate")
    pd.testing.assert_frame_equal(saved, space["summary"])
    return saved


def sweep_row(name, tensors, median, spread):
    return {"tensors": tensors, "params_per_tensor": 2**16 // tensors, "candidate": name,
            "median_ms": median, "q1_ms": median * (1 - spread), "q3_ms": median * (1 + spread)}


def test_02_summary_with_a_planted_ceiling_and_a_cold_first_run():
    step = {"fused": [[1.0, 1.0, 1.01, 1.02, 1.02]] * 3,
            "foreach": [[2.0, 2.0, 2.01, 2.02, 2.02]] * 3}
    sweep = [sweep_row("fused", 4, 0.04, 0.5), sweep_row("fused", 256, 384.0, 0.01),
             sweep_row("foreach", 4, 1.0, 0.01), sweep_row("foreach", 256, 11.8, 0.01)]
    space = space_02(step, sweep, copy_gbps=0.01)  # planted too low: 2.8e6 % of it
    table = space["tables"]["step"]
    assert ceilings.above_ceiling(dict(zip(table["candidate"], table["pct_of_copy_ceiling"],
                                           strict=True)), "copy ceiling", "cpu")
    summary = summary_02(space)
    assert summary.loc["fused", ["label", "vs"]].tolist() == ["fastest", "-"]
    assert summary.loc["fused", "step_ms"] == 1.01
    assert summary["pct_of_copy_ceiling"].isna().all()  # the shares are above 1e6 %
    assert summary.loc["foreach", ["label", "vs"]].tolist() == ["slower 0.50x", "fused"]
    assert summary["sweep_label"].tolist()[:2] == ["tie", "slower 0.08x"]  # a cold first run
    assert summary["launches_per_step"].tolist()[:2] == [96.0, 192.0]
    assert "apex FusedAdam" not in space["optimizers"]
    assert summary.loc["apex FusedAdam", "label"] == "not measured"


def test_02_summary_reads_round_by_round_when_the_host_changed_speed():
    # each round steady, but fused's rounds apart by a factor of 3 (a host that changed speed):
    # it still beat foreach in every round, so the verdict stands; one round lost, and it falls
    step = {"fused": [[0.5] * 5, [1.0] * 5, [1.5] * 5], "foreach": [[2.0] * 5] * 3}
    sweep = [sweep_row("fused", 4, 1.0, 0.01), sweep_row("fused", 256, 2.0, 0.01)]
    space = space_02(step, sweep, copy_gbps=1000.0)
    assert space["tables"]["step"].set_index("candidate").loc["fused", "round_range_pct"] == 100
    summary = summary_02(space)
    assert summary.loc[["fused", "foreach"], "label"].tolist() == ["fastest", "slower 0.50x"]
    assert summary.loc["fused", "pct_of_copy_ceiling"] == 2.8  # 28 MB in 1 ms of 1000 GB/s
    step["fused"][2] = [2.5] * 5  # the last round lost to foreach
    summary = summary_02(space_02(step, sweep, copy_gbps=1000.0))
    assert summary.loc["foreach", "label"] == "tie"


def verdicts_02(space: dict) -> tuple[str, pd.DataFrame]:
    """Run 02's verdict cell (section 5): what it printed, and its verdict table."""
    text = run([cell("02_fused_adam_vs_adamw.ipynb", "pairs = [")], space)
    return text, space["tables"]["verdicts"]


def test_02_overlapping_rounds_are_a_tie_and_the_summary_names_the_tables_fastest():
    # apex wins two rounds of three, fused one: no speed-up, and the summary's fastest is the
    # table's (the lowest median of the rounds), with the tie beside it
    step = {"fused": [[1.0] * 5, [1.1] * 5, [0.95] * 5],
            "apex FusedAdam": [[1.02] * 5, [0.98] * 5, [0.99] * 5],
            "foreach": [[2.0] * 5, [2.1] * 5, [1.9] * 5]}
    sweep = [sweep_row("fused", 4, 1.0, 0.01), sweep_row("fused", 256, 2.0, 0.01)]
    space = space_02(step, sweep, copy_gbps=1000.0)
    text, table = verdicts_02(space)
    assert text == ""  # every candidate measured: nothing to say
    pair = table.set_index(["candidate", "vs"])
    assert pair.loc[("apex FusedAdam", "fused"), "label"] == "tie"  # never 'faster 1.01x'
    assert pair.loc[("apex FusedAdam", "foreach"), "label"].startswith("faster ")
    assert set(table["label"]) <= {"tie"} | {
        label for label in table["label"] if re.fullmatch(r"(faster|slower) \d+\.\d\dx", label)}
    step_table = space["tables"]["step"]
    fastest = step_table.loc[step_table["median_ms"].idxmin(), "candidate"]
    assert fastest == "apex FusedAdam"
    summary = summary_02(space)
    assert summary.loc[fastest, "label"] == "fastest"
    assert summary.loc["fused", ["label", "vs"]].tolist() == ["tie", fastest]
    assert summary.loc["foreach", "label"].startswith("slower ")
    assert summary["sweep_label"].isna().tolist() == [False, True, True]  # fused swept only


# ------------------------------------------------------------------ the smoke runs' saved tables
LABEL = re.compile(r"(faster|slower) \d+\.\d\dx|tie|reference|fastest|not measured|-")


@pytest.mark.notebook
@pytest.mark.smoke("01")
def test_01_smoke_run_saves_its_summary_and_verdicts_as_data(smoke_run):
    out, _ = smoke_run
    summary = pd.read_csv(out / "results" / "01_summary.csv", keep_default_na=False)
    assert list(summary.columns) == ["item", "value", "unit", "label", "vs"]
    assert all(LABEL.fullmatch(v) or v in ("ceiling", "PYTHON-ONLY") for v in summary["label"])
    gap = pd.read_csv(out / "results" / "01_ceiling_gap_verdicts.csv", keep_default_na=False)
    conditions = pd.read_csv(out / "results" / "01_ceiling_gap.csv")["condition"]
    assert set(gap["condition"]) < set(conditions) and set(gap["vs"]) < set(conditions)
    assert all(LABEL.fullmatch(v) for v in gap["label"])
    timing = pd.read_csv(out / "results" / "01_timing_demo.csv", keep_default_na=False)
    assert timing["label"].tolist()[-1] == "reference"


@pytest.mark.notebook
@pytest.mark.smoke("02")
def test_02_smoke_run_saves_one_summary_row_per_candidate(smoke_run):
    out, _ = smoke_run
    summary = pd.read_csv(out / "results" / "02_summary.csv", keep_default_na=False)
    step = pd.read_csv(out / "results" / "02_optimizer_step.csv")
    assert set(step["candidate"]) <= set(summary["candidate"])
    assert (summary["label"] == "fastest").sum() == 1
    assert all(LABEL.fullmatch(v) for v in summary["label"])
    kernels = pd.read_csv(out / "results" / "02_kernel_counts.csv")
    assert (kernels["per_tensor"] * kernels["tensors"]).round(6).equals(
        kernels["per_step"].round(6))
