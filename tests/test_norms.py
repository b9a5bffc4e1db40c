"""Notebook 03's helpers: configs, bytes counted, the float64 reference, tolerances, building
the notebook's factories, timings, and the verdict table (helpers.verdicts.verdict_table)."""

import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import verdicts
from helpers.chapters import norms

EPS = 1e-5

PLAIN = {
    "LayerNorm": {"torch LayerNorm": lambda h, cfg, dev: nn.LayerNorm(
        h, eps=EPS, device=dev, dtype=cfg.w_dtype)},
    "RMSNorm": {"torch RMSNorm": lambda h, cfg, dev: nn.RMSNorm(
        h, eps=EPS, device=dev, dtype=cfg.w_dtype)},
}


class NormThenCast(nn.Module):
    def __init__(self, norm, out_dtype):
        super().__init__()
        self.norm, self.out_dtype = norm, out_dtype

    def forward(self, x):
        return self.norm(x).to(self.out_dtype)


MIXED = {
    "LayerNorm": {"torch LayerNorm + cast": lambda h, cfg, dev: NormThenCast(
        nn.LayerNorm(h, eps=EPS, device=dev), cfg.w_dtype)},
    "RMSNorm": {"torch RMSNorm + cast": lambda h, cfg, dev: NormThenCast(
        nn.RMSNorm(h, eps=EPS, device=dev), cfg.w_dtype)},
}


def test_configs_per_device():
    cpu = [c.label for c in norms.configs_for("cpu", bf16=True)]
    assert cpu == ["fp32", "bf16"]  # no fp16 and no mixed configs on the CPU
    cuda = [c.label for c in norms.configs_for("cuda", bf16=True)]
    assert cuda == ["fp32", "bf16", "fp16", "fp32->bf16", "fp32->fp16"]
    assert [c.label for c in norms.configs_for("cuda", bf16=False)] == [
        "fp32", "fp16", "fp32->fp16"]
    mixed = norms.Config("fp32", "bf16")
    assert mixed.mixed and mixed.x_dtype == torch.float32 and mixed.w_dtype == torch.bfloat16


def test_bytes_counted():
    n, h = 1024, 4096
    # forward: read x + write y (2 B each) + weight and bias (2 B each)
    assert norms.norm_bytes(n, h, 2, 2, 2 * h * 2, "forward") == 2 * n * h * 2 + 2 * h * 2
    # forward+backward: 5 passes over N*H plus 3 passes over the affine vectors
    assert norms.norm_bytes(n, h, 2, 2, h * 2, "forward+backward") == 5 * n * h * 2 + 3 * h * 2
    # mixed: x, dx in fp32; y, dy in bf16
    assert norms.norm_bytes(n, h, 4, 2, h * 2, "forward+backward") == (
        n * h * (4 + 2) + n * h * (2 * 4 + 2) + 3 * h * 2)


@pytest.mark.parametrize("norm", norms.NORMS)
def test_reference_matches_torch_in_float64(norm):
    x = torch.randn(8, 32, dtype=torch.float64, requires_grad=True)
    params = norms.affine_params(norm, 32)
    dy = torch.randn(8, 32, dtype=torch.float64)
    ref = norms.reference(norm, x, params, EPS, dy)
    p64 = [p.double().requires_grad_(True) for p in params]
    if norm == "LayerNorm":
        y = F.layer_norm(x, (32,), p64[0], p64[1], EPS)
    else:
        y = F.rms_norm(x, (32,), p64[0], EPS)
    expected = [y.detach(), *torch.autograd.grad(y, [x, *p64], dy)]
    assert len(ref) == len(expected) == (4 if norm == "LayerNorm" else 3)
    for got, want in zip(ref, expected, strict=True):
        torch.testing.assert_close(got, want)
    forward_only = norms.reference(norm, x, params, EPS)
    assert len(forward_only) == 1 and torch.equal(forward_only[0], ref[0])


