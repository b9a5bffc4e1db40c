"""Notebook 03's helpers: configs, bytes counted, the float64 reference, tolerances, verdicts."""

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from helpers import norm_bench, norm_report


def test_configs_per_device():
    cpu = [c.label for c in norm_bench.configs_for("cpu", bf16=True, mixed=True)]
    assert cpu == ["fp32", "bf16"]  # no fp16 and no Apex mixed configs on the CPU
    cuda = [c.label for c in norm_bench.configs_for("cuda", bf16=True, mixed=True)]
    assert cuda == ["fp32", "bf16", "fp16", "fp32->bf16", "fp32->fp16"]
    assert [c.label for c in norm_bench.configs_for("cuda", bf16=False, mixed=False)] == [
        "fp32", "fp16"]


def test_candidates_apply_to_the_right_configs():
    plain, mixed = norm_bench.Config("bf16", "bf16"), norm_bench.Config("fp32", "bf16")
    kinds = {c.kind: c for c in norm_bench.candidates(compiled=True, apex=True)
             if c.norm == "LayerNorm"}
    assert {k for k, c in kinds.items() if c.applies(plain)} == {"native", "compiled", "apex"}
    assert {k for k, c in kinds.items() if c.applies(mixed)} == {"native", "apex-mixed"}
    assert kinds["apex-mixed"].name == "apex MixedFusedLayerNorm"


def test_bytes_counted():
    plain = norm_bench.Config("bf16", "bf16")
    n, h = 1024, 4096
    # forward: read x + write y (2 B each) + weight and bias (2 B each)
    assert norm_bench.norm_bytes("LayerNorm", n, h, plain, "forward") == 2 * n * h * 2 + 2 * h * 2
    # forward+backward: 5 passes over N*H plus 3 passes over the affine vectors
    assert norm_bench.norm_bytes("RMSNorm", n, h, plain, "forward+backward") == (
        5 * n * h * 2 + 3 * h * 2)
    mixed = norm_bench.Config("fp32", "bf16")  # x, dx in fp32; y, dy in bf16
    assert norm_bench.norm_bytes("RMSNorm", n, h, mixed, "forward+backward") == (
        n * h * (4 + 2) + n * h * (2 * 4 + 2) + 3 * h * 2)


