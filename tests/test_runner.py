"""The headless runner: executed copies are written even on failure and the failing cell named."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

import helpers
from coursetools import runner


@pytest.fixture(autouse=True)
def _no_results_dir(monkeypatch):
    """The runner refuses COURSE_RESULTS_DIR (a run keeps its tables beside its notebooks),
    which the suite sets for every test (tests/conftest.py)."""
    monkeypatch.delenv("COURSE_RESULTS_DIR", raising=False)


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
    incomplete = tmp_path / "out.incomplete"  # a failed run never takes the place of out
    executed = nbformat.read(incomplete / "good.ipynb", as_version=4)
    assert f"smoke {helpers.__version__}" in executed.cells[0].outputs[0]["text"]
    failed = nbformat.read(incomplete / "bad.ipynb", as_version=4)  # written although it failed
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
    assert (tmp_path / "out.incomplete" / "slow.ipynb").exists()


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


def _takes(path: Path, cell: str, types: str) -> Path:
    """A notebook with a parameters cell and the check_parameters call the course's have."""
    nb = new_notebook(cells=[new_code_cell(cell), new_code_cell("from helpers import errors"),
                             new_code_cell(f"errors.check_parameters(globals(), {types})"),
                             new_code_cell("print('ran')")])
    nb.cells[0].metadata["tags"] = ["parameters"]
    nbformat.write(nb, path)
    return path


def test_a_wrong_typed_param_is_refused_before_any_notebook_runs(tmp_path, capsys):
    """The types come from each notebook's check_parameters call, read from its source: the
    refusal names the command-line setting, not the parameters cell, and nothing runs."""
    first = _notebook(tmp_path / "01_first.ipynb", "print('ran')")  # would run first
    takes = _takes(tmp_path / "05_takes.ipynb", "steps = None\nlr = 1e-3",
                   '{"steps": (int, type(None)), "lr": float}')
    out = tmp_path / "out"
    code = runner.main([str(first), str(takes), "--out", str(out), "--profile", "smoke",
                        "--param", "steps=True"])
    assert code == 2
    captured = capsys.readouterr()
    assert captured.err == (
        "runner: error: --param steps=True (make run PARAMS=...): notebook 05 expects steps to "
        "be int or None, got bool True; change it on the command line, or leave it out to keep "
        "the value of the parameters cell\n")
    assert captured.out == ""  # no notebook started
    assert not out.exists() and not (tmp_path / "out.partial").exists()
    assert not (tmp_path / "out.incomplete").exists()
    # --check (make run's first step, before its banner) refuses it too
    assert runner.main([str(takes), "--out", str(out), "--param", "lr=fast", "--check"]) == 2
    assert "--param lr=fast (make run PARAMS=...): notebook 05 expects lr to be float, got str " \
        "'fast'" in capsys.readouterr().err


def test_param_types_follow_check_parameters_rule(tmp_path):
    """An int passes for a float, a bool never for a number, None only where declared; a tuple
    is checked as the list papermill gives the kernel; every refusal is in one sentence."""
    nb = _takes(tmp_path / "04_t.ipynb", "eps = (1e-4,)\nn = 1\nx = 1.0\nflag = False\n"
                "pair = (1, 2)", '{"eps": (tuple, list, float), "n": int, "x": float, '
                '"flag": bool, "pair": tuple}')
    for ok in (["eps=(1e-3, 1e-2)"], ["eps=1e-3"], ["n=3"], ["x=3"], ["x=2.5"], ["flag=True"],
               ["n=3", "x=0.5", "flag=False"]):
        assert runner.params_problem([nb], ok) == "", ok
    refused = {"n=True": "expects n to be int, got bool True",
               "x=True": "expects x to be float, got bool True",
               "n=None": "expects n to be int, got NoneType None",
               "n=3.0": "expects n to be int, got float 3.0",
               "flag=1": "expects flag to be bool, got int 1",
               "eps=fast": "expects eps to be tuple or list or float, got str 'fast'",
               "pair=(1, 2)": "expects pair to be tuple, got list [1, 2] (papermill passes a "
                              "tuple as a list)"}
    for item, message in refused.items():
        problem = runner.params_problem([nb], [item])
        assert problem.startswith(f"--param {item} (make run PARAMS=...): notebook 04 {message}; "
                                  "change it on the command line"), problem
    both = runner.params_problem([nb], ["x=True", "n=3", "flag=1"])  # in the command's order
    assert both.index("--param x=True (make run") < both.index("; --param flag=1: notebook 04")
    assert both.endswith("change them on the command line, or leave them out to keep the "
                         "values of the parameters cells") and "n=3" not in both


def test_the_course_notebooks_declare_a_type_for_every_parameter():
    """The static reading finds each notebook's check_parameters types, for every name of its
    parameters cell, so a wrong --param never gets as far as a notebook."""
    paths = runner.course_notebooks()
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        assert runner.parameter_names(nb) <= set(runner.parameter_types(nb)), path.name
    problem = runner.params_problem(paths, ["steps=True"])
    assert problem.startswith("--param steps=True (make run PARAMS=...): notebooks 05, 06 and 07 "
                              "expect steps to be int or None, got bool True;"), problem
    assert runner.params_problem(paths, ["steps=40", "lr=3e-4", "o3_eps=(1e-4,)",
                                         "widths=(64, 128)", "amp_dtype=fp16", "idle_ms=50",
                                         "batch_size=None"]) == ""


def test_printed_paths_into_the_staging_folder_name_where_the_files_end_up(tmp_path):
    """A notebook that prints the path of a file it wrote under <out>.partial/results: once the
    run is moved, its executed copy names <out>/results instead (the file is there)."""
    import nbformat

    source = tmp_path / "01_prints.ipynb"
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell('profile = "auto"', metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("import os\nfrom pathlib import Path\n"
                                  "p = Path(os.environ['COURSE_RESULTS_DIR']) / '01_x.txt'\n"
                                  "p.parent.mkdir(parents=True, exist_ok=True)\n"
                                  "p.write_text('x')\nprint(f'wrote {p}')")])
    nbformat.write(nb, source)
    out = tmp_path / "run"
    runs = runner.run_into([source], out, profile="smoke", timeout=60)
    assert runs[0].ok, runs[0].error
    executed = nbformat.read(out / source.name, as_version=4)
    printed = executed.cells[1].outputs[0]["text"]
    assert printed.strip() == f"wrote {(out / 'results' / '01_x.txt').resolve()}"
    assert (out / "results" / "01_x.txt").exists() and ".partial" not in printed