def test_affine_params_are_random_not_ones_and_zeros():
    weight, bias = norms.affine_params("LayerNorm", 64)
    assert not torch.allclose(weight, torch.ones(64)) and not torch.allclose(bias, torch.zeros(64))
    assert torch.equal(weight, norms.affine_params("LayerNorm", 64)[0])  # seeded


def test_load_affine_refuses_a_norm_without_its_parameters():
    with pytest.raises(ValueError, match="has 0 parameters, not 2"):
        norms.load_affine(nn.LayerNorm(8, elementwise_affine=False),
                          norms.affine_params("LayerNorm", 8))
    wrapped = norms.load_affine(NormThenCast(nn.LayerNorm(8), torch.bfloat16),
                                norms.affine_params("LayerNorm", 8))
    assert torch.equal(wrapped.norm.bias, norms.affine_params("LayerNorm", 8)[1])


def test_check_uses_the_dtype_tolerance():
    ref = torch.linspace(-2, 2, 101, dtype=torch.float64)
    assert norms.check(ref.float(), ref)["ok"]
    assert norms.check(ref.bfloat16(), ref)["ok"]  # rounding to bf16 is within tolerance
    off = norms.check((ref * 1.05).bfloat16(), ref)  # a 5% error is not
    assert not off["ok"] and off["max_rel_err"] == pytest.approx(0.05, rel=0.1)


def test_build_uses_plain_or_mixed_factories_by_config_and_passes_correctness():
    configs = [norms.Config("fp32", "fp32"), norms.Config("bf16", "bf16"),
               norms.Config("fp32", "bf16")]
    entries, inputs, compile_error = norms.build(PLAIN, MIXED, configs, 32, 64, "cpu", fix="x")
    assert compile_error == ""
    assert [(e.cfg.label, e.name) for e in entries] == [
        ("fp32", "torch LayerNorm"), ("fp32", "torch RMSNorm"),
        ("bf16", "torch LayerNorm"), ("bf16", "torch RMSNorm"),
        ("fp32->bf16", "torch LayerNorm + cast"), ("fp32->bf16", "torch RMSNorm + cast")]
    assert not any(e.compiled for e in entries) and all(e.first_call_s > 0 for e in entries)
    assert inputs["fp32->bf16"][0].dtype == torch.float32
    assert inputs["fp32->bf16"][1].dtype == torch.bfloat16
    table = norms.correctness(entries, inputs, EPS)
    assert len(table) == 3 * (4 + 3)  # three dtypes; LayerNorm 4 tensors, RMSNorm 3
    assert table["ok"].all(), table[~table["ok"]]


def test_correctness_catches_a_wrong_eps():
    cfg = norms.Config("fp32", "fp32")
    module = torch.nn.RMSNorm(64, eps=None)  # finfo(fp32).eps, not the course's 1e-5
    norms.load_affine(module, norms.affine_params("RMSNorm", 64))
    entry = norms.Entry("RMSNorm", "torch RMSNorm", cfg, module, compiled=False)
    x, dy = norms.make_inputs(16, 64, cfg, "cpu")
    small = x.detach().mul(0.001).requires_grad_(True)  # mean square near eps, where it matters
    table = norms.correctness([entry], {"fp32": (small, dy)}, EPS)
    assert not table["ok"].all()


def test_a_failing_compile_drops_the_compiled_candidates_with_one_line():
    def broken_backend(gm, example_inputs):
        try:
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore lines")
        except RuntimeError as inner:
            raise ValueError("backend raised:\n(long traceback)") from inner

    plain = {norm: dict(cands) for norm, cands in PLAIN.items()}
    plain["RMSNorm"]["torch.compile RMSNorm"] = lambda h, cfg, dev: torch.compile(
        nn.RMSNorm(h, eps=EPS, device=dev, dtype=cfg.w_dtype), backend=broken_backend)
    cfgs = [norms.Config("fp32", "fp32"), norms.Config("bf16", "bf16")]
    torch._dynamo.reset()
    entries, _, error = norms.build(plain, MIXED, cfgs, 8, 32, "cpu", fix="set compile_native")
    assert {e.name for e in entries} == {"torch LayerNorm", "torch RMSNorm"}
    assert len(entries) == 4 and not any(e.compiled for e in entries)
    assert "\n" not in error and "No working C++ compiler" in error
    assert error.startswith("torch.compile failed") and "set compile_native" in error
    assert error.endswith("compiled candidates left out")


