"""Notebook 04's cells that read the legacy child (sections 5, 6, 9 and the summary), run on a
hand-made payload.

The smoke run has no GPU and no legacy install, so these cells only see the child's fp32 run
there; here they read a payload shaped like the child's, and the assertions are on the tables
and CSV files they produce.
"""

from __future__ import annotations

import ast
import contextlib
import io
import types
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import torch

from helpers import bench, results, verdicts
from helpers.chapters import legacy_amp

NOTEBOOK = (Path(__file__).resolve().parents[1] / "notebooks"
            / "04_legacy_apex_amp_vs_torch_amp.ipynb")
CELLS = {cell.id: cell.source for cell in nbformat.read(NOTEBOOK, as_version=4).cells}
STATUS, OPTIONS, WARNINGS, FUSED = "23a14130", "375a777e", "00ff8fbe", "f5e0c7a1"
RUNS, O3, SUMMARY = "48c2c175", "5b8e2f47", "bb879cf6"


def _run(label, losses, *, ms=2.0, recipe="", api="apex.amp (legacy)", scales=None):
    extra = {"api": api, "opt_level_or_recipe": recipe or label.split(" ", 1)[1]}
    if scales:
        extra["loss_scales"] = scales
    return bench.Run(label, "cuda", losses=losses, step_ms=[ms] * len(losses), warmup=0,
                     extra=extra)


def _namespace(o3_final: float) -> dict:
    """What the cells read: the kernel's runs and a child payload with O0-O3, one failed O2."""
    fp32 = [4.0] * 10 + [1.0] * 10
    base = _run("torch.amp fp32", fp32, ms=10.0, recipe="fp32", api="torch.amp")
    child_runs = [_run("torch.amp fp32 (child)", fp32, recipe="fp32", api="torch.amp"),
                  _run("apex.amp O0", fp32, ms=10.0),
                  _run("apex.amp O1", fp32, ms=3.0, scales=[65536.0] * 19 + [32768.0]),
                  legacy_amp.failed_run("apex.amp O2", "apex.amp (legacy)", "O2", "boom", "cuda"),
                  _run("apex.amp O3", [4.0] + [float("nan")] * 19),
                  _run("apex.amp O3 eps=0.001", [4.0] * 10 + [o3_final] * 10, ms=1.0)]
    options = {e["opt_level"]: dict(e["options"]) for e in legacy_amp.MIGRATION
               if e["opt_level"] != "O2"}
    levels = {lvl: {"options": opts, "restored": True, "adam_eps": 1e-8,
                    "warnings": ["UserWarning: old. More.", "DeprecatedFeatureWarning: gone."]}
              for lvl, opts in options.items()}
    levels["O1"]["patched_functions"] = 224
    levels["O3 eps=0.001"] = {"adam_eps": 1e-3, "restored": True, "warnings": []}
    child = {"runs": [r.to_dict() for r in child_runs], "levels": levels, "error": "",
             "seconds": 12.5, "meta": {"torch": torch.__version__, "apex_path": "/legacy/apex",
                                       "fused_kernels": False}}
    runs = {"fp32": base, "autocast_fp16": _run("torch.amp autocast_fp16", fp32, ms=3.0,
                                                recipe="autocast_fp16", api="torch.amp")}
    shown: list = []
    ns = {"pd": pd, "torch": torch, "legacy_amp": legacy_amp, "results": results,
          "verdicts": verdicts, "env": {}, "display": shown.append, "shown": shown,
          "child": child, "child_runs": legacy_amp.runs_of(child), "base": base, "runs": runs,
          "cfg": legacy_amp.TrainConfig.smoke(), "profile": types.SimpleNamespace(has_cuda=False)}
    ns["legacy_runs"] = [r for r in ns["child_runs"] if r.extra["api"] != "torch.amp"]
    exec(CELLS["92fb4e2a"], ns)  # TOLERANCE and within_tolerance
    return ns


def _read(ns: dict, cell: str) -> list[str]:
    """Run a cell as the notebook does; its printed lines. The value of a last expression
    (what the notebook displays) goes to ``ns["shown"]``."""
    tree = ast.parse(CELLS[cell])
    last = tree.body.pop() if isinstance(tree.body[-1], ast.Expr) else None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(tree, cell, "exec"), ns)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), cell, "eval"), ns)
            if value is not None:
                ns["shown"].append(value)
    return [line for line in out.getvalue().splitlines() if line.strip()]


def _csv(name: str) -> pd.DataFrame:
    return pd.read_csv(results.results_dir() / f"{name}.csv")


def test_section_5_reads_the_child_into_data_and_a_line_a_cell():
    ns = _namespace(1.5)
    printed = {cell: _read(ns, cell) for cell in (STATUS, OPTIONS, WARNINGS)}
    assert ns["failed"] == {"apex.amp O2": "boom"} and ns["diff"] == 0.0
    (status,) = printed[STATUS]  # one rendered snapshot
    assert "runs ran: 5/6; failed: {'apex.amp O2': 'boom'}" in status, status
    assert printed[OPTIONS] == [] and ns["shown"] == []  # the options go to a CSV
    check = _csv("04_legacy_options")
    assert set(check["opt_level"]) == {"O0", "O1", "O3"} and check["matches"].all()
    (o1,) = printed[WARNINGS]
    assert "O1 wrapped 224" in o1, o1
    assert _csv("04_legacy_warnings")["warning"].tolist() == ["DeprecatedFeatureWarning: gone.",
                                                               "UserWarning: old."]


