"""Notebook 06's sweep made right and its new sections: the GPU-time sweep's launch-bound flag and
cast bytes, the sweep's prediction of a step set against the measured one, torchao's auto filter
read against the sweep, what a forward keeps for backward, and the strict correctness bound."""

from __future__ import annotations

import dataclasses
import json
import math

import pandas as pd
import pytest
import torch
from torch import nn

from helpers import bench, gpt, verdicts
from helpers.chapters import fp8


def _timing(samples):
    return bench.Timing(label="x", samples_ms=list(samples), device="cuda")


# ------------------------------------------------------------------ the sweep, timed right
def test_gpu_time_runs_setup_before_every_call_on_the_cpu():
    calls = []
    timing, call_ms = bench.gpu_time(lambda: calls.append("call"), "cpu", warmup=1, repeats=3,
                                     setup=lambda: calls.append("setup"))
    assert calls == ["setup", "call"] * 4 and call_ms == timing.median_ms


def test_gpu_time_without_setup_is_unchanged():
    calls = []
    bench.gpu_time(lambda: calls.append("call"), "cpu", warmup=0, repeats=2)
    assert calls == ["call", "call"]


def test_a_row_is_launch_bound_when_issuing_clearly_takes_longer_than_its_gpu_time():
    gpu = _timing([0.20, 0.21, 0.20, 0.21, 0.20])
    assert fp8.launch_bound(0.60, gpu)  # the host's 0.6 ms to issue 0.2 ms of GPU work
    assert fp8.launch_bound(0.27, gpu)  # 29% longer than its third quartile
    assert not fp8.launch_bound(0.25, gpu)  # 19% longer: a re-run's host may be that much faster
    # the H200 run's 768x768 bf16 row: issued in 0.187 ms, run in 0.186 - a tie, not a finding
    assert not fp8.launch_bound(0.187, _timing([0.185, 0.186, 0.186, 0.186, 0.187]))
    assert not fp8.launch_bound(0.15, gpu)  # issued faster than it runs: the host runs ahead


def test_twelve_ms_of_gpu_work_issued_in_a_fraction_of_it_is_not_launch_bound():
    # the H200 run's 4096x16384 bf16 row: GPU time 12.35 ms, back-to-back calls 14.26 ms - the
    # old rule (call time above the GPU time) flagged it; the host issues it in well under 1 ms
    gpu = _timing([12.34, 12.35, 12.35, 12.36, 12.35])
    assert not fp8.launch_bound(0.4, gpu)
    assert not fp8.launch_bound(12.0, gpu)


def test_on_the_cpu_or_without_a_measurement_nothing_is_launch_bound():
    cpu = bench.Timing(label="x", samples_ms=[0.2, 0.2, 0.2], device="cpu")
    assert not fp8.launch_bound(0.2, cpu) and not fp8.launch_bound(5.0, cpu)
    assert not fp8.launch_bound(math.nan, _timing([0.2, 0.2, 0.2]))


def test_the_host_clock_times_each_call_and_keeps_the_last_ones():
    calls = []
    clock = fp8.HostClock(lambda: calls.append(1))
    for _ in range(5):
        clock()
    assert len(calls) == 5 and len(clock.samples_ms) == 5
    assert all(ms >= 0 for ms in clock.samples_ms)
    clock.samples_ms[:] = [9.0, 9.0, 1.0, 2.0, 3.0]
    assert clock.median_of_last(3) == 2.0 and math.isnan(fp8.HostClock(print).median_of_last(3))


def test_cast_mb_counts_three_bytes_per_element_cast_and_rowwise_twice():
    assert fp8.cast_mb(1000, 100, 200, "bf16") == 0.0
    elements = 1000 * 100 + 100 * 200 + 1000 * 200
    assert fp8.cast_mb(1000, 100, 200, "tensorwise") == pytest.approx(3 * elements / 1e6)
    assert fp8.cast_mb(1000, 100, 200, "rowwise") == pytest.approx(6 * elements / 1e6)


def test_time_case_reports_gpu_time_call_time_and_the_flag_on_the_cpu():
    timed = fp8.time_case(nn.Linear(32, 48, bias=False, dtype=torch.bfloat16), 32, 48, 64,
                          device=torch.device("cpu"), warmup=1, repeats=3)
    assert timed["call_ms"] == timed["median_ms"] and timed["launch_bound"] is False
    assert math.isfinite(timed["issue_ms"]) and timed["issue_ms"] > 0  # the CPU: the whole call