def test_timings_and_sweep_produce_the_saved_columns_and_bytes():
    cfg = norms.Config("fp32", "fp32")
    sweep = norms.hidden_sweep(PLAIN, cfg, 16, [32, 64], "cpu", 10.0, warmup=0, repeats=2)
    assert len(sweep) == 2 * 2 * 2  # hiddens x norms x passes
    entries, inputs, _ = norms.build(PLAIN, MIXED, [cfg], 16, 32, "cpu", fix="")
    table = norms.timings(entries, inputs, 10.0, warmup=0, repeats=2)
    for column in ("norm", "candidate", "dtype", "pass", "median_ms", "q1_ms", "q3_ms", "gbps",
                   "pct_of_copy_ceiling", "call_ms", "launch_bound"):
        assert column in table.columns
    assert set(table["pass"]) == {"forward", "forward+backward"}
    assert (table["call_ms"] == table["median_ms"]).all()  # one timing on the CPU
    assert not table["launch_bound"].any()
    for t in (table, sweep):  # GB/s is the bytes counted over the median time, 1e9 B/s
        expected = t["bytes"] / (t["median_ms"] * 1e-3) / 1e9
        assert (t["gbps"] - expected).abs().max() <= 1e-9 * expected.max()
        assert ((t["pct_of_copy_ceiling"] - 100 * t["gbps"] / 10.0).abs() < 1e-6).all()
    # fp32, 16 x 32: forward reads x and writes y (4 B each), plus the affine vectors (LayerNorm
    # weight and bias, RMSNorm weight); forward+backward adds x, dy read and dx written, and
    # the vectors read again with their gradients written
    expected = {("LayerNorm", "forward"): 16 * 32 * 8 + 2 * 32 * 4,
                ("RMSNorm", "forward"): 16 * 32 * 8 + 32 * 4,
                ("LayerNorm", "forward+backward"): 16 * 32 * 20 + 3 * 2 * 32 * 4,
                ("RMSNorm", "forward+backward"): 16 * 32 * 20 + 3 * 32 * 4}
    assert all(r["bytes"] == expected[(r.norm, r["pass"])] for _, r in table.iterrows())


def _rows(group, times, *, spread=0.01, call=None):
    """Timing rows of one group: candidate -> median (IQR +-spread; call_ms = median or call)."""
    return [{**group, "candidate": name, "median_ms": ms, "q1_ms": ms * (1 - spread),
             "q3_ms": ms * (1 + spread), "call_ms": (call or {}).get(name, ms),
             "launch_bound": name in (call or {})} for name, ms in times.items()]


def test_verdict_table_flips_when_the_numbers_flip_and_flags_ties():
    group = {"norm": "LayerNorm", "dtype": "bf16", "pass": "forward"}
    fast = pd.DataFrame(_rows(group, {"torch LayerNorm": 2.0, "apex FusedLayerNorm": 1.0}))
    row = verdicts.verdict_table(fast, ["norm", "dtype", "pass"]).iloc[0]
    assert row["fastest"] == "apex FusedLayerNorm" and row["tied_with_fastest"] == ""
    assert row["fastest_ms"] == 1.0 and row["torch LayerNorm x"] == pytest.approx(2.0)
    assert row["apex FusedLayerNorm x"] == 1.0
    slow = pd.DataFrame(_rows(group, {"torch LayerNorm": 1.0, "apex FusedLayerNorm": 2.0}))
    assert verdicts.verdict_table(slow, ["norm"]).iloc[0]["fastest"] == "torch LayerNorm"
    tie = pd.DataFrame(_rows(group, {"torch LayerNorm": 1.01, "apex FusedLayerNorm": 1.0}))
    row = verdicts.verdict_table(tie, ["norm"]).iloc[0]  # within verdicts.TIE_FRACTION
    assert row["fastest"] == "apex FusedLayerNorm" and row["tied_with_fastest"] == "torch LayerNorm"
    overlap = pd.DataFrame(_rows(group, {"a": 1.0, "b": 1.1}, spread=0.08))  # IQRs overlap
    assert verdicts.verdict_table(overlap, ["norm"]).iloc[0]["tied_with_fastest"] == "b"
    no_iqr = verdicts.verdict_table(overlap, ["norm"], iqr=None).iloc[0]  # medians only
    assert no_iqr["tied_with_fastest"] == ""


