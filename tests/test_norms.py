"""Notebook 03's helpers: configs, bytes, the float64 reference, factories, rounds, answers."""

import nbformat
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import verdicts
from helpers.chapters import norms

EPS = 1e-5

class NormThenCast(nn.Module):
    def __init__(self, norm, out_dtype):
        super().__init__()
        self.norm, self.out_dtype = norm, out_dtype

    def forward(self, x):
        return self.norm(x).to(self.out_dtype)


def _plain(cls):
    return lambda h, cfg, dev: cls(h, eps=EPS, device=dev, dtype=cfg.w_dtype)


def _mixed(cls):
    return lambda h, cfg, dev: NormThenCast(cls(h, eps=EPS, device=dev), cfg.w_dtype)


PLAIN = {n: {f"torch {n}": _plain(getattr(nn, n))} for n in ("LayerNorm", "RMSNorm")}
MIXED = {n: {f"torch {n} + cast": _mixed(getattr(nn, n))} for n in ("LayerNorm", "RMSNorm")}


def test_configs_per_device():
    def labels(device, bf16=True):
        return [c.label for c in norms.configs_for(device, bf16=bf16)]

    assert labels("cpu") == ["fp32", "bf16"]  # no fp16 and no mixed configs on the CPU
    assert labels("cuda") == ["fp32", "bf16", "fp16", "fp32->bf16", "fp32->fp16"]
    assert labels("cuda", bf16=False) == ["fp32", "fp16", "fp32->fp16"]


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


def test_affine_params_are_random_load_affine_needs_them_and_check_uses_the_dtype_tolerance():
    weight, bias = norms.affine_params("LayerNorm", 64)
    assert not torch.allclose(weight, torch.ones(64)) and not torch.allclose(bias, torch.zeros(64))
    assert torch.equal(weight, norms.affine_params("LayerNorm", 64)[0])  # seeded
    with pytest.raises(ValueError, match="has 0 parameters, not 2"):
        norms.load_affine(nn.LayerNorm(8, elementwise_affine=False),
                          norms.affine_params("LayerNorm", 8))
    wrapped = norms.load_affine(NormThenCast(nn.LayerNorm(8), torch.bfloat16),
                                norms.affine_params("LayerNorm", 8))
    assert torch.equal(wrapped.norm.bias, norms.affine_params("LayerNorm", 8)[1])
    ref = torch.linspace(-2, 2, 101, dtype=torch.float64)
    assert norms.check(ref.float(), ref)["ok"]
    assert norms.check(ref.bfloat16(), ref)["ok"]  # rounding to bf16 is within tolerance
    off = norms.check((ref * 1.05).bfloat16(), ref)  # a 5% error is not
    assert not off["ok"] and off["max_rel_err"] == pytest.approx(0.05, rel=0.1)


def test_build_by_config_passes_correctness_catches_a_wrong_eps_and_rounds_time_each():
    configs = [norms.Config("fp32", "fp32"), norms.Config("bf16", "bf16"),
               norms.Config("fp32", "bf16")]
    mixed = {norm: {**cands, "none here": lambda h, cfg, dev: None}  # not built: no entry
             for norm, cands in MIXED.items()}
    entries, inputs, compile_error = norms.build(PLAIN, mixed, configs, 32, 64, "cpu", fix="x")
    assert compile_error == ""
    assert [(e.cfg.label, e.name) for e in entries] == [
        ("fp32", "torch LayerNorm"), ("fp32", "torch RMSNorm"),
        ("bf16", "torch LayerNorm"), ("bf16", "torch RMSNorm"),
        ("fp32->bf16", "torch LayerNorm + cast"), ("fp32->bf16", "torch RMSNorm + cast")]
    assert not any(e.compiled for e in entries) and all(e.first_call_s > 0 for e in entries)
    assert [t.dtype for t in inputs["fp32->bf16"]] == [torch.float32, torch.bfloat16]
    table = norms.correctness(entries, inputs, EPS)
    assert len(table) == 3 * (4 + 3)  # three dtypes; LayerNorm 4 tensors, RMSNorm 3
    assert table["ok"].all(), table[~table["ok"]]
    planted = next(e for e in entries if (e.cfg.label, e.norm) == ("fp32", "RMSNorm"))
    planted.module.eps = None  # finfo(fp32).eps, not the course's 1e-5
    x, dy = inputs["fp32"]
    small = x.detach().mul(0.001).requires_grad_(True)  # mean square near eps, where it matters
    assert not norms.correctness([planted], {"fp32": (small, dy)}, EPS)["ok"].all()
    rounds = norms.group_rounds(entries, inputs, ["bf16"], rounds=2, warmup=0, repeats=1)
    assert set(rounds) == {("LayerNorm", "bf16"), ("RMSNorm", "bf16")}
    assert all(len(t[k]) == 2 and min(t[k]) > 0 for r in rounds.values() for t in r.values()
               for k in ("gpu", "host", "call"))
    frame = norms.rounds_frame(rounds)
    assert len(frame) == 2 * 2 and list(frame["round"].unique()) == [0, 1]


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
    assert error == ("torch.compile failed (RuntimeError: InvalidCxxCompiler: No working C++ "
                     "compiler found); set compile_native - compiled candidates left out")