def _row(k, n, recipe, ms, spread=0.01, tokens=1024, kind="square"):
    return {"shape": f"{k}x{n}", "kind": kind, "tokens": tokens, "in_features": k,
            "out_features": n, "recipe": recipe, "median_ms": ms, "q1_ms": ms * (1 - spread),
            "q3_ms": ms * (1 + spread), "iqr_ms": 2 * spread * ms, "compile_s": 1.0,
            "call_ms": ms, "launch_bound": False}


def _sweep():
    return fp8.sweep_table([
        _row(64, 64, "bf16", 1.0), _row(64, 64, "tensorwise", 1.5),
        _row(256, 256, "bf16", 4.0), _row(256, 256, "tensorwise", 2.0),
        _row(64, 192, "bf16", 2.0, kind="m"), _row(64, 192, "tensorwise", 3.0, kind="m")])


def test_sweep_table_adds_the_extra_time_and_the_bytes_cast():
    sweep = _sweep()
    row = sweep[(sweep["shape"] == "64x64") & (sweep["recipe"] == "tensorwise")].iloc[0]
    assert row["extra_ms_vs_bf16"] == pytest.approx(0.5)
    assert row["cast_mb"] == pytest.approx(fp8.cast_mb(1024, 64, 64, "tensorwise"))


# ------------------------------------------------------------------ the sweep against the step
def test_linear_shapes_counts_the_linears_a_filter_converts():
    with torch.device("meta"):
        model = gpt.GPT(dataclasses.replace(gpt.TINY, n_layer=3))
    shapes = fp8.linear_shapes(model, lambda m, fqn: fqn != "head")
    assert shapes == {(64, 192): 3, (64, 64): 3, (64, 256): 3, (256, 64): 3}
    assert fp8.linear_shapes(model)[(64, 256)] == 4  # the head too, without a filter


def test_predict_step_sums_count_times_the_difference_at_each_shape():
    predicted = fp8.predict_step(_sweep(), {(64, 64): 2, (256, 256): 1}, "tensorwise",
                                 tokens=1024)
    assert predicted["predicted_delta_ms"] == pytest.approx(2 * 0.5 + 1 * (-2.0))
    assert predicted["predicted_low_ms"] < predicted["predicted_delta_ms"] < \
        predicted["predicted_high_ms"]
    assert predicted["predicted_bf16_linears_ms"] == pytest.approx(2 * 1.0 + 4.0)
    assert predicted["linears"] == 3 and predicted["missing"] == ""


def test_predict_step_names_a_shape_the_sweep_did_not_time():
    predicted = fp8.predict_step(_sweep(), {(64, 64): 1, (128, 512): 1}, "tensorwise",
                                 tokens=1024)
    assert math.isnan(predicted["predicted_delta_ms"]) and predicted["missing"] == "128x512"
    assert math.isnan(fp8.predict_step(_sweep(), {(64, 64): 1}, "tensorwise",
                                       tokens=2048)["predicted_delta_ms"])  # other tokens


def _e2e(bf16_ms, fp8_ms, spread=0.01):
    return pd.DataFrame([
        {"recipe": "bf16", "status": "ran", "step_ms": bf16_ms,
         "step_ms_q1": bf16_ms * (1 - spread), "step_ms_q3": bf16_ms * (1 + spread)},
        {"recipe": "tensorwise", "status": "ran", "step_ms": fp8_ms,
         "step_ms_q1": fp8_ms * (1 - spread), "step_ms_q3": fp8_ms * (1 + spread)}])


def _predicted(delta, half=0.5):
    return {"predicted_delta_ms": delta, "predicted_low_ms": delta - half,
            "predicted_high_ms": delta + half, "predicted_bf16_linears_ms": 30.0, "linears": 48,
            "missing": ""}


def test_reconcile_row_reads_overlap_and_says_by_how_much_otherwise():
    close = fp8.reconcile_row("m", "tensorwise", _e2e(50.0, 58.0), _predicted(8.2))
    assert close["reading"] == "overlap"
    assert close["measured_delta_ms"] == pytest.approx(8.0)
    assert close["predicted_speedup"] == pytest.approx(50.0 / 58.2)
    assert close["measured_speedup"] == pytest.approx(50.0 / 58.0)
    assert close["published_speedup"] == fp8.PUBLISHED["tensorwise"]
    far = fp8.reconcile_row("m", "tensorwise", _e2e(50.0, 58.0), _predicted(17.7))
    assert far["reading"] == "predicted above"
    assert far["prediction_gap_ms"] == pytest.approx(9.7)
    faster = fp8.reconcile_row("m", "tensorwise", _e2e(50.0, 40.0), _predicted(-2.0))
    assert faster["reading"] == "predicted above"  # predicted -2 ms, measured -10 ms
    assert faster["prediction_gap_ms"] == pytest.approx(8.0)
    under = fp8.reconcile_row("m", "tensorwise", _e2e(50.0, 58.0), _predicted(2.0))
    assert under["reading"] == "predicted below"
    assert under["prediction_gap_ms"] == pytest.approx(-6.0)


