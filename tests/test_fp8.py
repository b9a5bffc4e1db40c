"""Notebook 06's module (formats, scales, torchao, the sweep and its tools, the answers)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import math
import re
import sys
import types
import warnings
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import torch

from helpers import bench, errors, gpt, machine, verdicts
from helpers.chapters import fp8

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "06_fp8_on_hopper.ipynb"
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def test_scales_are_torchaos_and_roundtrips_saturate_flush_and_round_within_unit_roundoff():
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_utils import tensor_to_scale

    outlier = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    x = outlier * torch.where(torch.arange(64) == 7, 50.0, 1.0)[:, None]  # row 7 50x the rest
    torch.testing.assert_close(tensor_to_scale(x, E4M3).double(), 1 / fp8.scale(x, E4M3),
                               rtol=1e-6, atol=0)
    rowwise = tensor_to_scale(x, E4M3, scaling_granularity=ScalingGranularity.AXISWISE,
                              axiswise_dim=-1, round_scales_to_power_of_2=True)
    assert torch.equal(rowwise.double(), 1 / fp8.scale(x, E4M3, rowwise=True, pow2=True))
    assert fp8.roundtrip(torch.tensor([1000.0, 1e-5, 1.0]), E4M3).tolist() == [448.0, 0.0, 1.0]
    small = torch.full((8, 8), 1e-5) * torch.linspace(1, 2, 8)
    assert fp8.rounding_errors(small, fp8.cast(small, E4M3, "none"))["flushed_pct"] == 100.0
    scaled = fp8.rounding_errors(small, fp8.cast(small, E4M3, "tensorwise"))
    assert scaled["flushed_pct"] == 0.0 and scaled["rel_err"] <= 2.0**-4
    x = torch.rand(32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 1.0
    for dtype in (torch.bfloat16, E4M3, E5M2):
        err = (fp8.roundtrip(x, dtype) - x).abs() / x
        assert err.max().item() <= torch.finfo(dtype).eps / 2 + 1e-15
    x = outlier * torch.where(torch.arange(64) == 7, 1e5, 1.0)[:, None]
    tensorwise = fp8.rounding_errors(x, fp8.cast(x, E4M3, "tensorwise"))
    rowwise = fp8.rounding_errors(x, fp8.cast(x, E4M3, "rowwise"))  # keeps the typical token
    assert rowwise["median_row_rel_err"] < tensorwise["median_row_rel_err"] / 2
    assert rowwise["flushed_pct"] < tensorwise["flushed_pct"]
    grown = fp8.outlier_sweep(x / 1e5, [1.0, 1e6], [(E4M3, "tensorwise"), (E4M3, "rowwise")],
                              row=3).set_index(["factor", "cast"])["median_row_rel_err"][1e6]
    assert grown["float8_e4m3fn tensorwise"] > 2.0**-4 >= grown["float8_e4m3fn rowwise"]


def test_torchao_missing_or_broken_is_one_sentence_and_its_noise_is_dropped(monkeypatch):
    machine.quiet_torchao()
    passes = [logging.getLogger(name).filter(logging.LogRecord(
        name, logging.WARNING, __file__, 1, message, None, None)) for name, message in (
        ("torchao", "Failed to load /x/torchao/_C_mxfp8.abi3.so: no library"),
        ("torchao", "Skipping import of cpp extensions due to incompatible torch"),
        ("torch.utils._pytree", "<enum 'KernelPreference'> is an Enum subclass"))]
    assert [bool(p) for p in passes] == [False, True, False]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        machine.quiet_torchao()
        for where in ("/site/torchao/quantization/quant_api.py", "/site/mine/model.py"):
            warnings.warn_explicit("invalid escape sequence '\\.'", SyntaxWarning, where, 1)
    assert [w.filename for w in seen] == ["/site/mine/model.py"]
    assert fp8.torchao_problem() == "" and fp8.torchao_version() == fp8.TORCHAO_PIN  # here: fine
    with monkeypatch.context() as m:
        m.setattr(importlib.metadata, "version",
                  lambda n: importlib.metadata.distribution(n + "-x").version)
        said = fp8.torchao_problem()
        assert said.startswith("torchao is not installed") and fp8.INSTALL in said
        assert machine.missing(lacking=fp8.torchao_lack()) == f"torchao 0.18.0 ({fp8.INSTALL})"
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import raises ImportError
    said = fp8.torchao_problem()
    assert said.startswith("torchao 0.18.0 does not work with torch") and "\n" not in said
    fake = types.SimpleNamespace(convert_to_float8_training=lambda *a, **k: None,
        Float8LinearConfig=dataclasses.make_dataclass("Float8LinearConfig", [("x", bool)]))
    monkeypatch.setitem(sys.modules, "torchao.float8", fake)
    assert ("lacks Float8LinearConfig.from_recipe_name and Float8LinearConfig(emulate=...)"
            in fp8.torchao_problem())


@pytest.mark.parametrize(("cuda", "cap", "expected"), [
    (False, None, "a CUDA GPU with FP8 tensor cores"), (True, (8, 0), "this one is 8.0"),
    (True, (8, 9), ""), (True, (12, 0), "")])
def test_fp8_needs_compute_capability_8_9(monkeypatch, capsys, cuda, cap, expected):
    monkeypatch.setattr(machine, "cuda_available", lambda: cuda)
    monkeypatch.setattr(machine, "capability", lambda: cap)
    said = machine.fp8_missing()
    assert (expected in said) if expected else said == ""
    assert machine.needs(fp8=True) == (not expected)
    assert capsys.readouterr().out == (f"Skipped: this cell needs {said}.\n" if expected else "")


def _sweep(fp8_ms: dict[int, float], spread=0.005, n=None, bf16_ms=1.0) -> pd.DataFrame:
    return fp8.sweep_table([{
        "shape": f"{k}x{n or k}", "kind": "square", "tokens": 1024, "in_features": k,
        "out_features": n or k, "recipe": recipe, "median_ms": m, "q1_ms": m * (1 - sp / 2),
        "q3_ms": m * (1 + sp / 2), "samples_ms": [m * (1 + sp * d) for d in (-1, -0.5, 0, 0.5, 1)]}
        for k, ms in fp8_ms.items()
        for recipe, m, sp in (("bf16", bf16_ms, 0.005), ("tensorwise", ms, spread))])


def test_gpu_time_runs_setup_before_every_call_and_the_host_clock_keeps_each_call():
    calls = []
    clock = bench.HostClock(lambda: calls.append("call"))
    bench.gpu_time(clock, "cpu", warmup=1, repeats=3, setup=lambda: calls.append("setup"))
    assert calls == ["setup", "call"] * 4
    assert len(clock.samples_ms) == 4 and all(ms >= 0 for ms in clock.samples_ms)


def test_the_sweep_predicts_the_step_is_set_against_it_and_beside_torchaos_filter():
    from torchao.float8 import _auto_filter_for_recipe

    with torch.device("meta"):
        model, small = gpt.GPT(dataclasses.replace(gpt.TINY, n_layer=3)), gpt.GPT(gpt.GPT2_SMALL)
    assert fp8.linear_shapes(model, lambda m, fqn: fqn != "head")[(64, 256)] == 3
    assert fp8.linear_shapes(model)[(64, 256)] == 4  # the head too, without a filter
    sweep = _sweep({64: 2.5, 256: 0.5}, bf16_ms=2.0)  # a count times the difference, summed
    predicted = fp8.predict_step(sweep, {(64, 64): 2, (256, 256): 1}, "tensorwise", tokens=1024)
    assert predicted["predicted_delta_ms"] == pytest.approx(2 * 0.5 + 1 * (-1.5))
    assert predicted["predicted_low_ms"] < -0.5 < predicted["predicted_high_ms"]
    missing = fp8.predict_step(sweep, {(64, 64): 1, (128, 512): 1}, "tensorwise", tokens=1024)
    assert math.isnan(missing["predicted_delta_ms"]) and missing["missing"] == "128x512"
    e2e = pd.DataFrame({"recipe": ["bf16", "tensorwise"], "status": "ran", "step_ms": [50.0, 58.0],
                        "step_ms_q1": [49.5, 57.4], "step_ms_q3": [50.5, 58.6]})
    row = fp8.reconcile_row("m", "tensorwise", e2e, predicted)
    assert row["predicted_high_ms"] < row["measured_low_ms"] < 8.0 < row["measured_high_ms"]
    assert row["prediction_gap_ms"] == pytest.approx(-0.5 - 8.0)
    e2e.loc[1, "status"] = "out of memory"
    assert "measured_delta_ms" not in fp8.reconcile_row("m", "tensorwise", e2e, predicted)
    by = fp8.filter_table({"small": small}, {"tensorwise": _auto_filter_for_recipe(
        "tensorwise", filter_fqns=["head"])}, _sweep({768: 1.4}, n=2304)).set_index("linear")
    assert by.loc["blocks.*.attn.qkv", "auto_filter_converts"]  # K <= 4096, N > 1024
    assert not by.loc["blocks.*.attn.proj", "auto_filter_converts"]  # N <= 1024: kept in bf16
    assert not by.loc["head", "auto_filter_converts"]  # filter_fqns
    assert by.loc["blocks.*.attn.qkv", "sweep_ratio_vs_bf16"] == pytest.approx(1 / 1.4)


def test_a_steps_memory_parts_are_counted():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters())
    model(x := torch.randn(16, 32)).sum().backward()
    optimizer.step()  # the optimizer's states exist, as after training
    parts = fp8.step_memory(lambda: model(x).sum(), lambda: (optimizer.step(),
                            optimizer.zero_grad()), model, optimizer, "cpu")
    n = sum(p.numel() for p in model.parameters())
    assert parts["parameters"] == parts["gradients"] == pytest.approx(4 * n / 2**30)
    assert parts["optimizer states"] >= 2 * parts["parameters"]  # exp_avg, exp_avg_sq
    assert math.isnan(parts["peak"])  # no allocator on the CPU


@pytest.mark.parametrize(("err", "bf16", "top", "fp8_in_it", "ok"), [
    (0.0040, 0.0039, 0.0625, True, False), (0.0040, 0.0017, 0.0625, True, True),
    (2 * 0.0017, 0.0017, 0.0625, True, False), (0.0625, 0.0017, 0.0625, True, False),
    (math.nan, 0.0017, 0.0625, True, False), (0.0017, 0.0017, 0.0017, False, True),
    (0.0018, 0.0017, 0.0017, False, False)])  # strict above bf16's error and at the top
def test_a_product_barely_above_bf16s_error_does_not_pass(err, bf16, top, fp8_in_it, ok):
    assert fp8.product_ok(err, bf16, top, through_fp8=fp8_in_it) == ok


@pytest.mark.parametrize(("times", "spread", "expected"), [
    ({768: 1.3, 2048: 1.1, 4096: 0.8, 8192: 0.6}, 0.005, 4096), ({768: 0.9}, 0.005, 768),
    ({1024: 1.2, 2048: 0.8, 4096: 1.01, 8192: 0.7}, 0.005, 8192),  # same within 3% at 4096
    ({4096: 0.98, 8192: 0.98}, 0.005, None),  # 2% faster: inside the margin
    ({4096: 0.9}, 0.01, 4096), ({4096: 0.9}, 0.4, None)])  # the interval reaches the margin
def test_crossover_is_the_narrowest_width_from_which_float8_stays_faster(times, spread, expected):
    assert fp8.crossover(_sweep(times, spread), "tensorwise") == expected


def _run(ms, val_loss, mem=2.0):
    return bench.Run("r", "cuda", losses=[5.5 - 0.15 * i for i in range(20)], warmup=1,
                     step_ms=[100.0] + [ms * (1 + 0.01 * ((i % 3) - 1)) for i in range(19)],
                     peak_mem_gib=mem, extra={"val_loss": val_loss})


def test_the_answers_read_the_crossover_speed_and_learning_or_say_why_they_cannot():
    answers = verdicts.Answers("06")  # rows 0-3: at the crossover or the widest width
    for q, times, recipe, why in (("q1", {768: 1.3, 2048: 0.8, 4096: 0.7}, "tensorwise", ""),
                                  ("q2", {768: 1.3, 2048: 1.2}, "tensorwise", ""),
                                  ("q3", {768: 0.5}, "rowwise", ""),  # not timed
                                  ("q4", {768: 0.5}, "tensorwise", "needs a GPU")):
        fp8.answer_crossover(answers, q, _sweep(times), recipe, **({"why": why} if why else {}))
    questions = {"time": "faster?", "loss": "learns the same?", "memory": "less memory?"}
    noise = verdicts.NoiseFloor((2.9592, 2.9593), other_seed=3.0973, other_seeds=(2.8747,))
    runs = {"bf16": _run(142.0, 2.9592, mem=15.3), "tensorwise": _run(102.0, 2.8331, mem=13.3)}
    fp8.answer_runs(answers, questions, "GPT 2 x 4096", "tensorwise", runs, noise)
    fp8.answer_runs(answers, questions, "m", "tensorwise", {}, None, why="needs a GPU")
    noise = verdicts.NoiseFloor((3.0, 3.0), other_seed=3.03, other_seeds=(2.97,))
    on_cpu = {"bf16": _run(50.0, 3.0, mem=math.nan), "tensorwise": _run(40.0, 3.3, mem=math.nan)}
    fp8.answer_runs(answers, {k: q + " (emulated)" for k, q in questions.items()}, "m",
                    "tensorwise", on_cpu, noise, untimed="FP8 emulated")
    failed = {**on_cpu, "tensorwise": bench.Run("f", "cuda", error="out of memory")}
    fp8.answer_runs(answers, {"time": "after a failure"}, "m", "tensorwise", failed, noise)
    df = answers.table()
    assert verdicts.check_answers(df) == []
    assert df["candidate"][0].startswith("float8 tensorwise at width 2048, the narrowest")
    assert df["candidate"][1].endswith("width 2048, the widest timed")
    assert df[["verdict", "effect"]][:2].values.tolist() == [["faster", "1.25x faster"],
                                                             ["slower", "20% slower"]]
    assert list(df["verdict"][2:4]) == [verdicts.MISSING] * 2 and df["basis"][3] == "needs a GPU"
    assert df[["verdict", "effect"]][4:7].values.tolist() == [  # a reviewer's wide model, H200
        ["faster", "1.39x faster"], ["same", "same within 15%"], ["less", "13% less"]]
    assert df["candidate"][4] == "GPT 2 x 4096 + float8 tensorwise"
    assert list(df["verdict"][7:]) == [verdicts.MISSING] * 4 + ["higher"] + [verdicts.MISSING] * 2
    assert list(df["basis"][7:11]) == ["needs a GPU"] * 3 + ["FP8 emulated"]
    assert "allocator" in df["basis"][12] and "out of memory" in df["basis"][13]


def _streams(path: Path) -> tuple[list, str]:  # an error output fails the run itself
    streams = [o for c in nbformat.read(path, as_version=4).cells for o in c.get("outputs", [])
               if o.output_type == "stream"]
    return [o.text for o in streams if o.name == "stderr"], "".join(o.text for o in streams)


@pytest.mark.notebook
@pytest.mark.smoke("06")
def test_the_notebook_answers_once_and_saves_tables_of_numbers(smoke_run):
    out, runs = smoke_run  # 06 with emulate_fp8=True on the CPU: the losses answer, no time does
    assert runs[NOTEBOOK.name].parameters == {"emulate_fp8": True}  # ok, or skipped
    assert _streams(runs[NOTEBOOK.name].output)[0] == [], "a stderr block"
    results = out / "results"
    answers = pd.read_csv(results / "06_answers.csv")
    loss = answers["measure"] == "final validation loss"
    assert verdicts.check_answers(answers) == [] and len(answers) == 11 and loss.sum() == 2
    assert answers.loc[loss, "verdict"].isin(verdicts.verdict_words("loss")[:3]).all()
    assert (answers.loc[~loss, "verdict"] == verdicts.MISSING).all()
    timed = answers["unit"] == "ms"
    assert answers.loc[timed, "basis"].str.startswith(("FP8 emulated", "needs torch.compile")).all()
    for name in ("06_end_to_end", "06_wide_end_to_end"):  # both models on the same batches
        e2e = pd.read_csv(results / f"{name}.csv")
        assert list(e2e["status"]) == ["ran"] * 2 and e2e["batch_checksum"].nunique() == 1
    saved = json.loads((results / "06_losses.json").read_text())
    assert {r["checksum"] for r in saved["runs"].values()} == {saved["runs"]["bf16"]["checksum"]}
    assert len(saved["runs"]) == 5 and saved["recipe"]["lr"] == gpt.SMOKE_PEAK_LR
    assert 0.0 <= saved["noise"]["floor"] < 1e-3 < saved["noise"]["seed_spread"]  # a CPU
    sweep = pd.read_csv(results / "06_width_sweep.csv")
    widths = sorted(sweep.loc[sweep["kind"] == "square", "in_features"].unique())
    assert widths == [32, 64, 128] and {"64x192", "128x512", "512x128"} <= set(sweep["shape"])
    assert pd.read_csv(results / "06_crossover.csv")["crossover_width"].dropna().isin(widths).all()
    assert pd.read_csv(results / "06_reconciled.csv")["predicted_delta_ms"].notna().all()
    words = {w for k in verdicts.KINDS for w in verdicts.verdict_words(k)} | {"tie", "within"}
    for path in set(results.glob("06_*.csv")) - {results / "06_answers.csv"}:
        assert not pd.read_csv(path).select_dtypes(exclude="number").isin(words).any().any(), path


@pytest.mark.notebook
def test_the_notebook_without_torchao_says_so_in_one_sentence(tmp_path, monkeypatch):
    from coursetools import runner
    (tmp_path / "torchao.py").write_text("raise ImportError('simulated: a torchao that is broken')")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # found before the installed torchao
    run = runner.execute(NOTEBOOK, tmp_path / "out", profile="smoke", timeout=300)
    assert run.ok, run.error
    stderr, text = _streams(run.output)
    assert not stderr and "simulated: a torchao that is broken" in text
    assert "does not work with torch" in text and "torchao==0.18.0, then restart the" in text
    assert "Skipped: this cell needs torchao 0.18.0 (pip install torchao==0.18.0)." in text
    answers = pd.read_csv(tmp_path / "out" / "results" / "06_answers.csv")
    assert len(answers) == 11 and (answers["verdict"] == verdicts.MISSING).all()
    assert answers["basis"].str.contains("torchao 0.18.0").all()


@pytest.mark.parametrize(("changed", "said"), [
    ("widths = (1000, 768)", "widths holds [1000]: FP8 matrix products need multiples of 16"),
    ("recipes = ()", "recipes is empty"),
    ("wide_width = 1000", "wide_width = 1000: the wide model's heads are 128 wide"),
    ('wide_recipes = ("rowwise_with_gw_hp",)',
     "wide_recipes holds ['rowwise_with_gw_hp'], which recipes does not")])
def test_bad_parameters_stop_in_one_sentence(changed, said):  # the setup cell's checks
    cells = nbformat.read(NOTEBOOK, as_version=4).cells
    params = next(c.source for c in cells if "parameters" in c.metadata.get("tags", []))
    checks = next(c.source for c in cells if "errors.check_parameters(" in c.source)
    checks = checks.split("profile = resolve(profile)", 1)[0]
    space = {"machine": machine, "errors": errors}
    exec(f"{params}\n{changed}", space)  # set after the shipped value
    with pytest.raises(errors.CourseError, match=f"^{re.escape(said)}"):
        exec(checks, space)
    exec(params, space)  # as shipped: the checks pass
    exec(checks, space)
