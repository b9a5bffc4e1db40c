"""The headless runner: executed copies are written even on failure and the failing cell named."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

import helpers
from coursetools import runner


def _notebook(path, *sources):
    nb = new_notebook(cells=[new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


def test_runner_executes_and_reports_failures(tmp_path, capsys):
    good = _notebook(tmp_path / "good.ipynb",
                     "import os, helpers\nprint(os.environ['COURSE_PROFILE'], helpers.__version__)")
    bad = _notebook(tmp_path / "bad.ipynb", "x = 1", "raise ValueError('planted failure')",
                    "print('never runs')")
    out = tmp_path / "out"
    code = runner.main([str(good), str(bad), "--out", str(out), "--profile", "smoke"])
    assert code == 1
    executed = nbformat.read(out / "good.ipynb", as_version=4)
    assert f"smoke {helpers.__version__}" in executed.cells[0].outputs[0]["text"]
    failed = nbformat.read(out / "bad.ipynb", as_version=4)  # written although it failed
    assert failed.cells[1].outputs[0]["output_type"] == "error"
    captured = capsys.readouterr()
    assert "ValueError: planted failure (cell 1" in captured.err
    assert "total" in captured.out and "FAILED" in captured.out


def test_runner_rejects_missing_notebook(tmp_path, capsys):
    assert runner.main([str(tmp_path / "nope.ipynb"), "--out", str(tmp_path)]) == 2
    assert "no such notebook" in capsys.readouterr().err


def test_notebook_timeout_stops_a_long_notebook(tmp_path, capsys):
    slow = _notebook(tmp_path / "slow.ipynb", "import time", "time.sleep(2)", "time.sleep(30)",
                     "print('never')")
    code = runner.main([str(slow), "--out", str(tmp_path / "out"), "--notebook-timeout", "5"])
    assert code == 1
    err = capsys.readouterr().err
    assert "FAILED slow.ipynb" in err and "Timeout" in err, err
    assert (tmp_path / "out" / "slow.ipynb").exists()


def test_param_is_injected_where_a_notebook_defines_it(tmp_path, capsys):
    """--param sets the value (papermill's injected cell after the parameters cell) in the
    notebooks that define the name and leaves the others alone."""
    takes = tmp_path / "takes.ipynb"
    nb = new_notebook(cells=[new_code_cell('amp_dtype = "auto"\nsteps = 3\nwidths = (1,)'),
                             new_code_cell("print(f'{amp_dtype} {steps} {widths!r}')")])
    nb.cells[0].metadata["tags"] = ["parameters"]
    nbformat.write(nb, takes)
    other = _notebook(tmp_path / "other.ipynb", "print('no parameters here')")
    out = tmp_path / "out"
    code = runner.main([str(takes), str(other), "--out", str(out), "--profile", "smoke",
                        "--param", "amp_dtype=fp16", "--param", "steps=7",
                        "--param", "widths=(64, 128)"])
    assert code == 0
    executed = nbformat.read(out / "takes.ipynb", as_version=4)
    assert executed.cells[1].metadata["tags"] == ["injected-parameters"]
    # a string, an int, and a tuple (as a list: papermill would write a tuple as its string)
    assert executed.cells[-1].outputs[0]["text"] == "fp16 7 [64, 128]\n"
    assert "(amp_dtype='fp16', steps=7, widths=[64, 128])" in capsys.readouterr().out
    untouched = nbformat.read(out / "other.ipynb", as_version=4)
    assert len(untouched.cells) == 1
    record = json.loads((out / "runs.json").read_text())  # the run's record beside it
    assert [(n["name"], n["status"], n["parameters"]) for n in record["notebooks"]] == [
        ("takes.ipynb", "ok", {"amp_dtype": "fp16", "steps": 7, "widths": [64, 128]}),
        ("other.ipynb", "ok", {})]


def test_param_no_notebook_defines_is_refused_before_any_run(tmp_path, capsys):
    nb = _notebook(tmp_path / "nb.ipynb", "print('ran')")
    code = runner.main([str(nb), "--out", str(tmp_path / "out"), "--param", "amp_dtyp=fp16"])
    assert code == 2
    err = capsys.readouterr().err
    assert "no notebook here has a parameter 'amp_dtyp'" in err
    assert not (tmp_path / "out").exists()
    assert runner.params_problem([nb], ["no-equals-sign"]).startswith("--param 'no-equals-sign'")
    # the profile is the run's own option (the report records it), never a --param
    assert runner.params_problem([nb], ["profile=smoke"]).startswith("--param profile=... is ref")


def test_gpu_sampler_reports_the_peak_of_its_window(monkeypatch):
    sampler = runner.GpuMemorySampler.__new__(runner.GpuMemorySampler)
    sampler.samples, sampler._proc = [(1.0, 30.0), (5.0, 2.0), (6.0, 4.5)], None
    monkeypatch.setattr(runner.time, "sleep", lambda _s: None)
    assert sampler.peak_gib(since=4.0) == 4.5  # the 30 GiB before the window does not count
    assert sampler.peak_gib(since=7.0) is None
    run = runner.NotebookRun("a.ipynb", 2.0, True, Path("a.ipynb"))
    assert "GPU GiB" not in runner.summary([run])  # no column where nothing was sampled
    run.peak_gpu_gib = 4.5
    assert "    4.5  ok" in runner.summary([run])