def test_reconcile_row_without_a_run_or_a_prediction_says_so():
    lost = _e2e(50.0, 58.0)
    lost.loc[1, "status"] = "out of memory"
    assert fp8.reconcile_row("m", "tensorwise", lost, _predicted(8.0))["reading"].startswith(
        "not measured")
    missing = {**_predicted(math.nan), "missing": "64x64"}
    row = fp8.reconcile_row("m", "tensorwise", _e2e(50.0, 58.0), missing)
    assert row["reading"] == "no prediction" and row["missing"] == "64x64"


# ------------------------------------------------------------------ torchao's auto filter
def test_filter_table_reads_torchaos_filter_against_the_sweep():
    from torchao.float8 import _auto_filter_for_recipe

    with torch.device("meta"):
        small = gpt.GPT(gpt.GPT2_SMALL)
        wide = gpt.GPT(dataclasses.replace(gpt.GPT2_SMALL, d_model=4096, n_head=32, n_layer=2))
    filters = {r: _auto_filter_for_recipe(r, filter_fqns=["head"])
               for r in ("tensorwise", "rowwise")}
    sweep = fp8.sweep_table([_row(768, 2304, "bf16", 1.0), _row(768, 2304, "tensorwise", 1.4),
                             _row(768, 768, "bf16", 1.0), _row(768, 768, "tensorwise", 1.4)])
    table = fp8.filter_table({"small": small, "wide": wide}, filters, sweep)
    by = table.set_index(["model", "linear", "recipe"])
    # torchao's tensorwise thresholds: kept when K <= 4096 and N <= 1024
    assert by.loc[("small", "blocks.*.attn.qkv", "tensorwise"), "auto_filter_converts"]
    assert not by.loc[("small", "blocks.*.attn.proj", "tensorwise"), "auto_filter_converts"]
    assert not by.loc[("small", "head", "tensorwise"), "auto_filter_converts"]  # filter_fqns
    assert not table[(table["model"] == "small") & (table["recipe"] == "rowwise")][
        "auto_filter_converts"].any()  # rowwise keeps every Linear of width 768 in bf16
    assert table[(table["model"] == "wide") & (table["linear"] != "head")][
        "auto_filter_converts"].all()
    assert by.loc[("small", "blocks.*.attn.qkv", "tensorwise"), "count"] == 12
    # the sweep found float8 slower at both swept shapes: converting qkv disagrees with it
    assert by.loc[("small", "blocks.*.attn.qkv", "tensorwise"), "agrees"] is False
    assert by.loc[("small", "blocks.*.attn.proj", "tensorwise"), "agrees"] is True
    assert by.loc[("small", "blocks.*.mlp.fc", "tensorwise"), "agrees"] is None  # not swept
    read = table.dropna(subset=["agrees"])  # what the notebook prints: agreements of swept
    assert (int(read["agrees"].astype(bool).sum()), len(read)) == (1, 2)


# ------------------------------------------------------------------ kept for backward
def test_saved_for_backward_counts_a_bf16_weight_copy_and_a_float8_weight_by_reference():
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    x = torch.randn(64, 32, requires_grad=True)
    plain = nn.Linear(32, 48, bias=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = fp8.saved_for_backward(lambda: plain(x), plain.parameters())
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name("tensorwise"), emulate=True)
    converted = convert_to_float8_training(nn.Linear(32, 48, bias=False), config=config)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        f8 = fp8.saved_for_backward(lambda: converted(x), converted.parameters())
    weight_mib = 32 * 48 * 2 / 2**20  # the bf16 copy of the weight that autocast makes
    input_mib = 64 * 32 * 2 / 2**20  # the input, cast to bf16 by autocast
    assert bf16[bf16["kind"] == "new memory"]["mib"].sum() == pytest.approx(weight_mib + input_mib)
    ref = f8[f8["kind"] == "parameter (no new memory)"]
    assert ref["dtype"].tolist() == ["float32"] and ref["mib"].iloc[0] == pytest.approx(
        32 * 48 * 4 / 2**20)  # the fp32 master weight itself, kept by reference
    # new memory: the input alone, as it arrived (torchao's Linear applies a GPU's autocast
    # dtype only, so on the CPU the fp32 input itself): no copy of the weight
    assert f8[f8["kind"] == "new memory"]["mib"].sum() == pytest.approx(64 * 32 * 4 / 2**20)


