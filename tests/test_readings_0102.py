"""The answering cells of notebook 01 on planted data, and the answers 01 and 02 save."""

import contextlib
import io
import itertools
import math
import os
import re
import shutil
import statistics
import subprocess
import threading
import time
import types
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import torch

from helpers import bench, ceilings, errors, verdicts

ROOT = Path(__file__).resolve().parent.parent
NB01 = "01_environment_and_apex_build.ipynb"
SAVED: dict = {}  # name -> the table a cell saved


def run(notebook: str, ids: list[str], space: dict) -> str:  # what the cells printed
    nb = nbformat.read(ROOT / "notebooks" / notebook, as_version=4)
    cells = {c.id: c.source for c in nb.cells}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for cid in ids:
            exec(cells[cid], space)
    return out.getvalue()


def base(notebook: str, **names) -> dict:  # what the first cells define, and names
    save = types.SimpleNamespace(save_table=lambda df, name, **_: SAVED.__setitem__(name, df))
    return {"answers": verdicts.Answers(notebook[:2]), "pd": pd, "math": math, "torch": torch,
            "statistics": statistics, "time": time, "itertools": itertools, "re": re,
            "shutil": shutil, "subprocess": subprocess, "threading": threading,
            "bench": bench, "ceilings": ceilings,
            "errors": errors, "verdicts": verdicts, "results": save,
            "env": {}, "display": lambda *_: None, **names}


def said(space: dict) -> dict[str, dict]:  # the answers so far, by candidate
    return {r["candidate"]: r for r in space["answers"].rows}


# ------------------------------------------------------------------ 01
def test_01_a_product_slower_in_every_round_reads_with_its_size():
    # the reviewer's run: the flushed product at 89% of the ceiling in every round, once a tie
    idle = "idle 50 ms before each repeat"
    per_round = {"back to back": [1.0] * 5, "L2 flush before each repeat": [1.12] * 5,
                 idle: [1.05, 1.2, 0.98, 1.1, 1.1]}  # one round faster: cannot tell
    space = base(NB01, per_round=per_round, idle=idle, k=5, matmul_tflop=1.0,
                 ceiling_tflops=0.01, ceiling_key="bf16", device=torch.device("cpu"), n=8,
                 dtype=torch.bfloat16)
    printed = run(NB01, ["54d7569a", "9a9fc75e"], space)
    flushed, paused = said(space)["L2 flush before each repeat"], said(space)[idle]
    assert (flushed["effect"], flushed["verdict"]) == ("12% slower", "slower")
    assert paused["verdict"] == "cannot tell" and paused["effect"].startswith("cannot tell: ")
    assert "CHECK:" in printed  # a ceiling 100x too low: its shares are not shown
    table = SAVED["01_ceiling_gap"]
    assert not {"label", "verdict", "why", "vs"} & set(table.columns)
    assert verdicts.check_answers(space["answers"].table()) == []


FAKE_SMI = """#!/bin/sh
case "$*" in *power.draw.instant*) echo 'Field "power.draw.instant" is not valid' >&2; exit 2;;
esac
echo "1755, 1980, 695.5, 700.00, 61"
"""


@pytest.mark.slow
def test_01_the_sustained_run_samples_nvidia_smi_and_saves_the_sustained_ceiling(
        tmp_path, monkeypatch):  # no instant power (driver < 530), clock held at the power limit
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    burst = pd.DataFrame([("matmul", "bf16", "burst", 800.0, "TFLOP/s", "x", "GPU")],
                         columns=["ceiling", "dtype", "run", "value", "unit", "problem", "device"])
    products = itertools.count()  # the rate falls after 50 products
    space = base(NB01, device=torch.device("cpu"), n=8, k=5, burst=20,
                 machine=types.SimpleNamespace(missing=lambda **_: ""),  # a GPU, as it were
                 profile=types.SimpleNamespace(pick=lambda smoke, full: full), sustained_s=0.6,
                 per_round={"back to back": [2.0] * 5},
                 matmul=lambda: time.sleep(0.002 if next(products) < 50 else 0.003),
                 matmul_tflop=1.0, ceiling_tflops=800.0, ceiling_key="bf16",
                 ceiling={"device": "GPU"}, ceiling_table=burst)
    printed = run(NB01, ["3f9c2a10", "4b0d3e21", "5c1e4f32", "6d2f5a43", "8f4b7c65",
                         "bc7e0f98", "9a5c8d76"], space)
    assert "nvidia-smi answers: sampling clocks.sm, clocks.max.sm, power.draw," in printed
    assert len(space["readings"]) >= 6
    clock = said(space)["SM clock, second half of the run"]
    assert (clock["effect"], clock["verdict"]) == ("11% lower", "lower")  # 1755 of 1980 MHz
    assert said(space)["power draw, second half of the run"]["verdict"] == "same"
    assert SAVED["01_sustained_run"]["sm_clock_mhz"].dropna().eq(1755).all()
    ceiling_rows = SAVED["01_ceilings"].set_index("run")
    assert list(ceiling_rows.index) == ["burst", "sustained"]
    assert ceiling_rows.loc["sustained", "value"] == space["sustained"] > 0
    assert "power capping" in printed  # the clock held below its maximum at the power limit


# ------------------------------------------------------------------ the smoke runs' answers
@pytest.mark.notebook
@pytest.mark.smoke("01", "02")
def test_smoke_runs_save_every_question_with_a_readable_answer(smoke_run):
    out, _ = smoke_run
    for number, questions in (("01", 8), ("02", 7)):
        table = pd.read_csv(out / "results" / f"{number}_answers.csv")
        assert verdicts.check_answers(table) == []
        assert table["question"].nunique() == questions, number
    ceiling = pd.read_csv(out / "results" / "01_ceilings.csv")
    assert (ceiling["run"] == "sustained").sum() == 1
    apex = pd.read_csv(out / "results" / "02_answers.csv").query("feature == 'FusedAdam'")
    assert len(apex) == 3  # Apex's rows are there on a machine without Apex too