def test_timings_and_sweep_produce_the_saved_columns_and_bytes_fp32_or_mixed():
    cfg = norms.Config("fp32", "fp32")
    sweep = norms.hidden_sweep(PLAIN, cfg, 16, [32, 64], "cpu", 10.0, warmup=0, repeats=2)
    assert len(sweep) == 2 * 2 * 2  # hiddens x norms x passes
    entries, inputs, _ = norms.build(PLAIN, MIXED, [cfg], 16, 32, "cpu", fix="")
    table = norms.timings(entries, inputs, 10.0, warmup=0, repeats=2)
    assert (table["call_ms"] == table["median_ms"]).all() and (table["host_ms"] > 0).all()
    for t in (table, sweep):  # GB/s is the bytes counted over the median time, 1e9 B/s
        expected = t["bytes"] / (t["median_ms"] * 1e-3) / 1e9
        assert (t["gbps"] - expected).abs().max() <= 1e-9 * expected.max()
        assert ((t["pct_of_copy_ceiling"] - 100 * t["gbps"] / 10.0).abs() < 1e-6).all()
    # fp32 16 x 32: x, y (+ x, dy, dx backward); the affine vectors (+ their gradients)
    expected = {("LayerNorm", "forward"): 16 * 32 * 8 + 2 * 32 * 4,
                ("RMSNorm", "forward"): 16 * 32 * 8 + 32 * 4,
                ("LayerNorm", "forward+backward"): 16 * 32 * 20 + 3 * 2 * 32 * 4,
                ("RMSNorm", "forward+backward"): 16 * 32 * 20 + 3 * 32 * 4}
    assert all(r["bytes"] == expected[(r.norm, r["pass"])] for _, r in table.iterrows())
    n, h = 1024, 4096  # mixed: x and dx in fp32, y and dy in bf16
    assert norms.norm_bytes(n, h, 4, 2, h * 2, "forward+backward") == (
        n * h * (4 + 2) + n * h * (2 * 4 + 2) + 3 * h * 2)


def test_rounding_table_and_sweep_ratios_compare_apex_with_torch():
    apex_ln = "apex FusedLayerNorm"
    table = pd.DataFrame([
        {"norm": "LayerNorm", "dtype": d, "candidate": c, "tensor": t, "max_rel_err": e}
        for d, c, t, e in (("bf16", "torch LayerNorm", "y", 2e-3), ("bf16", apex_ln, "y", 6e-3),
                           ("bf16", apex_ln, "dx", 0.9), ("fp32", apex_ln, "y", 1e-7))])
    rows = norms.rounding_table(table).to_dict("records")
    assert rows == [{"norm": "LayerNorm", "dtype": "bf16", "apex_y_err": 6e-3,
                     "torch_y_err": 2e-3, "apex_over_torch": pytest.approx(3.0)}]
    assert norms.rounding_table(table[table["candidate"].str.startswith("torch")]).empty
    sweep = pd.DataFrame([{"hidden": 768, "norm": "LayerNorm", "pass": "forward+backward",
                           "candidate": c, "median_ms": ms}
                          for c, ms in (("torch LayerNorm", 2.0), ("apex FusedLayerNorm", 3.0))])
    assert norms.sweep_ratios(sweep).loc[768, "LayerNorm"] == pytest.approx(1.5)
    assert norms.sweep_ratios(sweep[sweep["candidate"].str.startswith("torch")]).empty