# ------------------------------------------------------------------ the correctness bound
def test_a_product_barely_above_bf16s_error_does_not_pass():
    assert not fp8.product_ok(0.0040, 0.0039, 0.0625, through_fp8=True)  # the case
    assert fp8.product_ok(0.0040, 0.0017, 0.0625, through_fp8=True)
    assert not fp8.product_ok(2 * 0.0017, 0.0017, 0.0625, through_fp8=True)  # strict
    assert not fp8.product_ok(0.0625, 0.0017, 0.0625, through_fp8=True)  # strict at the top
    assert not fp8.product_ok(math.nan, 0.0017, 0.0625, through_fp8=True)
    assert fp8.product_ok(0.0017, 0.0017, 0.0017, through_fp8=False)  # high precision: <= bf16
    assert not fp8.product_ok(0.0018, 0.0017, 0.0017, through_fp8=False)


# ------------------------------------------------------------------ the notebook's new tables
@pytest.mark.notebook
@pytest.mark.smoke("06")
def test_the_smoke_run_saves_the_wide_model_reconciliation_filter_and_memory_tables(smoke_run):
    out, runs = smoke_run
    name = "06_fp8_on_hopper.ipynb"
    if name not in runs:
        pytest.skip("06 is not in this smoke run")
    assert runs[name].ok, runs[name].error
    results = out / "results"
    wide = pd.read_csv(results / "06_wide_end_to_end.csv")
    assert list(wide["recipe"]) == ["bf16", "tensorwise"] and (wide["status"] == "ran").all()
    assert wide["batch_checksum"].nunique() == 1  # the wide runs saw the same batches
    losses = json.loads((results / "06_wide_losses.json").read_text())
    assert set(losses["runs"]) == {"bf16", "bf16 (repeat 1)", "bf16 (seed 1)", "bf16 (seed 2)",
                                   "tensorwise"}
    assert losses["config"]["d_model"] == 128 and 0.0 <= losses["noise_floor"] < 1e-3  # a CPU
    # the other seeds are the yardstick, whatever the floor
    assert losses["yardstick"]["name"] == verdicts.SEEDS and losses["yardstick"]["scale"] > 0
    assert (wide["yardstick"] == losses["yardstick"]["name"]).all()
    sweep = pd.read_csv(results / "06_width_sweep.csv")
    assert {"call_ms", "issue_ms", "launch_bound", "cast_mb", "extra_ms_vs_bf16"} <= set(
        sweep.columns)
    assert not sweep["launch_bound"].any() and (sweep["issue_ms"] > 0).all()  # the CPU
    assert (sweep.loc[sweep["recipe"] == "bf16", "mode"] == "eager").all()
    assert {"128x384", "128x512", "512x128", "64x192", "64x256", "256x64"} <= set(sweep["shape"])
    reconciled = pd.read_csv(results / "06_reconciled.csv")
    assert list(zip(reconciled["model"], reconciled["recipe"], strict=True)) == [
        ("GPT 2 x 64", "tensorwise"), ("GPT 2 x 64", "rowwise"), ("GPT 1 x 128", "tensorwise")]
    assert reconciled["predicted_delta_ms"].notna().all()
    assert (reconciled["linears"] == [8, 8, 4]).all()
    auto = pd.read_csv(results / "06_auto_filter.csv")
    assert set(auto["model"]) == {"GPT 2 x 64", "GPT 1 x 128"}
    assert not auto["auto_filter_converts"].any()  # torchao's thresholds keep tiny Linears
    memory = pd.read_csv(results / "06_memory.csv").set_index(["model", "part"])
    assert set(memory.index.get_level_values("part")) >= set(fp8.STEP_MEMORY)
    counted = memory.xs("parameters", level="part")
    assert (counted[["bf16", "tensorwise"]] > 0).all().all()
    assert (memory.xs("saved for backward", level="part")["bf16"] > 0).all()
