"""Timing verdicts and kernel counting shared by notebooks 02 and 03."""

import pandas as pd
import pytest
import torch

from helpers import bench, errors, kernels, verdicts


def test_pair_says_faster_and_slower_from_the_numbers():
    assert verdicts.pair(1.0, 2.0) == ("faster", 2.0, "")
    assert verdicts.pair(2.0, 1.0) == ("slower", 0.5, "")


def test_small_differences_and_overlapping_iqrs_are_ties():
    assert verdicts.pair(1.00, 1.02)[::2] == (verdicts.TIE_WORD, "within 3%")
    assert verdicts.pair(1.0, 1.2, a_iqr=(0.9, 1.15), b_iqr=(1.1, 1.3))[2] == "IQRs overlap"
    assert verdicts.pair(1.0, 1.2, a_iqr=(0.95, 1.05), b_iqr=(1.1, 1.3))[0] == "faster"
    word, _, why = verdicts.pair(1.0, 3.0, a_iqr=(0.5, 1.5), b_iqr=(2.9, 3.1))
    assert word == verdicts.TIE_WORD and why.startswith("a spread of 100% of its median")


def test_is_tie_rejects_non_positive_times():
    with pytest.raises(ValueError):
        verdicts.is_tie(0.0, 1.0)


def test_fastest_reads_a_table():
    df = pd.DataFrame({"candidate": ["x", "y"], "median_ms": [3.0, 1.0], "q1_ms": [2.9, 0.9],
                       "q3_ms": [3.1, 1.1]})
    assert verdicts.fastest(df) == "y"
    assert verdicts.fastest(df, among=["x"]) == "x"


def test_count_kernels_on_cpu_counts_outermost_ops():
    a = torch.randn(64)
    counts = kernels.count_kernels(lambda: (a + 1).mul_(2), "cpu", calls=2)
    assert counts["what"] == "aten ops (CPU)"
    assert counts["per_call"] == 2
    assert "matching_per_call" not in counts
    matched = kernels.count_kernels(lambda: a + 1, "cpu", match=("add",))
    assert matched["matching_per_call"] == 1


def test_short_name_drops_templates():
    assert kernels.short_name("void kernel<float, 4>(int)") == "kernel"
    assert kernels.short_name("void at::native::(anonymous namespace)::k<1>(int)") == (
        "at::native::k")
    assert len(kernels.short_name("x" * 100, width=10)) == 10


def test_hold_gpu_is_a_no_op_on_the_cpu():
    assert bench.hold_gpu("cpu") is None


def test_gpu_time_on_the_cpu_is_one_timing_used_twice():
    calls = []
    timing, call_ms = bench.gpu_time(lambda: calls.append(1), "cpu", warmup=1, repeats=3)
    assert len(calls) == 4  # warm-up and repeats once: no second, held measurement on the CPU
    assert call_ms == timing.median_ms and len(timing.samples_ms) == 3


def test_oom_exit_turns_oom_into_one_sentence():
    with pytest.raises(errors.CourseError, match="Out of GPU memory while testing"):
        with errors.oom_exit("testing"):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_tied_with_fastest_names_the_rows_tied_with_the_winner():
    df = pd.DataFrame([
        {"candidate": "a", "median_ms": 1.00, "q1_ms": 0.99, "q3_ms": 1.01},
        {"candidate": "b", "median_ms": 1.02, "q1_ms": 1.00, "q3_ms": 1.25},  # within 3%
        {"candidate": "c", "median_ms": 1.20, "q1_ms": 1.005, "q3_ms": 1.3},  # IQRs overlap
        {"candidate": "d", "median_ms": 2.00, "q1_ms": 1.90, "q3_ms": 2.10},
        {"candidate": "e", "median_ms": 3.00, "q1_ms": 2.00, "q3_ms": 4.00},  # too noisy
    ])
    clear = df[df["candidate"] != "e"]
    assert verdicts.tied_with_fastest(clear) == ["a", "b", "c"]
    assert verdicts.tied_with_fastest(df, among=["a", "d"]) == ["a"]
    assert set(verdicts.noisy_rows(df)) == {"e"}
    assert verdicts.tied_with_fastest(df.drop(columns=["q1_ms", "q3_ms"])) == ["a", "b"]


def test_comparison_table_reads_any_name_column_with_or_without_iqrs():
    df = pd.DataFrame({"run": ["x", "y"], "median_ms": [1.0, 1.2], "q1_ms": [0.95, 1.1],
                       "q3_ms": [1.15, 1.3]})
    got = verdicts.comparison_table(df, [("x", "y"), ("x", "absent")], key="run")
    assert list(got.columns) == ["run", "vs", "run_ms", "vs_ms", "speedup", "verdict", "why"]
    assert (got.iloc[0].verdict, got.iloc[0].why) == (verdicts.TIE_WORD, "IQRs overlap")
    medians = verdicts.comparison_table(df.drop(columns=["q1_ms", "q3_ms"]), [("x", "y")],
                                        key="run").iloc[0]
    assert (medians.verdict, medians.speedup) == ("faster", pytest.approx(1.2))
    assert verdicts.label(medians.verdict, medians.speedup) == "faster 1.20x"
    assert verdicts.row_iqr(df.iloc[0]) == (0.95, 1.15)
    assert verdicts.row_iqr(df.drop(columns=["q3_ms"]).iloc[0]) is None