def test_verdict_table_shares_columns_through_the_label_and_flags_launch_bound():
    rows = []
    for norm, dtype, times in (
            ("LayerNorm", "bf16", {"torch.compile LayerNorm": 1.0, "torch LayerNorm": 1.5}),
            ("RMSNorm", "fp32->bf16", {"apex MixedFusedRMSNorm": 1.0, "torch RMSNorm + cast": 2.0,
                                       "torch.compile RMSNorm + cast": 1.2})):
        group = {"norm": norm, "dtype": dtype, "pass": "forward+backward"}
        call = {"torch.compile LayerNorm": 3.0} if norm == "LayerNorm" else None
        rows += _rows(group, times, call=call)
    table = norms.verdict_table(pd.DataFrame(rows))
    assert list(table.columns) == [
        "norm", "dtype", "pass", "fastest", "tied_with_fastest", "fastest_ms", "torch.compile x",
        "torch x", "apex Fused x", "launch_bound", "too_noisy"]
    ln, rms = table.iloc[0], table.iloc[1]
    assert ln["fastest"] == "torch.compile LayerNorm" and math.isnan(ln["apex Fused x"])
    assert ln["launch_bound"] == "torch.compile"  # the ranking per call: norms.rankings
    # the mixed case: Apex judged against the best native, the compiled norm-and-cast
    assert rms["fastest"] == "apex MixedFusedRMSNorm" and rms["torch.compile x"] == 1.2
    assert rms["torch x"] == 2.0 and rms["launch_bound"] == ""
    assert list(table["too_noisy"]) == ["", ""]


def test_family_drops_the_norm_the_cast_and_mixed():
    assert [norms.family(n) for n in ("torch LayerNorm", "torch.compile RMSNorm + cast",
                                      "apex FusedLayerNorm", "apex MixedFusedRMSNorm")] == [
        "torch", "torch.compile", "apex Fused", "apex Fused"]


def test_crossovers_name_the_fastest_per_hidden_size_and_ties():
    rows = []
    for hidden, apex_ms, torch_ms in ((768, 2.0, 1.0), (1024, 1.0, 1.01), (4096, 1.0, 2.0)):
        group = {"norm": "LayerNorm", "pass": "forward", "hidden": hidden}
        rows += _rows(group, {"torch LayerNorm": torch_ms, "apex FusedLayerNorm": apex_ms},
                      spread=0.0)
    table = norms.crossovers(pd.DataFrame(rows))
    assert list(table[("LayerNorm", "forward")]) == ["torch", "apex Fused = torch", "apex Fused"]
    assert list(table.index) == [768, 1024, 4096]


def test_rounding_table_compares_apex_with_torch_per_dtype():
    table = pd.DataFrame([
        {"norm": "LayerNorm", "dtype": "bf16", "candidate": "torch LayerNorm", "tensor": "y",
         "max_rel_err": 2e-3},
        {"norm": "LayerNorm", "dtype": "bf16", "candidate": "apex FusedLayerNorm", "tensor": "y",
         "max_rel_err": 6e-3},
        {"norm": "LayerNorm", "dtype": "bf16", "candidate": "apex FusedLayerNorm", "tensor": "dx",
         "max_rel_err": 9e-1},
        {"norm": "LayerNorm", "dtype": "fp32", "candidate": "apex FusedLayerNorm", "tensor": "y",
         "max_rel_err": 1e-7},
    ])
    rows = norms.rounding_table(table).to_dict("records")
    assert rows == [{"norm": "LayerNorm", "dtype": "bf16", "apex_y_err": 6e-3,
                     "torch_y_err": 2e-3, "apex_over_torch": pytest.approx(3.0)}]
    torch_only = table[table["candidate"].str.startswith("torch")]
    assert norms.rounding_table(torch_only).empty


