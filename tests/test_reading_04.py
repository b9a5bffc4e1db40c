"""Notebook 04's cells that read the legacy child, run on a hand-made payload."""

import ast
import contextlib
import dataclasses
import io
import statistics
import types
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import torch

from helpers import bench, errors, results, verdicts
from helpers.chapters import legacy_amp

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "04_legacy_apex_amp_vs_torch_amp.ipynb"
CELLS = {cell.id: cell.source for cell in nbformat.read(NOTEBOOK, as_version=4).cells}
STATUS, OPTIONS, FUSED, RUNS = "23a14130", "375a777e", "f5e0c7a1", "48c2c175"
ANSWERING = (STATUS, OPTIONS, "00ff8fbe", FUSED, RUNS, "2c8d5f61", "94bbfd23", "b7d3e2f4",
             "5c0e7d12", "bb879cf6")  # ... warnings, learn, steps, speed, fastest, summary
DYNAMIC, STATIC = [65536.0] * 20, [1.0] * 20
ROUNDS = {  # five rounds of each candidate (ms)
    "torch.amp fp32": [10.0] * 5,
    "torch.amp autocast_fp16_unscaled": [2.0] * 5,  # fastest of all, if it keeps its gradients
    "torch.amp autocast_bf16": [2.5, 2.6, 2.5, 2.4, 2.5],
    "torch.amp autocast_fp16": [3.0] * 5,
    "torch.amp fp16_master_weights": [3.1] * 5,
    "apex.amp O1": [4.0] * 5,
    "apex.amp O1 fused": [3.9, 3.0, 3.9, 3.9, 3.9],  # one round even: no verdict
    "apex.amp O2": [3.6] * 5,
    "apex.amp O2 fused": [2.5] * 5}


def _run(label, final=1.0, *, dtype="float16", scales=None, mem=0.7, fused=False):
    api, recipe = label.split(" ", 1)
    extra = {"api": "torch.amp" if api == "torch.amp" else "apex.amp (legacy)",
             "opt_level_or_recipe": recipe.removesuffix(" (child)"), "activation_dtype": dtype,
             "loss_scales": scales or [], "fused_kernels": fused}
    return bench.Run(label, "cuda", losses=[4.0] * 10 + [final] * 10, step_ms=[1.0] * 20,
                     warmup=0, peak_mem_gib=mem, extra=extra)