@pytest.mark.parametrize("norm", norm_bench.NORMS)
def test_reference_matches_torch_in_float64(norm):
    x = torch.randn(8, 32, dtype=torch.float64, requires_grad=True)
    params = norm_bench.affine_params(norm, 32)
    dy = torch.randn(8, 32, dtype=torch.float64)
    ref = norm_bench.reference(norm, x, params, dy)
    p64 = [p.double().requires_grad_(True) for p in params]
    if norm == "LayerNorm":
        y = F.layer_norm(x, (32,), p64[0], p64[1], norm_bench.EPS)
    else:
        y = F.rms_norm(x, (32,), p64[0], norm_bench.EPS)
    expected = [y.detach(), *torch.autograd.grad(y, [x, *p64], dy)]
    assert len(ref) == len(expected) == (4 if norm == "LayerNorm" else 3)
    for got, want in zip(ref, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_affine_params_are_random_not_ones_and_zeros():
    weight, bias = norm_bench.affine_params("LayerNorm", 64)
    assert not torch.allclose(weight, torch.ones(64)) and not torch.allclose(bias, torch.zeros(64))
    assert torch.equal(weight, norm_bench.affine_params("LayerNorm", 64)[0])  # seeded


def test_check_uses_the_dtype_tolerance():
    ref = torch.linspace(-2, 2, 101, dtype=torch.float64)
    assert norm_bench.check(ref.float(), ref)["ok"]
    assert norm_bench.check(ref.bfloat16(), ref)["ok"]  # rounding to bf16 is within tolerance
    off = norm_bench.check((ref * 1.05).bfloat16(), ref)  # a 5% error is not
    assert not off["ok"] and off["max_rel_err"] == pytest.approx(0.05, rel=0.1)


def test_native_candidates_pass_correctness_on_cpu():
    cands = norm_bench.candidates(compiled=False, apex=False)
    configs = norm_bench.configs_for("cpu", bf16=True, mixed=False)
    entries, inputs, compile_error = norm_bench.build_suite(cands, configs, 32, 64, "cpu")
    assert compile_error == ""
    table = norm_bench.correctness(entries, inputs)
    assert len(table) == 2 * (4 + 3)  # two dtypes; LayerNorm 4 tensors, RMSNorm 3
    assert table["ok"].all(), table[~table["ok"]]


def test_correctness_catches_a_wrong_eps():
    cfg = norm_bench.Config("fp32", "fp32")
    module = torch.nn.RMSNorm(64, eps=None)  # finfo(fp32).eps, not the course's 1e-5
    norm_bench.load_affine(module, norm_bench.affine_params("RMSNorm", 64))
    entry = norm_bench.Entry(norm_bench.Candidate("RMSNorm", "native"), cfg, module)
    x, dy = norm_bench.make_inputs(16, 64, cfg, "cpu")
    small = x.detach().mul(0.001).requires_grad_(True)  # mean square near eps, where it matters
    table = norm_bench.correctness([entry], {"fp32": (small, dy)})
    assert not table["ok"].all()


def _rows(apex_ms, torch_ms):
    return pd.DataFrame([
        {"norm": "LayerNorm", "dtype": "bf16", "pass": "forward", "candidate": name,
         "median_ms": ms, "q1_ms": ms * 0.99, "q3_ms": ms * 1.01}
        for name, ms in (("torch LayerNorm", torch_ms), ("apex FusedLayerNorm", apex_ms))])


def test_verdicts_flip_when_the_numbers_flip():
    assert "apex FusedLayerNorm (1 ms) is 2.00x faster" in norm_report.verdicts(_rows(1, 2))
    assert "apex FusedLayerNorm (2 ms) is 2.00x slower" in norm_report.verdicts(_rows(2, 1))
    assert "fastest torch LayerNorm" in norm_report.verdicts(_rows(2, 1))


def test_sweep_reading_names_crossovers_and_ties():
    rows = []
    for hidden, apex_ms, torch_ms in ((768, 2.0, 1.0), (1024, 1.0, 1.01), (4096, 1.0, 2.0)):
        for name, ms in (("torch LayerNorm", torch_ms), ("apex FusedLayerNorm", apex_ms)):
            rows.append({"norm": "LayerNorm", "pass": "forward", "hidden": hidden,
                         "candidate": name, "median_ms": ms, "q1_ms": ms, "q3_ms": ms})
    text = norm_report.sweep_reading(pd.DataFrame(rows))
    assert text == ("LayerNorm forward: fastest torch LayerNorm at 768, tie at 1024, "
                    "apex FusedLayerNorm at 4096")


def test_hidden_sweep_and_timings_produce_the_saved_columns():
    cands = norm_bench.candidates(compiled=False, apex=False)
    cfg = norm_bench.Config("fp32", "fp32")
    sweep = norm_bench.hidden_sweep(cands, cfg, 16, [32, 64], "cpu", 10.0, warmup=0, repeats=2)
    assert len(sweep) == 2 * 2 * 2  # hiddens x norms x passes
    entries, inputs, _ = norm_bench.build_suite(cands, [cfg], 16, 32, "cpu")
    table = norm_bench.timings(entries, inputs, 10.0, warmup=0, repeats=2)
    for column in ("norm", "candidate", "dtype", "pass", "median_ms", "q1_ms", "q3_ms", "gbps",
                   "pct_of_copy_ceiling"):
        assert column in table.columns
    assert set(table["pass"]) == {"forward", "forward+backward"}
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


def test_a_failing_compile_drops_the_compiled_candidates_with_one_line(monkeypatch):
    def broken_compile(*args, **kwargs):
        try:
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore lines")
        except RuntimeError as inner:
            raise ValueError("backend='inductor' raised:\n(long traceback)") from inner

    monkeypatch.setattr(torch, "compile", broken_compile)
    cands = norm_bench.candidates(compiled=True, apex=False)
    cfgs = [norm_bench.Config("fp32", "fp32"), norm_bench.Config("bf16", "bf16")]
    entries, _, error = norm_bench.build_suite(cands, cfgs, 8, 32, "cpu")
    assert {e.candidate.kind for e in entries} == {"native"} and len(entries) == 4
    assert "\n" not in error and "No working C++ compiler" in error
    assert "compile_native = False" in error


def test_verdicts_and_summary_name_ties_and_mixed_dtypes():
    text = norm_report.verdicts(_rows(1.0, 1.01))  # within fusion.TIE_FRACTION
    assert "fastest apex FusedLayerNorm (indistinguishable from torch LayerNorm)" in text
    rows = []
    for dtype, cands in (("bf16", (("torch.compile LayerNorm", 1.0), ("torch LayerNorm", 2.0))),
                         ("fp32->bf16", (("apex MixedFusedLayerNorm", 1.0),
                                         ("torch LayerNorm", 2.0)))):
        for name, ms in cands:
            rows.append({"norm": "LayerNorm", "dtype": dtype, "pass": "forward+backward",
                         "candidate": name, "median_ms": ms, "q1_ms": ms * 0.99,
                         "q3_ms": ms * 1.01, "gbps": 100 / ms, "pct_of_copy_ceiling": 10 / ms})
    summary = norm_report.fastest_summary(pd.DataFrame(rows)).splitlines()
    assert summary[0] == ("LayerNorm bf16 forward+backward: fastest torch.compile LayerNorm: "
                          "1 ms, 100 GB/s (10% of the copy ceiling)")
    assert summary[1].startswith("LayerNorm fp32->bf16 forward+backward: fastest apex "
                                 "MixedFusedLayerNorm (vs eager torch only")


def test_rounding_reading_compares_apex_with_torch_per_dtype():
    import pandas as pd

    from helpers import norm_report
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
    assert norm_report.rounding_reading(table) == \
        "LayerNorm bf16: output error Apex 6.0e-03, torch 2.0e-03 (3.0x)"
    torch_only = table[table["candidate"].str.startswith("torch")]
    assert "no rounding comparison" in norm_report.rounding_reading(torch_only)