def _gbps_rows(hiddens=(64,)):
    """Timing rows with a gbps column: both norms and passes, two dtypes, torch and apex."""
    rows = []
    for norm in norms.NORMS:
        for pass_ in norms.PASSES:
            for hidden in hiddens:
                for dtype, k in (("fp32", 1.0), ("fp32->bf16", 2.0)):
                    for name, gbps in ((f"torch {norm} + cast" if "->" in dtype
                                        else f"torch {norm}", 10.0 * k),
                                       (f"apex Fused{norm}", 20.0 * k + hidden)):
                        rows.append({"norm": norm, "pass": pass_, "hidden": hidden,
                                     "dtype": dtype, "candidate": name, "gbps": gbps})
    return pd.DataFrame(rows)


def test_bars_and_sweep_chart_draw_gbps_per_family_against_the_copy_ceiling():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = norms.bars(_gbps_rows(), "forward", copy_gbps=100.0)
    for ax, norm in zip(fig.axes, norms.NORMS, strict=True):
        assert ax.get_title() == f"{norm}, forward"
        torch_bars, apex_bars = ax.containers
        assert [b.get_height() for b in torch_bars] == [10.0, 20.0]  # the cast counts as torch
        assert [b.get_height() for b in apex_bars] == [84.0, 104.0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32", "fp32->bf16"]
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert set(labels) == {"torch", "apex Fused", "copy ceiling"}
        ceiling = [line for line in ax.get_lines() if line.get_label() == "copy ceiling"]
        assert list(ceiling[0].get_ydata()) == [100.0, 100.0]
    plt.close(fig)
    sweep = _gbps_rows(hiddens=(64, 512, 4096))
    fig = norms.sweep_chart(sweep[sweep["dtype"] == "fp32"], copy_gbps=100.0)
    assert len(fig.axes) == len(norms.NORMS) * len(norms.PASSES)
    assert [t.get_text() for t in fig.axes[-1].get_xticklabels()] == ["64", "512", "4,096"]
    for ax in fig.axes:
        assert list(ax.get_xticks()) == [64, 512, 4096]  # the sizes measured, not powers of 2
        lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
        assert lines["copy ceiling"] == [100.0, 100.0]
        assert [v for k, v in lines.items() if k.startswith("apex")] == [[84.0, 532.0, 4116.0]]
    plt.close(fig)


# ------------------------------------------------------------------ GPU time and time per call
KEY = ("LayerNorm", "fp32", "forward+backward")
MIXED_KEY = ("LayerNorm", "fp32->bf16", "forward+backward")
COMPILED = {"torch.compile LayerNorm", "torch.compile LayerNorm + cast"}


def _ranked(call, gpu=None, mixed_call=None):
    """norms.rankings of one fp32 and one mixed row: GPU times (compiled fastest, as on the
    reference H200 run unless ``gpu`` says otherwise) and per-call rounds."""
    gpu = gpu or {"torch LayerNorm": 0.63, "torch.compile LayerNorm": 0.36,
                  "apex FusedLayerNorm": 0.61}
    mixed_gpu = {"torch LayerNorm + cast": 0.91, "torch.compile LayerNorm + cast": 0.34,
                 "apex MixedFusedLayerNorm": 0.58}
    rows = (_rows(dict(zip(norms.VERDICT_KEYS, KEY, strict=True)), gpu)
            + _rows(dict(zip(norms.VERDICT_KEYS, MIXED_KEY, strict=True)), mixed_gpu))
    verdict = norms.verdict_table(pd.DataFrame(rows))
    mixed_call = mixed_call or {"torch LayerNorm + cast": [0.91, 0.92, 0.91, 0.90, 0.91],
                                "torch.compile LayerNorm + cast": [0.90, 0.91, 0.89, 0.92, 0.9],
                                "apex MixedFusedLayerNorm": [0.58, 0.59, 0.58, 0.57, 0.58]}
    return norms.rankings(verdict, {KEY: call, MIXED_KEY: mixed_call}, COMPILED)


def test_rankings_show_gpu_time_and_time_per_call_when_they_disagree():
    # the reference run's case: compiled fastest on the GPU, eager torch fastest per call
    call = {"torch LayerNorm": [0.63, 0.62, 0.64, 0.63, 0.63],
            "torch.compile LayerNorm": [0.94, 0.90, 0.95, 0.93, 0.94],
            "apex FusedLayerNorm": [0.80, 0.81, 0.79, 0.80, 0.80]}
    ranks = _ranked(call).set_index("dtype")
    row = ranks.loc["fp32"]
    assert (row["gpu_fastest"], row["gpu_verdict"]) == ("torch.compile", "faster 1.69x")
    assert (row["call_fastest"], row["call_verdict"]) == ("torch", "faster 1.27x")
    assert (row["eager_call_fastest"], row["eager_call_verdict"]) == ("torch", "faster 1.27x")
    mixed = ranks.loc["fp32->bf16"]
    assert mixed["gpu_fastest"] == "torch.compile"
    assert (mixed["call_fastest"], mixed["eager_call_fastest"]) == ("apex Fused", "apex Fused")
    # the summary's counts are those of this table, for both rankings
    wins = norms.clear_wins(ranks.reset_index())
    assert wins.loc["torch.compile", "gpu"] == 2 and wins.loc["torch.compile", "call"] == 0
    assert wins.loc["torch", "call"] == 1 and wins.loc["apex Fused", "eager_call"] == 1


def test_overlapping_rounds_are_no_speedup_per_call():
    # torch wins 4 rounds of 5 and loses one: the rounds disagree, so no winner per call
    call = {"torch LayerNorm": [0.60, 0.61, 0.60, 0.70, 0.60],
            "torch.compile LayerNorm": [0.94, 0.93, 0.95, 0.94, 0.94],
            "apex FusedLayerNorm": [0.66, 0.66, 0.67, 0.66, 0.66]}
    row = _ranked(call).iloc[0]
    assert row["call_verdict"] == "tie" and row["call_fastest"] == "torch = apex Fused"
    assert row["eager_call_verdict"] == "tie"
    # apex's rounds range 50% (the host changed speed): still read round by round, a tie
    wobbly = dict(call, **{"apex FusedLayerNorm": [0.66, 0.99, 0.67, 0.66, 0.66]})
    assert _ranked(wobbly).iloc[0]["call_verdict"] == "tie"
    steady = dict(call, **{"torch LayerNorm": [0.45, 0.62, 0.50, 0.52, 0.50]})  # wins all 5
    assert _ranked(steady).iloc[0]["call_verdict"].startswith("faster ")
    ranks = _ranked(call)
    assert norms.clear_wins(ranks).loc["no clear winner", "call"] == 1


@pytest.mark.parametrize("gpu_winner", ["torch.compile LayerNorm", "apex FusedLayerNorm"])
def test_summary_counts_come_from_the_table_they_summarize(gpu_winner):
    gpu = {"torch LayerNorm": 0.63, "torch.compile LayerNorm": 0.9, "apex FusedLayerNorm": 0.8}
    gpu[gpu_winner] = 0.3
    call = {"torch LayerNorm": [0.63] * 5, "torch.compile LayerNorm": [0.94] * 5,
            "apex FusedLayerNorm": [0.80] * 5}
    ranks = _ranked(call, gpu=gpu)
    wins = norms.win_table(ranks)
    assert list(wins.columns.unique(0)) == ["all 2 rows", "1 mixed-dtype rows"]
    assert wins.index[-1] == "no clear winner"
    for name in norms.RANKINGS:
        counted = wins["all 2 rows"][name]
        clear = ranks[f"{name}_verdict"].str.startswith("faster")
        table = ranks.loc[clear, f"{name}_fastest"].value_counts().to_dict()
        assert counted[counted > 0].to_dict() == {
            **table, **({"no clear winner": int((~clear).sum())} if (~clear).any() else {})}, name
    by_gpu = wins["all 2 rows"]["gpu"]  # the mixed row: compiled
    assert by_gpu[norms.family(gpu_winner)] == (2 if gpu_winner.startswith("torch.c") else 1)
    mixed = wins["1 mixed-dtype rows"].reindex(["apex Fused"]).fillna(0).iloc[0].to_dict()
    assert mixed == {"gpu": 0, "call": 1, "eager_call": 1}


def test_one_candidate_rows_carry_no_verdict():
    rows = _rows({"norm": "LayerNorm", "dtype": "fp32", "pass": "forward"},
                 {"torch LayerNorm": 1.0})
    timing = pd.DataFrame(rows)
    assert norms.one_candidate(timing)
    ranks = norms.rankings(norms.verdict_table(timing),
                           {("LayerNorm", "fp32", "forward"): {"torch LayerNorm": [1.0, 1.1]}},
                           set())
    assert set(ranks.filter(like="_verdict").iloc[0]) == {norms.NO_RIVAL}
    assert norms.clear_wins(ranks).loc["no clear winner"].tolist() == [1, 1, 1]
    assert not norms.one_candidate(pd.DataFrame(_rows({"norm": "LayerNorm", "dtype": "fp32",
                                                      "pass": "forward"}, {"a": 1.0, "b": 2.0})))


def test_call_rounds_time_every_candidate_in_every_round():
    cfg = norms.Config("fp32", "fp32")
    entries, inputs, _ = norms.build(PLAIN, MIXED, [cfg], 8, 16, "cpu", fix="")
    call = norms.call_rounds(entries, inputs, rounds=2, warmup=0, repeats=1)
    assert set(call) == {(n, "fp32", p) for n in norms.NORMS for p in norms.PASSES}
    assert all(len(ms) == 2 for r in call.values() for ms in r.values())
    frame = norms.rounds_frame(call)
    assert list(frame.columns[:4]) == ["norm", "dtype", "pass", "candidate"]
    assert len(frame) == 4 and "range_pct" in frame.columns and "stable" not in frame.columns


@pytest.mark.notebook
@pytest.mark.smoke("03")
def test_smoke_run_prints_no_reading_that_cannot_mean_anything_there(smoke_run):
    """The smoke run's 03: no empty DataFrame shown, sizes under 1 MiB in KiB; on the CPU (one
    candidate per row) no verdict, and the saved rankings carry none either; with more
    candidates, the summary's counts are those of the rankings table it shows."""
    import nbformat

    out, runs = smoke_run
    run = runs["03_fused_layernorm_rmsnorm.ipynb"]
    executed = nbformat.read(run.output, as_version=4)
    texts = [o.get("text") or o.get("data", {}).get("text/plain", "")
             for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [t for t in texts if "Empty DataFrame" in t]
    assert not [t for t in texts if " 0 MiB" in t or "- MiB" in t]
    ranks = pd.read_csv(out / "results" / "03_rankings.csv", keep_default_na=False)
    timing = pd.read_csv(out / "results" / "03_norm_timings.csv")
    assert len(ranks) == timing.groupby(norms.VERDICT_KEYS).ngroups
    rounds = pd.read_csv(out / "results" / "03_call_rounds.csv")
    assert len(rounds) == len(timing) and "range_pct" in rounds.columns
    if norms.one_candidate(timing):
        assert set(ranks.filter(like="_verdict").to_numpy().ravel()) == {norms.NO_RIVAL}
        assert not [t for t in texts if "no clear winner" in t or "tied_with_fastest" in t]
        assert "ranked" in texts[-1] or any("one candidate per row" in t for t in texts)
    else:  # the summary shows the win table of the saved rankings, no other
        wins = norms.win_table(ranks)
        shown = next(t for t in texts if "no clear winner" in t)
        assert shown == str(wins) or all(name in shown for name in wins.index), shown
