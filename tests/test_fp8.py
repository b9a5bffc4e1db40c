"""Notebook 06's module: the formats, the scale and the rounding error against float64, torchao
(present, missing, broken) and the FP8 hardware check, the sweep's timing, table and crossover,
the end-to-end table and the verdict; and the notebook itself, run with FP8 emulated (sections
3-4 on the CPU, the bf16 baseline's noise floor and the saved losses included) and with torchao
missing. The loss readings against the noise floor are in test_fp8_noise.py."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import math
import re
import sys
import types
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import torch
from torch import nn

from helpers import bench, errors, gpt, machine, verdicts
from helpers.chapters import fp8

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "06_fp8_on_hopper.ipynb"
CPU = torch.device("cpu")
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


# ------------------------------------------------------------------ formats
def test_formats_are_read_from_finfo():
    table = fp8.formats_table([torch.bfloat16, E4M3, E5M2]).set_index("dtype")
    e4m3, e5m2, bf16 = table.loc["float8_e4m3fn"], table.loc["float8_e5m2"], table.loc["bfloat16"]
    assert (e4m3["exponent_bits"], e4m3["mantissa_bits"], e4m3["max"]) == (4, 3, 448.0)
    assert (e5m2["exponent_bits"], e5m2["mantissa_bits"], e5m2["max"]) == (5, 2, 57344.0)
    assert e4m3["smallest_subnormal"] == 2.0**-9 and e5m2["smallest_subnormal"] == 2.0**-16
    assert e4m3["unit_roundoff"] == 2.0**-4 and bf16["unit_roundoff"] == 2.0**-8
    assert not e4m3["has_inf"] and e5m2["has_inf"]  # "fn": finite, NaN only
    assert e5m2["decades"] > e4m3["decades"] + 4  # e5m2 trades a mantissa bit for range


# ------------------------------------------------------------------ scale and rounding
def _with_outlier_row(factor: float) -> torch.Tensor:
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    x[7] *= factor
    return x


def test_scale_is_amax_over_the_formats_max():
    x = _with_outlier_row(50.0)
    assert fp8.scale(x, E4M3).item() == pytest.approx(x.abs().max().item() / 448.0, rel=1e-12)
    rows = fp8.scale(x, E5M2, rowwise=True)
    assert rows.shape == (64, 1)
    torch.testing.assert_close(rows, x.abs().amax(dim=1, keepdim=True).double() / 57344.0)
    pow2 = fp8.scale(x, E4M3, rowwise=True, pow2=True)
    assert torch.equal(torch.exp2(torch.log2(pow2).round()), pow2)  # powers of two
    assert (pow2 >= fp8.scale(x, E4M3, rowwise=True)).all()  # rounded up: nothing saturates
    assert (pow2 < 2 * fp8.scale(x, E4M3, rowwise=True)).all()


def test_scale_matches_torchao():
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_utils import tensor_to_scale

    x = _with_outlier_row(50.0)
    torch.testing.assert_close(tensor_to_scale(x, E4M3).double(), 1 / fp8.scale(x, E4M3),
                               rtol=1e-6, atol=0)
    rowwise = tensor_to_scale(x, E4M3, scaling_granularity=ScalingGranularity.AXISWISE,
                              axiswise_dim=-1, round_scales_to_power_of_2=True)
    assert torch.equal(rowwise.double(), 1 / fp8.scale(x, E4M3, rowwise=True, pow2=True))


def test_roundtrip_saturates_and_flushes():
    x = torch.tensor([1000.0, 1e-5, 1.0])
    assert fp8.roundtrip(x, E4M3).tolist() == [448.0, 0.0, 1.0]
    small = torch.full((8, 8), 1e-5) * torch.linspace(1, 2, 8)
    assert fp8.rounding_errors(small, fp8.cast(small, E4M3, "none"))["flushed_pct"] == 100.0
    scaled = fp8.rounding_errors(small, fp8.cast(small, E4M3, "tensorwise"))
    assert scaled["flushed_pct"] == 0.0 and scaled["rel_err"] <= 2.0**-4


def test_rounding_error_stays_within_unit_roundoff_in_the_normal_range():
    x = torch.rand(32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 1.0
    for dtype in (torch.bfloat16, E4M3, E5M2):
        err = (fp8.roundtrip(x, dtype) - x).abs() / x
        assert err.max().item() <= torch.finfo(dtype).eps / 2 + 1e-15


def test_rowwise_beats_tensorwise_on_an_outlier_row():
    x = _with_outlier_row(1e5)
    tensorwise = fp8.rounding_errors(x, fp8.cast(x, E4M3, "tensorwise"))
    rowwise = fp8.rounding_errors(x, fp8.cast(x, E4M3, "rowwise"))
    assert rowwise["median_row_rel_err"] < tensorwise["median_row_rel_err"] / 2
    assert rowwise["flushed_pct"] < tensorwise["flushed_pct"]
    plain = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))  # no outlier: even
    a = fp8.rounding_errors(plain, fp8.cast(plain, E4M3, "tensorwise"))["median_row_rel_err"]
    b = fp8.rounding_errors(plain, fp8.cast(plain, E4M3, "rowwise"))["median_row_rel_err"]
    assert a == pytest.approx(b, rel=0.1)
    with pytest.raises(ValueError):
        fp8.cast(x, E4M3, "blockwise")


def test_outlier_sweep_finds_where_tensorwise_breaks():
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    grown = fp8.outlier_sweep(x, [1.0, 1e2, 1e4, 1e6], [(E4M3, "tensorwise"), (E4M3, "rowwise")],
                              row=3)
    assert len(grown) == 8 and set(grown["cast"]) == {"float8_e4m3fn tensorwise",
                                                      "float8_e4m3fn rowwise"}
    broken = fp8.breaking_factor(grown, "float8_e4m3fn tensorwise", 2.0**-4)
    assert broken is not None and broken > 1.0
    assert fp8.breaking_factor(grown, "float8_e4m3fn rowwise", 2.0**-4) is None
    assert torch.equal(x, torch.randn(64, 128, generator=torch.Generator().manual_seed(0)))


def test_spread_finds_the_largest_row():
    info = fp8.spread(_with_outlier_row(100.0))
    assert info["largest_row"] == 7 and info["row_amax_ratio"] > 30


def test_capture_keeps_the_linears_input_and_output_gradient():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    x = torch.randn(5, 8)
    seen = fp8.capture(model[2], lambda: model(x).pow(2).sum())
    hidden = model[1](model[0](x)).detach()
    torch.testing.assert_close(seen["activation"], hidden)
    torch.testing.assert_close(seen["gradient"], 2 * model[2](hidden).detach())  # d(y^2)/dy
    assert not model[2]._forward_hooks and not model[2]._forward_pre_hooks  # hooks removed


# ------------------------------------------------------------------ torchao and the hardware
def test_torchao_is_usable_here():
    assert fp8.torchao_problem() == ""
    assert fp8.torchao_version() == fp8.TORCHAO_PIN


def test_missing_torchao_is_one_sentence_with_the_install_command(monkeypatch):
    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", absent)
    said = fp8.torchao_problem()
    assert said.startswith("torchao is not installed") and "pip install torchao==0.18.0" in said
    assert machine.missing(lacking=fp8.torchao_lack()) == (
        "torchao 0.18.0 (pip install torchao==0.18.0)")


def test_torchao_that_fails_to_import_is_one_sentence(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import raises ImportError
    said = fp8.torchao_problem()
    assert said.startswith("torchao 0.18.0 does not work with torch")
    assert "import of torchao.float8 halted" in said and said.endswith("restart the kernel.")
    assert "\n" not in said


def test_torchao_without_the_api_is_one_sentence(monkeypatch):
    fake = types.ModuleType("torchao.float8")
    fake.convert_to_float8_training = lambda *a, **k: None

    class Float8LinearConfig:  # no from_recipe_name, not a dataclass
        pass

    fake.Float8LinearConfig = Float8LinearConfig
    monkeypatch.setitem(sys.modules, "torchao.float8", fake)
    said = fp8.torchao_problem()
    assert ("lacks Float8LinearConfig.from_recipe_name and Float8LinearConfig(emulate=...)"
            in said and said.endswith("pip install torchao==0.18.0, then restart the kernel."))
    fake.Float8LinearConfig = dataclasses.make_dataclass("Float8LinearConfig", [("emulate", bool)])
    said = fp8.torchao_problem()
    assert "lacks Float8LinearConfig.from_recipe_name," in said


@pytest.mark.parametrize(("cuda", "cap", "expected"), [
    (False, None, "a CUDA GPU with FP8 tensor cores"),
    (True, (8, 0), "this one is 8.0"),
    (True, (8, 6), "this one is 8.6"),
    (True, (8, 9), ""),
    (True, (9, 0), ""),
    (True, (12, 0), ""),
])
def test_fp8_needs_compute_capability_8_9(monkeypatch, capsys, cuda, cap, expected):
    monkeypatch.setattr(machine, "cuda_available", lambda: cuda)
    monkeypatch.setattr(machine, "capability", lambda: cap)
    said = machine.fp8_missing()
    assert (expected in said) if expected else said == ""
    ok = machine.needs(fp8=True)
    lines = capsys.readouterr().out.splitlines()
    if expected:
        assert not ok and len(lines) == 1
        assert lines[0].startswith("Skipped: this cell needs ") and "8.9 or newer" in lines[0]
    else:
        assert ok and lines == []


def test_quiet_torchao_drops_only_its_noise():
    fp8.quiet_torchao()
    fp8.quiet_torchao()  # idempotent: one filter per logger
    logger = logging.getLogger("torchao")
    assert sum(isinstance(f, fp8._Drop) for f in logger.filters) == 1

    def passes(name, message):
        record = logging.LogRecord(name, logging.WARNING, __file__, 1, message, None, None)
        return logging.getLogger(name).filter(record)

    assert not passes("torchao", "Failed to load /x/torchao/_C_mxfp8.abi3.so: no library")
    assert passes("torchao", "Skipping import of cpp extensions due to incompatible torch")
    assert not passes("torch.utils._pytree", "<enum 'KernelPreference'> is an Enum subclass and "
                                             "is now natively supported")
    assert passes("torch.utils._pytree", "something else")


@pytest.mark.notebook
@pytest.mark.smoke("06")
def test_importing_torchao_through_the_helper_prints_nothing(smoke_run):
    """The smoke run's 06 imports torchao in a fresh kernel through fp8.torchao_problem: its cell
    prints the one line it means to, and nothing on stderr (no warning of torchao's own)."""
    out, runs = smoke_run
    executed = nbformat.read(runs[NOTEBOOK.name].output, as_version=4)
    cell = next(c for c in executed.cells if c.cell_type == "code"
                and c.source.startswith("torchao_problem = fp8.torchao_problem()"))
    streams = [(o.name, o.text) for o in cell.outputs if o.output_type == "stream"]
    assert [name for name, _ in streams] == ["stdout"], streams
    assert streams[0][1].startswith(f"torchao {fp8.torchao_version()}: the float8 training API "
                                    "imports\n"), streams
    assert not [o for o in cell.outputs if o.output_type not in ("stream",)]


# ------------------------------------------------------------------ the sweep
def test_time_case_runs_an_emulated_float8_linear():
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name("rowwise")
    linear = convert_to_float8_training(nn.Linear(32, 48, bias=False),
                                        config=dataclasses.replace(config, emulate=True))
    assert type(linear).__name__ == "Float8Linear"
    timed = fp8.time_case(linear, 32, 48, 64, device=CPU, dtype=torch.float32, warmup=1,
                          repeats=3, count=True)
    assert timed["median_ms"] > 0 and timed["q1_ms"] <= timed["median_ms"] <= timed["q3_ms"]
    assert timed["kernels"] > 0 and timed["counted"] == "aten ops (CPU)"
    assert linear.weight.grad is not None and linear.weight.grad.shape == (48, 32)


def _row(width, recipe, ms, kind="square", spread=0.01, k=None, n=None):
    k, n = k or width, n or width
    return {"shape": f"{k}x{n}", "kind": kind, "tokens": 1024, "in_features": k,
            "out_features": n, "recipe": recipe, "mode": "compiled", "median_ms": ms,
            "q1_ms": ms * (1 - spread),
            "q3_ms": ms * (1 + spread), "iqr_ms": 2 * spread * ms, "compile_s": 1.0}


def _sweep(fp8_ms: dict[int, float], recipe="tensorwise") -> pd.DataFrame:
    rows = []
    for width, ms in fp8_ms.items():
        rows += [_row(width, "bf16", 1.0), _row(width, recipe, ms)]
    return fp8.sweep_table(rows)


def test_sweep_table_counts_six_mkn_and_the_ratio_to_bf16():
    table = fp8.sweep_table([_row(1024, "bf16", 2.0), _row(1024, "tensorwise", 1.0),
                             _row(0, "bf16", 1.0, kind="MLP up", k=768, n=3072)])
    fp8_row = table[table["recipe"] == "tensorwise"].iloc[0]
    assert fp8_row["flops"] == 6 * 1024 * 1024 * 1024
    assert fp8_row["tflops"] == pytest.approx(6 * 1024**3 / 1e-3 / 1e12)
    assert fp8_row["ratio_vs_bf16"] == pytest.approx(2.0)
    assert table[table["recipe"] == "bf16"]["ratio_vs_bf16"].tolist() == [1.0, 1.0]
    assert fp8.sweep_table([]).empty


def test_crossover_is_the_smallest_width_from_which_float8_stays_faster():
    assert fp8.crossover(_sweep({768: 1.3, 2048: 1.1, 4096: 0.8, 8192: 0.6}), "tensorwise") == 4096
    assert fp8.crossover(_sweep({768: 0.9, 2048: 0.8}), "tensorwise") == 768
    assert fp8.crossover(_sweep({768: 1.2, 2048: 1.1}), "tensorwise") is None
    # faster at 2048 but not at 4096: only 8192 on counts
    assert fp8.crossover(_sweep({1024: 1.2, 2048: 0.8, 4096: 1.01, 8192: 0.7}),
                         "tensorwise") == 8192
    # within 3% of bf16 is a tie, not faster
    assert fp8.crossover(_sweep({4096: 0.98, 8192: 0.98}), "tensorwise") is None
    # the MLP shapes do not enter the square crossover
    table = fp8.sweep_table(_sweep({768: 1.2, 2048: 0.8}).to_dict("records")
                            + [_row(0, "bf16", 1.0, kind="MLP up", k=768, n=3072),
                               _row(0, "tensorwise", 0.5, kind="MLP up", k=768, n=3072)])
    assert fp8.crossover(table, "tensorwise") == 2048


def test_the_crossover_and_the_faster_widths_follow_the_numbers():
    sweep = _sweep({768: 1.3, 2048: 0.8, 4096: 0.7})
    assert fp8.crossover(sweep, "tensorwise") == 2048
    assert fp8.faster_widths(sweep, "tensorwise") == {768: False, 2048: True, 4096: True}
    assert fp8.crossover(_sweep({768: 0.5, 2048: 0.4}), "tensorwise") == 768
    never = _sweep({768: 1.5, 2048: 0.8, 4096: 1.2})
    assert fp8.crossover(never, "tensorwise") is None
    assert fp8.faster_widths(never, "tensorwise") == {768: False, 2048: True, 4096: False}


def test_a_width_the_recipe_skipped_is_left_out_not_read_as_slower():
    # rowwise timed at every other width: 1536 has bf16 alone, so it is no reading at all
    sweep = _sweep({768: 1.3, 2048: 0.8, 4096: 0.7})
    sweep = pd.concat([sweep, _sweep({1536: 1.0})[lambda d: d["recipe"] == "bf16"]])
    assert fp8.faster_widths(sweep, "tensorwise") == {768: False, 2048: True, 4096: True}
    assert fp8.crossover(sweep, "tensorwise") == 2048


# ------------------------------------------------------------------ end to end and verdict
def _run(label, ms, val_loss, mem=2.0, spread=0.01, steps=20):
    losses = [5.5 - 3.0 * i / steps for i in range(steps)]
    step_ms = [100.0] + [ms * (1 + spread * ((i % 3) - 1)) for i in range(steps - 1)]
    return bench.Run(label, "cuda", losses=losses, step_ms=step_ms, warmup=1, peak_mem_gib=mem,
                     extra={"tokens_per_step": 32768, "val_loss": val_loss, "checksum": 7,
                            "compile_s": 20.0})


LABELS = {"bf16": "path 4 (bf16)", "tensorwise": "path 4 + float8 tensorwise",
          "rowwise": "path 4 + float8 rowwise"}


def _e2e(tw_ms, tw_loss, rw_ms=50.0, rw_loss=2.80):
    runs = {"bf16": _run(LABELS["bf16"], 50.0, 2.80), "tensorwise": _run("tw", tw_ms, tw_loss),
            "rowwise": _run("rw", rw_ms, rw_loss)}
    noise = verdicts.NoiseFloor((2.80, 2.80), 2.80 * 1.001, other_seeds=(2.80 * 0.999,))
    return fp8.end_to_end_table(runs, LABELS, flops_per_token=gpt.flops_per_token(gpt.GPT2_SMALL),
                                peak_tflops=989.0, noise=noise)


def test_end_to_end_table_has_the_speedup_and_loss_difference():
    table = _e2e(40.0, 2.828).set_index("recipe")
    assert table.loc["tensorwise", "speedup_vs_bf16"] == pytest.approx(1.25)
    assert table.loc["tensorwise", "val_loss_diff_pct"] == pytest.approx(1.0)
    assert table.loc["bf16", "speedup_vs_bf16"] == 1.0
    for column in ("status", "step_ms", "step_ms_iqr", "tokens_per_s", "mfu", "peak_mem_gib",
                   "final_val_loss", "speedup_vs_bf16", "val_loss_diff_pct"):
        assert column in table.columns
    missing = fp8.end_to_end_table({"bf16": _run("b", 50.0, 2.8)}, LABELS,
                                   flops_per_token=1.0, peak_tflops=1.0).set_index("recipe")
    assert missing.loc["rowwise", "status"] == "not run on this machine"


def test_verdict_says_faster_only_when_faster_and_the_losses_agree():
    rows = {r["recipe"]: r for r in fp8.verdict_rows("GPT 12 x 768", _e2e(40.0, 2.81))}
    assert rows["tensorwise"]["step_label"] == "faster 1.25x" and rows["tensorwise"]["speeds_up"]
    assert rows["rowwise"]["step_label"] == "tie"  # 50 ms each
    assert not rows["rowwise"]["speeds_up"]
    [slower] = [r for r in fp8.verdict_rows("m", _e2e(60.0, 2.81)) if r["recipe"] == "tensorwise"]
    assert slower["step_label"] == "slower 0.83x" and not slower["speeds_up"]
    [diverged] = [r for r in fp8.verdict_rows("m", _e2e(40.0, 2.95))
                  if r["recipe"] == "tensorwise"]
    assert diverged["target"] == "beyond" and not diverged["speeds_up"]
    no_bf16 = fp8.verdict_rows("m", _e2e(40.0, 2.8).iloc[1:])
    assert all(r["step_label"].startswith("not compared") for r in no_bf16)


# ------------------------------------------------------------------ the notebook
def _notebook_with(tmp_path: Path) -> Path:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    path = tmp_path / NOTEBOOK.name
    nbformat.write(nb, path)
    return path


def _outputs(path: Path) -> tuple[list, list, str]:
    executed = nbformat.read(path, as_version=4)
    outputs = [o for c in executed.cells for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.output_type == "error"]
    stderr = [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"]
    text = "".join(o.text for o in outputs if o.output_type == "stream")
    return errors, stderr, text


@pytest.mark.notebook
@pytest.mark.smoke("06")
def test_the_notebook_runs_sections_3_and_4_with_fp8_emulated(smoke_run):
    """The shared smoke run (smoke_run, tests/conftest.py) executes 06 with emulate_fp8=True."""
    out, runs = smoke_run
    run = runs[NOTEBOOK.name]
    assert run.parameters == {"emulate_fp8": True}, "the shared run sets emulate_fp8 in 06"
    assert run.ok, run.error
    errors, stderr, text = _outputs(run.output)
    assert not errors and not stderr, stderr
    results = out / "results"
    saved = {p.name for p in results.glob("06_*.csv")}
    assert {"06_rounding.csv", "06_correctness.csv", "06_width_sweep.csv",
            "06_end_to_end.csv"} <= saved
    e2e = pd.read_csv(results / "06_end_to_end.csv")
    assert list(e2e["status"]) == ["ran", "ran", "ran"]
    assert e2e["batch_checksum"].nunique() == 1
    assert (e2e["val_loss_diff_pct"].abs() < 2).all()
    verdict = pd.read_csv(results / "06_verdict.csv")
    assert list(zip(verdict["model"], verdict["recipe"], strict=True)) == [
        ("GPT 2 x 64", "tensorwise"), ("GPT 2 x 64", "rowwise"), ("GPT 1 x 128", "tensorwise")]
    assert verdict["step_label"].str.match(r"^(faster|slower) \d+\.\d\dx$|^tie$").all()
    assert {"06_start.csv", "06_wide_start.csv", "06_crossover.csv", "06_spreads.csv",
            "06_converted_linears.csv", "06_auto_filter.csv"} <= saved
    # path 4 (bf16) trained once more with the same seed and from two other seeds' weights,
    # kept out of the end-to-end table; every run's losses saved for re-plotting
    assert list(e2e["recipe"]) == ["bf16", "tensorwise", "rowwise"]
    saved = json.loads((results / "06_losses.json").read_text())
    runs = saved["runs"]
    assert set(runs) == {"bf16", "bf16 (repeat 1)", "bf16 (seed 1)", "bf16 (seed 2)",
                         "tensorwise", "rowwise"}
    assert all(len(r["losses"]) == 10 and r["checksum"] == runs["bf16"]["checksum"]
               for r in runs.values())
    assert [runs[k]["float8_recipe"] for k in ("bf16", "bf16 (repeat 1)", "rowwise")] == \
        [None, None, "rowwise"]
    assert [runs[k]["seed"] for k in ("bf16 (repeat 1)", "bf16 (seed 1)", "bf16 (seed 2)")] == \
        [0, 1, 2]
    noise = saved["noise"]
    assert noise["same_seed"] == [runs[k]["val_loss"] for k in ("bf16", "bf16 (repeat 1)")]
    assert [noise["other_seed"], *noise["other_seeds"]] == \
        [runs[k]["val_loss"] for k in ("bf16 (seed 1)", "bf16 (seed 2)")]
    assert 0.0 <= noise["floor"] < 1e-3  # a CPU repeats a run (all but) exactly
    assert saved["recipe"]["lr"] == gpt.SMOKE_PEAK_LR and saved["recipe"]["warmup"] == 8
    assert (e2e["noise_floor_pct"] == 100 * noise["floor"]).all()
    # float8 against bf16 reads against the other seeds, whatever the floor (one yardstick)
    assert (e2e["yardstick"] == verdicts.SEEDS).all()
    assert e2e["yardstick_pct"].tolist() == pytest.approx([100 * noise["seed_spread"]] * 3)
    for row in e2e.iloc[1:].itertuples():
        diff, scale = row.val_loss_diff_pct / 100, noise["seed_spread"]
        assert row.loss_verdict == verdicts.loss_verdict(diff, scale)
        assert row.target == verdicts.target_verdict(diff, scale)
    verdict = verdict.set_index(["model", "recipe"])
    assert (verdict["speeds_up"] == (verdict["faster"] & (verdict["target"] == "within"))).all()
    assert f"noise floor {noise['floor']:.3%}, other seeds' spread" in text  # noise_runs: 1
    readings = pd.read_csv(results / "06_noise.csv")  # path 4's same-seed runs: does it repeat?
    assert len(readings) == 2 and (readings["yardstick"] == verdicts.REPEAT).all()
    # the sweep: five widths, the crossover a measured one (or none)
    sweep = pd.read_csv(results / "06_width_sweep.csv")
    widths = sorted(sweep.loc[sweep["kind"] == "square", "in_features"].unique())
    assert len(widths) >= 5
    for recipe in ("tensorwise", "rowwise"):
        assert fp8.crossover(sweep, recipe) in (None, *widths)
    assert "(smoke profile: the tiny model's start is not judged)" in text and "CHECK:" not in text


@pytest.mark.notebook
def test_the_notebook_without_torchao_says_so_in_one_sentence(tmp_path, monkeypatch):
    from coursetools import runner

    fake = tmp_path / "fake" / "torchao"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('simulated: a torchao that is broken')\n")
    path = _notebook_with(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))  # found before the installed torchao
    run = runner.execute(path, tmp_path / "out", profile="smoke", timeout=300)
    assert run.ok, run.error
    errors, stderr, text = _outputs(run.output)
    assert not errors and not stderr
    assert ("does not work with torch" in text and "simulated: a torchao that is broken" in text
            and "pip install torchao==0.18.0, then restart the kernel." in text)
    assert "Skipped: this cell needs torchao 0.18.0 (pip install torchao==0.18.0)." in text
    assert (tmp_path / "out" / "results" / "06_rounding.csv").exists()
    assert not math.isnan(pd.read_csv(tmp_path / "out" / "results" / "06_rounding.csv")
                          ["rel_err"].iloc[0])


def test_torchao_source_escape_warnings_are_dropped_and_others_kept():
    """Python compiling torchao's files on first import warns about a docstring escape
    (SyntaxWarning from 3.12): dropped for torchao's files only."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        fp8.quiet_torchao()
        for category in (SyntaxWarning, DeprecationWarning):
            warnings.warn_explicit("invalid escape sequence '\\.'", category,
                                   "/site/torchao/quantization/quant_api.py", 1542)
            warnings.warn_explicit("invalid escape sequence '\\.'", category,
                                   "/site/mine/model.py", 7)
    assert [w.filename for w in seen] == ["/site/mine/model.py"] * 2


@pytest.mark.parametrize(("old", "new", "said"), [
    ("widths = None", "widths = (1000, 768)",
     "widths holds [1000]: FP8 matrix products need multiples of 16"),
    ('recipes = ("tensorwise", "rowwise")', "recipes = ()", "recipes is empty"),
    ("noise_runs = 1", "noise_runs = 0",
     "noise_runs = 0: the noise floor needs the bf16 baseline trained at least once more"),
    ("wide_width = None", "wide_width = 1000",
     "wide_width = 1000: the wide model's heads are 128 wide"),
    ('wide_recipes = ("tensorwise",)', 'wide_recipes = ("rowwise_with_gw_hp",)',
     "wide_recipes holds ['rowwise_with_gw_hp'], which recipes does not"),
    ("model_recipes = None", 'model_recipes = ("rowwise_with_gw_hp",)',
     "model_recipes holds ['rowwise_with_gw_hp'], which recipes does not"),
    ("lr = None", 'lr = "3e-4"', "Parameter lr = '3e-4' must be")])
def test_bad_widths_recipes_noise_runs_and_lr_stop_in_one_sentence(old, new, said):
    """The notebook's parameters cell, edited, then its checks (the setup cell up to the
    profile): refused in one sentence (a CourseError: a notebook shows its sentence alone)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    checks = next(c.source for c in nb.cells if "errors.check_parameters(" in c.source)
    assert old in params.source
    space = {"machine": machine, "errors": errors}
    exec(params.source.replace(old, new), space)
    with pytest.raises(errors.CourseError, match=f"^{re.escape(said)}"):
        exec(checks.split("profile = resolve(profile)", 1)[0], space)
    exec(params.source, space)  # as shipped: the checks pass
    exec(checks.split("profile = resolve(profile)", 1)[0], space)


@pytest.mark.parametrize(("profile", "given", "trained"), [
    ("full", None, ("tensorwise",)), ("smoke", None, ("tensorwise", "rowwise")),
    ("full", ("rowwise", "tensorwise"), ("rowwise", "tensorwise")), ("full", (), ())])
def test_model_recipes_default_to_the_first_recipe_in_the_full_profile(profile, given, trained):
    """Section 4 trains (and the sweep times at its shapes) the first of `recipes` in the full
    profile - each recipe more is a training and three sweep cases, compiled - and every recipe
    in the smoke profile, which checks the code; a value set in the parameters cell is kept."""
    from helpers.run_profile import resolve

    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    checks = next(c.source for c in nb.cells if "errors.check_parameters(" in c.source)
    space = {"machine": machine, "errors": errors}
    exec(params.source, space)
    space.update(model_recipes=given, profile=resolve(profile, cuda=profile == "full"))
    after = checks.split("profile = resolve(profile)", 1)[1].split("print(profile.describe())")[0]
    exec(after, space)
    assert space["model_recipes"] == trained