def test_an_option_that_differs_from_the_map_stops_the_notebook():
    ns = _namespace(1.5)
    ns["child"]["levels"]["O1"]["options"]["loss_scale"] = 128.0
    with pytest.raises(AssertionError):
        _read(ns, OPTIONS)


def test_a_failed_child_leaves_no_fp32_difference_and_no_options():
    ns = _namespace(1.5)
    error = "the child process exited with status 1: NameError: name 'amp' is not defined"
    ns["child"] = {"runs": [], "levels": {}, "error": error, "seconds": 3.0, "meta": {}}
    ns["child_runs"], ns["legacy_runs"] = [], []
    (status,) = _read(ns, STATUS)
    assert error in status and ns["failed"] == {} and ns["diff"] != ns["diff"]  # NaN
    assert _read(ns, OPTIONS) == [] and _csv("04_legacy_options").empty
    assert _read(ns, WARNINGS) == [] and _csv("04_legacy_warnings").empty


@pytest.mark.parametrize("o3_final, o3_within", [(1.5, False), (1.01, True)])
def test_section_6_shows_one_runs_table_and_asserts_the_checked_rows(o3_final, o3_within):
    ns = _namespace(o3_final)
    assert _read(ns, RUNS) == []
    (table,) = ns["shown"]
    by = table.set_index("run")
    assert list(by.index) == ["apex.amp O0", "apex.amp O1", "apex.amp O3",
                              "apex.amp O3 eps=0.001", "torch.amp fp32", "torch.amp autocast_fp16"]
    assert by.loc["apex.amp O1", "scale_halvings"] == 1
    assert not by.loc["apex.amp O3", "learned"] and not by.loc["apex.amp O3", "asserted"]
    assert by.loc["apex.amp O3 eps=0.001", "within_tolerance"] == o3_within
    assert by.loc[["apex.amp O0", "apex.amp O1", "torch.amp autocast_fp16"], "asserted"].all()


def test_section_6_stops_when_an_asserted_run_learned_less():
    ns = _namespace(1.5)
    ns["runs"]["autocast_fp16"] = _run("torch.amp autocast_fp16", [4.0] * 10 + [1.5] * 10,
                                       recipe="autocast_fp16", api="torch.amp")
    with pytest.raises(AssertionError, match="outside the tolerance"):
        _read(ns, RUNS)


def test_o3_sits_beside_the_adam_step_of_its_eps():
    ns = _namespace(1.5)
    ns["adam_steps"] = pd.DataFrame(
        [{"eps": eps, "eps_in_fp16": float(torch.tensor(eps).half()), "gradient_kind": kind,
          "weight_after_one_step": w}
         for eps, ws in ((1e-8, (float("-inf"), float("nan"), -1e-4)), (1e-3, (-2.5e-5, 0, -1e-4)))
         for kind, w in zip(("median", "zero", "large"), ws, strict=True)])
    _read(ns, O3)
    (table,) = ns["shown"]
    assert table.loc[1e-8, "outcome"] == "non-finite"
    assert table.loc[1e-8, "first_nonfinite_step"] == 1
    assert table.loc[1e-8, "weight_after_median"] == float("-inf")
    assert table.loc[1e-3, "outcome"] == "outside tolerance"
    assert table.loc[1e-3, "vs_fp32_pct"] == pytest.approx(50.0)
    assert table.loc[1e-3, "eps_in_fp16"] == pytest.approx(1e-3, rel=1e-3)


def test_the_summary_is_one_row_per_opt_level():
    ns = _namespace(1.01)
    _read(ns, RUNS)
    ns["speed"] = pd.DataFrame({"candidate": ["torch.amp autocast_fp16"], "vs": ["apex.amp O1"],
                                "label": ["faster 1.50x"]})
    ns["overflow"] = pd.DataFrame([{"run": "apex.amp O1", "params_unchanged": True,
                                    "scale_halved": True, "next_step_updates": True}])
    ns["levels"] = ns["child"]["levels"]
    assert _read(ns, SUMMARY) == []  # no CUDA: no memory line
    by = ns["shown"][-1].set_index("opt_level")
    assert by.loc["O1", "recipe_vs_legacy"] == "faster 1.50x" and by.loc["O1", "overflow_skipped"]
    assert by.loc["O1", "legacy_trained"] and by.loc["O1", "recipe_trained"]
    assert by.loc["O3", "legacy_trained"] is False and by.loc["O0", "apex_options_match"]
    assert _csv("04_summary")["opt_level"].tolist() == list(legacy_amp.OPT_LEVELS)


def test_the_fused_kernel_line_names_the_runs_that_used_them_or_why_none_did():
    ns = _namespace(1.5)
    ns["child"]["meta"]["fused_check"] = {
        "ok": True, "calls": ["multi_tensor_axpby", "multi_tensor_scale"], "missing": [],
        "max_abs_error": {"multi_tensor_scale": 0.0, "multi_tensor_axpby": 1e-7}, "why": ""}
    ns["legacy_runs"][1].extra["fused_kernels"] = True  # apex.amp O1
    _read(ns, FUSED)
    assert ns["ran"] == ["apex.amp O1"]
    ns["child"]["meta"]["fused_check"] = {"ok": False, "why": "the modern amp_C lacks x"}
    assert _read(ns, FUSED) == ["The legacy amp ran without fused kernels only: the modern "
                                "amp_C lacks x."]
