"""Notebook 04's readings of the legacy child (sections 5 and 6), run on a hand-made payload.

The smoke run has no GPU and no legacy install, so these cells only print their skip lines
there; here they read a payload shaped like the child's, and each prints at most two lines.
"""

from __future__ import annotations

import contextlib
import io
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
READINGS = ["23a14130", "375a777e", "00ff8fbe", "c9e7d805", "f46c5bc9"]  # sections 5 and 6


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
                  _run("apex.amp O1", fp32, ms=3.0, scales=[65536.0] * 20),
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
          "cfg": legacy_amp.TrainConfig.smoke()}
    ns["legacy_runs"] = [r for r in ns["child_runs"] if r.extra["api"] != "torch.amp"]
    ns["all_runs"] = ns["legacy_runs"] + list(runs.values())
    exec(CELLS["92fb4e2a"], ns)  # TOLERANCE and within_tolerance
    return ns


def _read(ns: dict, cell: str) -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(CELLS[cell], ns)
    return [line for line in out.getvalue().splitlines() if line.strip()]


@pytest.mark.parametrize("o3_final, reading", [(1.5, "But it learned less"),
                                                (1.01, "After the same")])
def test_sections_5_and_6_read_the_child_in_a_table_and_two_lines_a_cell(o3_final, reading):
    ns = _namespace(o3_final)
    printed = {cell: _read(ns, cell) for cell in READINGS}
    assert all(len(lines) <= 2 for lines in printed.values()), printed
    (status,) = printed["23a14130"]
    assert "5 of 6 runs ran (failed - apex.amp O2: boom)" in status, status
    assert "its fp32 run reproduces this kernel's" in status, status
    options = ns["shown"][0]
    assert options.loc["matches the map"].all() and options.loc["torch restored after"].all()
    (o1,) = printed["00ff8fbe"]
    assert "O1 wrapped 224" in o1 and "raised 2 distinct warnings" in o1, o1
    warned = pd.read_csv(results.results_dir() / "04_legacy_warnings.csv")["warning"].tolist()
    assert warned == ["DeprecatedFeatureWarning: gone.", "UserWarning: old."]
    assert printed["c9e7d805"] == ["No loss scale moved in the 1 runs that have one: no step "
                                   "overflowed, so none was skipped."]
    o3_table = ns["shown"][-1].set_index("run")
    assert o3_table.loc["apex.amp O3", "outcome"] == "non-finite from step 1"
    cause, speed = printed["f46c5bc9"]
    assert cause.startswith("O3's loss went non-finite at step 1") and "first Adam update" in cause
    assert speed.startswith("Per step, apex.amp O3 eps=0.001") and reading in speed, speed


def test_a_failed_child_is_one_sentence_naming_its_error_once():
    ns = _namespace(1.5)
    error = "the child process exited with status 1: NameError: name 'amp' is not defined"
    ns["child"] = {"runs": [], "levels": {}, "error": error, "seconds": 3.0, "meta": {}}
    ns["child_runs"], ns["legacy_runs"] = [], []
    (status,) = _read(ns, "23a14130")
    assert status == f"child process: 3.0 s, {error}; 0 of 0 runs ran; it produced no fp32 run."
    assert _read(ns, "375a777e") == ["No legacy options to check (the legacy runs did not run "
                                     "here)."]


def test_the_fused_kernel_line_names_the_runs_that_used_them_or_why_none_did():
    ns = _namespace(1.5)
    ns["child"]["meta"]["fused_check"] = {
        "ok": True, "calls": ["multi_tensor_axpby", "multi_tensor_scale"], "missing": [],
        "max_abs_error": {"multi_tensor_scale": 0.0, "multi_tensor_axpby": 1e-7}, "why": ""}
    ns["legacy_runs"][1].extra["fused_kernels"] = True  # apex.amp O1
    (line,) = _read(ns, "f5e0c7a1")
    assert "the 2 kernels" in line and line.endswith("Runs that used them: apex.amp O1."), line
    ns["child"]["meta"]["fused_check"] = {"ok": False, "why": "the modern amp_C lacks x"}
    assert _read(ns, "f5e0c7a1") == ["The legacy amp ran without fused kernels only: the modern "
                                     "amp_C lacks x."]