def _namespace(monkeypatch, fp16_underflow: float = 0.006) -> dict:
    """The kernel's recipes, a child payload (O0-O3, O1/O2 fused, every round), section 6's."""
    kernel = {"fp32": _run("torch.amp fp32", dtype="float32"),
              "autocast_fp16_unscaled": _run("torch.amp autocast_fp16_unscaled"),
              "autocast_fp16": _run("torch.amp autocast_fp16", scales=DYNAMIC, mem=0.71),
              "autocast_bf16": _run("torch.amp autocast_bf16", dtype="bfloat16"),
              "fp16_master_weights": _run("torch.amp fp16_master_weights", scales=DYNAMIC)}
    child_runs = [_run("torch.amp autocast_fp16 (child)", scales=DYNAMIC),
                  _run("apex.amp O0", dtype="float32", scales=STATIC),
                  _run("apex.amp O1", scales=DYNAMIC),
                  _run("apex.amp O2", 1.019, scales=DYNAMIC, mem=0.85),  # +1.9%: trained
                  _run("apex.amp O3", float("nan"), scales=STATIC),
                  _run("apex.amp O3 eps=0.001", 1.5, scales=STATIC),
                  _run("apex.amp O1 fused", scales=DYNAMIC, fused=True),
                  _run("apex.amp O2 fused", 1.019, scales=DYNAMIC, mem=0.85, fused=True)]
    levels = {e: {"options": None, "restored": True, "adam_eps": 1e-8,
                  "warnings": ["UserWarning: old. More.", "DeprecatedFeatureWarning: gone."]}
              for e in ("O0", "O1", "O2", "O3", "O1 fused", "O2 fused")}
    levels["O3 eps=0.001"] = {"adam_eps": 1e-3, "restored": True, "warnings": []}
    levels["O1"]["patched_functions"] = 224
    child = {"runs": [r.to_dict() for r in child_runs], "levels": levels, "error": "",
             "seconds": 12.5, "import_error": "", "overflow": [], "rounds": dict(ROUNDS),
             "round_errors": {}, "stdout": "", "meta": {"torch": torch.__version__, "fused_check": {
                 "ok": True, "calls": ["multi_tensor_scale"], "missing": [], "why": ""}}}
    grads = [{"format": f, "loss_scale": s, "underflow_pct": u, "overflow_pct": 0.0,
              "grad_abs_median": 2.5e-4}
             for f, s, u in (("float16", 1.0, fp16_underflow), ("float16", 2.0**16, 0.0),
                             ("bfloat16", 1.0, 0.0), ("float32", 1.0, 0.0))]
    monkeypatch.setattr(legacy_amp, "gradient_representability", lambda *a, **k: grads)
    ns = {"pd": pd, "torch": torch, "statistics": statistics, "dataclasses": dataclasses,
          "legacy_amp": legacy_amp, "results": results, "verdicts": verdicts, "errors": errors,
          "env": {}, "shown": [], "child": child, "runs": kernel, "base": kernel["fp32"],
          "cfg": legacy_amp.TrainConfig.smoke(), "device": "cpu", "batches": [None], "lacks": "",
          "answers": verdicts.Answers("04"), "profile": types.SimpleNamespace(has_cuda=False)}
    ns["display"] = ns["shown"].append
    ns["child_runs"] = legacy_amp.runs_of(child)
    ns["legacy_runs"] = [r for r in ns["child_runs"] if r.extra["api"] != "torch.amp"]
    ns["noise"] = verdicts.NoiseFloor((1.0, 1.0), other_seeds=(1.004, 0.997))  # 0.7% spread
    for cell in ("22eb5177", "92fb4e2a"):  # the level map, the tolerance
        exec(CELLS[cell], ns)
    for level, options in ns["level_options"].items():  # the legacy Apex agrees with the map
        levels[level]["options"] = dict(options)
    return ns


def _read(ns: dict, *cells: str) -> list[str]:
    """Run cells as the notebook does (a last expression's value to ns["shown"]); printed lines."""
    out = io.StringIO()
    for cell in cells:
        tree = ast.parse(CELLS[cell])
        last = tree.body.pop() if isinstance(tree.body[-1], ast.Expr) else None
        with contextlib.redirect_stdout(out):
            exec(compile(tree, cell, "exec"), ns)
            value = eval(compile(ast.Expression(last.value), cell, "eval"), ns) if last else None
            if value is not None:
                ns["shown"].append(value)
    return [line for line in out.getvalue().splitlines() if line.strip()]


@pytest.mark.parametrize("fp16_underflow, fastest", [
    (0.006, "torch.amp autocast_bf16"),  # the unscaled fp16 format loses gradient values
    (0.0, "torch.amp autocast_fp16_unscaled")])  # ... or it does not: then it may win
