"""The headless runner: parameters checked by the notebooks' own rules first, failures named."""

from __future__ import annotations

import json
import os
import stat
import time

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from coursetools import runner
from helpers import errors

RULES = '{"steps": ("int >= 1", None), "lr": "float > 0", "amp_dtype": ("auto", "bf16", "fp16")}'


@pytest.fixture(autouse=True)
def _no_results_dir(monkeypatch):  # the runner refuses it; tests/conftest.py sets it
    monkeypatch.delenv("COURSE_RESULTS_DIR", raising=False)


def _notebook(path, *sources, parameters=None):  # code cells, the parameters cell first
    cells = [new_code_cell(s) for s in sources]
    if parameters is not None:
        cells.insert(0, new_code_cell(parameters, metadata={"tags": ["parameters"]}))
    nbformat.write(new_notebook(cells=cells), path)
    return path


def test_a_run_names_the_failing_cell_as_a_reader_counts_it(tmp_path, capsys):
    good = _notebook(tmp_path / "good.ipynb", "1")
    cells = [new_markdown_cell("# Bad"), *map(new_code_cell, ("x = 1", "x\n1 / 0", "never"))]
    nbformat.write(new_notebook(cells=cells), bad := tmp_path / "bad.ipynb")
    out = tmp_path / "out"
    assert runner.main([str(good), str(bad), "--out", str(out), "--profile", "smoke"]) == 1
    folder = tmp_path / "out-1"  # a failed run never takes the place of out
    failed = nbformat.read(folder / "bad.ipynb", as_version=4)  # written although it failed
    assert any(o["output_type"] == "error" for c in failed.cells for o in c.get("outputs", []))
    err = capsys.readouterr().err
    assert "FAILED bad.ipynb: ZeroDivisionError: division by zero (cell 3: 'x')" in err  # ruff's
    record = json.loads((folder / "summary.json").read_text())["notebooks"]
    assert [v["status"] for v in record.values()] == ["ok", "FAILED"] and not out.exists()


def test_a_notebook_past_its_time_limit_is_stopped_and_written(tmp_path):
    slow = _notebook(tmp_path / "slow.ipynb", "import time", "time.sleep(30)", "print('never')")
    start = time.perf_counter()
    run = runner.execute(slow, tmp_path / "out", profile="smoke", notebook_timeout=4)
    assert not run.ok and "Timeout" in run.error and run.output.exists()
    assert time.perf_counter() - start < 25


def test_param_is_injected_where_a_notebook_defines_it(tmp_path):
    takes = _notebook(tmp_path / "takes.ipynb", "print(f'{amp_dtype} {steps} {widths!r}')",
                      parameters='amp_dtype = "auto"\nsteps = 3\nwidths = (1,)')
    other = _notebook(tmp_path / "other.ipynb", "import os; print(os.environ['COURSE_PROFILE'])")
    out = tmp_path / "out"
    assert runner.main([str(takes), str(other), "--out", str(out), "--param", "amp_dtype=fp16",
                        "--param", "steps=7", "--param", "widths=(64, 128)",
                        "--param", "profile=Smoke"]) == 0
    assert out.is_symlink() and out.resolve() == tmp_path / "out-1"
    assert nbformat.read(out / "takes.ipynb", as_version=4).cells[-1].outputs[0]["text"] == (
        "fp16 7 [64, 128]\n")  # a tuple reaches the kernel as a list
    assert nbformat.read(out / "other.ipynb", as_version=4).cells[0].outputs[0]["text"] == (
        "smoke\n")  # --param profile=... is the run's profile


STEPS = ("int >= 1", None)


@pytest.mark.parametrize("value, rule, said", [
    (3, STEPS, ""), (None, STEPS, ""), (2, "float > 0", ""), (-3, STEPS, "int >= 1 or None"),
    (3.0, STEPS, "int >= 1 or None"), (True, STEPS, "int >= 1 or None"),
    (0.0, "float > 0", "float > 0"), ("fp64", ("auto", "bf16"), "'auto' or 'bf16'")])
def test_a_rule_is_a_type_a_range_or_a_choice(value, rule, said):
    assert errors.parameter_problem(value, rule) == said


def test_a_param_outside_its_rule_is_refused_before_any_notebook_runs(tmp_path, capsys):
    first = _notebook(tmp_path / "01_first.ipynb", "print('ran')")
    takes = _notebook(tmp_path / "05_takes.ipynb", "from helpers import errors",
                      f"errors.check_parameters(globals(), {RULES})",
                      parameters='steps = None\nlr = 1e-3\namp_dtype = "auto"')
    out = tmp_path / "out"
    refused = {"steps=-3": "steps must be int >= 1 or None (notebook 05), not int -3",
               "amp_dtype=fp64": "amp_dtype must be 'auto' or 'bf16' or 'fp16' (notebook 05), "
                                 "not str 'fp64'",
               "stepz=3": "no notebook here has a parameter 'stepz'",
               "steps3": "--param 'steps3' is not NAME=VALUE"}
    for item, said in refused.items():
        assert runner.main([str(first), str(takes), "--out", str(out), "--param", item,
                            "--check"]) == 2
        out_, err = capsys.readouterr()
        assert said in err and err.count("\n") == 1 and out_ == "" and not out.exists(), err
    for item in ("steps=None", "lr=3", "amp_dtype=bf16"):
        assert runner.main([str(takes), "--out", str(out), "--param", item, "--check"]) == 0


def test_the_course_notebooks_state_a_rule_for_every_parameter():
    for path in (paths := runner.course_notebooks()):
        names, rules = runner.parameters(nbformat.read(path, as_version=4))
        assert names and names == set(rules), path.name
    with pytest.raises(errors.CourseError, match=r"steps must be .* \(notebooks 05, 06, 07, 08\), "
                                                 r"not bool True"):
        runner.check_params(paths, {"steps": True})
    runner.check_params(paths, {"steps": 40, "lr": 3e-4, "o3_eps": [1e-4], "widths": [64, 128],
                                "amp_dtype": "fp16", "idle_ms": 50, "batch_size": None})
    nb = nbformat.read(paths[3], as_version=4)  # edited in the lab: the notebook stops on it
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    exec(cell.source, namespace := {})
    with pytest.raises(errors.CourseError, match=r"^Parameter legacy_timeout_s = '300' must be "
                                                 r"float > 0: fix it in the parameters cell"):
        errors.check_parameters(namespace | {"legacy_timeout_s": "300"}, runner.parameters(nb)[1])


def test_the_gpu_memory_peak_is_nvidia_smis_largest_sample(tmp_path, monkeypatch):  # full only
    (fake := tmp_path / "bin" / "nvidia-smi").parent.mkdir()
    fake.write_text("#!/bin/sh\nprintf '1024\\n4608\\n2048\\n'\nexec sleep 60\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    run = runner.execute(_notebook(tmp_path / "a.ipynb", "1"), tmp_path / "out", profile="full")
    assert run.ok and run.peak_gpu_gib == 4.5
    assert runner.execute(run.output, tmp_path / "o", profile="smoke").peak_gpu_gib is None
