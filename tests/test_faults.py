"""Faults injected on purpose: each ends in one sentence with the fix, the right exit code, and
nothing of an earlier run lost or mixed into the new one."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from coursetools import report, runner
from helpers import machine, results

ROOT = Path(__file__).resolve().parent.parent


def _notebook(path: Path, *sources: str) -> Path:
    nbformat.write(new_notebook(cells=[new_code_cell(s) for s in sources]), path)
    return path


def _previous_run(out: Path) -> Path:
    """An earlier run's output: an executed notebook and a table."""
    (out / "results").mkdir(parents=True)
    (out / "old.ipynb").write_text("{}")
    (out / "results" / "old_table.csv").write_text("a\n1\n")
    return out


def _intact(out: Path) -> bool:
    return ((out / "old.ipynb").read_text() == "{}"
            and (out / "results" / "old_table.csv").read_text() == "a\n1\n")


@pytest.mark.parametrize("profile, message", [
    ("bogus", "unknown profile 'bogus'"),
    ("full", "the 'full' profile needs a CUDA GPU"),  # this machine (and CI) has none
])
def test_a_profile_that_cannot_run_is_refused_before_any_notebook(tmp_path, capsys, profile,
                                                                  message):
    out = _previous_run(tmp_path / "run")
    nb = _notebook(tmp_path / "a.ipynb", "print('ran')")
    assert runner.main([str(nb), "--out", str(out), "--profile", profile]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"runner: error: {message}")
    assert captured.err.count("\n") == 1 and captured.out == ""  # no banner, no table
    assert _intact(out) and not (out / "a.ipynb").exists()


def test_profile_names_are_case_insensitive(tmp_path, capsys):
    nb = _notebook(tmp_path / "a.ipynb", "import os; print(os.environ['COURSE_PROFILE'])")
    assert runner.main([str(nb), "--out", str(tmp_path / "run"), "--profile", "Smoke"]) == 0
    executed = nbformat.read(tmp_path / "run" / "a.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"].strip() == "smoke"


def test_an_output_folder_that_cannot_be_written_is_named_first(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    nb = _notebook(tmp_path / "a.ipynb", "print('ran')")
    assert runner.main([str(nb), "--out", str(blocker / "run"), "--profile", "smoke"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"runner: error: cannot write the run's output to {blocker / 'run'}")
    assert "--out" in err and err.count("\n") == 1


def test_check_only_checks(tmp_path, capsys):
    out = _previous_run(tmp_path / "run")
    nb = _notebook(tmp_path / "a.ipynb", "raise SystemExit('must not run')")
    assert runner.main([str(nb), "--out", str(out), "--profile", "smoke", "--check"]) == 0
    assert _intact(out) and capsys.readouterr().out == ""


def test_a_run_replaces_the_previous_one_whole(tmp_path, capsys):
    out = _previous_run(tmp_path / "run")
    nb = _notebook(tmp_path / "new.ipynb",
                   "from helpers import results\n"
                   "import pandas as pd\n"
                   "results.save_table(pd.DataFrame({'b': [2]}), 'new_table')",
                   "raise ValueError('this run fails')")
    assert runner.main([str(nb), "--out", str(out), "--profile", "smoke"]) == 1
    assert sorted(p.name for p in out.iterdir()) == ["new.ipynb", "results", "runs.json"]
    assert sorted(p.name for p in (out / "results").iterdir()) == ["new_table.csv",
                                                                   "new_table.json"]
    assert _intact(out.with_name("run.previous"))  # the earlier run, kept whole beside it
    assert not out.with_name("run.partial").exists()


def test_ctrl_c_ends_with_130_a_table_and_the_partial_copy(tmp_path):
    nb = _notebook(tmp_path / "slow.ipynb", "print('first cell ran')",
                   "import time\nfor _ in range(600):\n    time.sleep(0.1)")
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "coursetools.runner", str(nb), "--out",
                             str(out), "--profile", "smoke"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    partial = out.with_name("run.partial")
    while time.monotonic() < deadline and not list(partial.glob("results")):
        time.sleep(0.2)
    time.sleep(6)  # the kernel starts and reaches the sleeping cell
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr and "Traceback" not in stdout
    assert any(line.startswith("slow.ipynb") and line.endswith("interrupted")
               for line in stdout.splitlines()), stdout  # the time table says so
    executed = nbformat.read(out / "slow.ipynb", as_version=4)
    assert "first cell ran" in executed.cells[0].outputs[0]["text"]


@pytest.mark.parametrize("content, problem", [
    (None, "cannot read it (FileNotFoundError"),
    ("{not json", "cannot read it (JSONDecodeError"),
    ("[1, 2]", "it holds no JSON object"),
    ('{"gpu_name": "x"}', "missing key"),
])
def test_readme_table_of_a_bad_summary_is_one_sentence(tmp_path, capsys, content, problem):
    path = tmp_path / "summary.json"
    if content is not None:
        path.write_text(content)
    assert report.main(["--readme-table", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"report: error: {path} is not a usable summary.json: {problem}")
    assert err.count("\n") == 1 and "make report" in err


def test_results_that_cannot_be_written_are_one_sentence(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(blocker / "results"))
    with pytest.raises(SystemExit) as info:
        results.results_dir()
    assert str(info.value).startswith(f"Cannot write results to {blocker / 'results'}")
    assert "COURSE_RESULTS_DIR" in str(info.value)


def test_the_unrelated_pypi_apex_is_named(monkeypatch, capsys):
    import importlib.metadata as md

    import torch

    monkeypatch.setattr(md, "packages_distributions", lambda: {"apex": ["apex"]})
    monkeypatch.setattr(md, "metadata", lambda name: {"Name": "apex", "Version": "0.9.10dev",
                                                      "Summary": "Pyramid toolkit",
                                                      "Author": "someone"})
    assert machine.wrong_apex() == "apex 0.9.10dev from PyPI"
    from helpers import environment

    header = environment.format_report(environment.environment_report())
    assert "the unrelated apex 0.9.10dev from PyPI is installed" in header
    assert "pip uninstall apex" in header
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(machine, "apex_extension_status", lambda: {"amp_C": False})
    assert machine.needs(cuda=True, apex=("amp_C",)) is False
    line = capsys.readouterr().out
    assert "unrelated apex 0.9.10dev from PyPI" in line and "pip uninstall apex" in line
    assert "build_apex.sh" in line and line.count("\n") == 1


def test_the_makefile_checks_before_its_banner():
    text = (ROOT / "Makefile").read_text()
    run = text.split("\nrun:", 1)[1].split("\ntest:", 1)[0]
    assert run.index("--check") < run.index("build_apex.sh") < run.index("no CUDA GPU here")