def test_every_answer_reads_the_one_table_of_rounds_and_the_fastest_keeps_its_gradients(
        monkeypatch, fp16_underflow, fastest):
    ns = _namespace(monkeypatch, fp16_underflow)
    printed = _read(ns, *ANSWERING)
    steps = pd.read_csv(results.results_dir() / "04_step_times.csv").set_index("candidate")
    assert steps.loc["apex.amp O1 fused", ["round_1", "round_2"]].tolist() == [3.9, 3.0]
    df = ns["answers"].table()
    assert verdicts.check_answers(df) == []
    saved = pd.read_csv(results.results_dir() / "04_answers.csv")  # the Summary's table
    assert saved["question"].tolist() == df["question"].tolist() and len(df) == 11
    ours = {v: k for k, v in ns["said"].items()}
    for (candidate, baseline), row in df[df["measure"] == "time"].set_index(
            ["candidate", "baseline"]).iterrows():  # each from the same rounds' ratios
        a, b = ours.get(candidate, candidate), ours.get(baseline, baseline)
        ratios = [x / y for x, y in zip(ROUNDS[a], ROUNDS[b], strict=True)]
        assert (row.ratio, row.ratio_lo, row.ratio_hi) == pytest.approx(
            (statistics.median(ratios), min(ratios), max(ratios)))
    verdict = df.set_index(["question", "candidate"])["verdict"].to_dict()
    o1 = "Is apex.amp O1 faster than torch.amp autocast + GradScaler?"
    assert verdict[(o1, "apex.amp O1 without its fused kernels")] == "slower"
    assert verdict[(o1, "apex.amp O1 with its fused kernels")] == "cannot tell"
    by_hand = "Is apex.amp O2 faster than its recipe written by hand in torch?"
    assert verdict[(by_hand, "apex.amp O2 with its fused kernels")] == "faster"
    # "learn the same" against the other seeds' spread (0.7%, so 1.4%); memory exactly
    learn = df[df["measure"] == "final training loss"].set_index("candidate")["verdict"]
    assert learn.to_dict() == {"apex.amp O1 without its fused kernels": "same",
                               "apex.amp O2 without its fused kernels": "higher"}
    assert df.loc[df["unit"] == "GiB", "verdict"].tolist() == ["more"]
    assert any("runs that used them, loss for loss as without" in line for line in printed)
    assert "runs ran: 8/8; failed: none" in printed[0] and ns["diff"] == 0.0
    table = ns["run_table"].set_index("run").loc[["apex.amp O3", "apex.amp O1"]]
    assert table["grads_lost_pct"].tolist() == [fp16_underflow, 0.0]  # O3: static scale 1
    assert table["learned"].tolist() == [False, True]  # O3's is reported, not checked
    rows = df.query("question.str.startswith('Is the fastest')")  # than fp32, the runner-up
    assert rows[["candidate", "verdict"]].values.tolist() == [[fastest, "faster"]] * 2


def test_without_the_legacy_install_its_answers_say_why_and_the_rest_are_measured(monkeypatch):
    ns = _namespace(monkeypatch)
    ns["lacks"] = "a CUDA GPU"
    ns["child"].update(runs=ns["child"]["runs"][:1], levels={}, meta={"torch": "x"},
                       rounds={k: v for k, v in ROUNDS.items() if k.startswith("torch.amp")})
    ns["child_runs"], ns["legacy_runs"] = legacy_amp.runs_of(ns["child"]), []
    _read(ns, *ANSWERING)
    df = ns["answers"].table()
    assert verdicts.check_answers(df) == []
    legacy = df[df["candidate"].str.startswith("apex.amp")]
    assert set(legacy["verdict"] + ": " + legacy["basis"]) == {"not measured: needs a CUDA GPU"}
    assert len(legacy) == 9 and (df["verdict"] != "not measured").sum() == 2  # the fastest, twice


@pytest.mark.parametrize("plant, cell, match", [
    (lambda ns: ns["child"]["levels"]["O1"]["options"].update(loss_scale=128.0), OPTIONS, None),
    (lambda ns: ns["child"]["levels"]["O2"].update(restored=False), OPTIONS, "left patched"),
    (lambda ns: ns["child_runs"][0].losses.__setitem__(5, 1.5), STATUS, None),  # other data
    (lambda ns: ns["legacy_runs"][-1].losses.__setitem__(19, 1.5), FUSED, None),  # O2 fused
    (lambda ns: ns["runs"].update(autocast_fp16=_run("torch.amp autocast_fp16", 1.5)), RUNS,
     "outside the tolerance")])
def test_a_child_or_run_that_breaks_the_checks_stops_the_notebook(monkeypatch, plant, cell, match):
    ns = _namespace(monkeypatch)
    plant(ns)
    with pytest.raises(AssertionError, match=match):
        _read(ns, cell)