def _rounds(gpu, host):  # back to back, a call takes the larger of the two
    return {"gpu": gpu, "host": host, "call": [max(g, h) for g, h in zip(gpu, host, strict=True)]}


APEX, TORCH = "apex MixedFusedLayerNorm", "torch LayerNorm + cast"


def _answered(apex_gpu, apex_host, torch_gpu=(1.0,) * 5, torch_host=(0.5,) * 5):
    answers = verdicts.Answers("03")
    r = {APEX: _rounds(list(apex_gpu), list(apex_host)),
         TORCH: _rounds(list(torch_gpu), list(torch_host))}
    norms.answer_pair(answers, "on the GPU?", r, APEX, TORCH, call_question="per call?")
    return answers.table().set_index("measure")


def test_an_eager_call_is_read_from_gpu_and_host_time_and_a_pair_not_built_says_why():
    split = _answered([0.6, 0.62, 0.61, 0.6, 0.6], [0.9, 0.95, 0.9, 0.92, 0.9])  # slower host
    assert split.loc["GPU time", "verdict"] == "faster"
    assert split.loc["time per eager call", "verdict"] == verdicts.HOST
    assert split.loc["time per eager call", "question"] == "per call?"
    assert split.loc["time per eager call", "candidate_value"] == pytest.approx(0.9)  # max
    both = _answered([0.6] * 5, [0.3, 0.31, 0.3, 0.32, 0.3])
    assert both.loc["time per eager call", "verdict"] == "faster"
    noisy = _answered([0.9, 1.1, 0.95, 1.05, 1.0], [0.5] * 5)  # rounds on both sides of 1
    assert noisy.loc["GPU time", "verdict"] == verdicts.UNSURE
    for table in (split, both, noisy):
        assert verdicts.check_answers(table.reset_index()) == []
    answers = verdicts.Answers("03")
    norms.answer_pair(answers, "q?", {TORCH: _rounds([1.0], [1.0])}, APEX, TORCH,
                      call_question="per call?", why="no Apex here")
    table = answers.table()
    assert list(table["measure"]) == ["GPU time", "time per eager call"]
    assert set(table["verdict"]) == {verdicts.MISSING} and set(table["basis"]) == {"no Apex here"}


@pytest.mark.notebook
@pytest.mark.smoke("03")
def test_the_smoke_run_saves_every_question_even_where_it_measures_none(smoke_run):
    out, runs = smoke_run
    executed = nbformat.read(runs["03_fused_layernorm_rmsnorm.ipynb"].output, as_version=4)
    texts = [o.get("text") or o.get("data", {}).get("text/plain", "")
             for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [t for t in texts if "Empty DataFrame" in t]
    assert not [t for t in texts if " 0 MiB" in t or "- MiB" in t]
    answers = pd.read_csv(out / "results" / "03_answers.csv")
    assert verdicts.check_answers(answers) == []
    assert len(answers) == 11 and answers["question"].str.endswith("?").all()
    assert set(answers["feature"].dropna()) == {
        "FusedLayerNorm/FusedRMSNorm", "MixedFused norms", "Apex norms under torch.compile"}
    if not torch.cuda.is_available():  # no Apex on the CPU: every row says why
        assert (answers["verdict"] == verdicts.MISSING).all() and answers["basis"].str.len().all()
    rounds = pd.read_csv(out / "results" / "03_rounds.csv")
    assert (rounds[["gpu_ms", "host_ms", "call_ms"]] > 0).all().all()
