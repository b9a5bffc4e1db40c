"""The headless runner: executed copies are written even on failure and the failing cell named."""

from __future__ import annotations

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
