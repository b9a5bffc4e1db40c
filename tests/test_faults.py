"""Faults injected on purpose: each ends in one sentence with the fix, the right exit code, and
nothing of an earlier run lost or mixed into the new one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from coursetools import report, runner
from helpers import errors, machine, results

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_results_dir(monkeypatch):
    """The runner refuses COURSE_RESULTS_DIR (a run keeps its tables beside its notebooks),
    which the suite sets for every test (tests/conftest.py)."""
    monkeypatch.delenv("COURSE_RESULTS_DIR", raising=False)


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


def test_a_failed_run_goes_whole_beside_the_last_complete_one(tmp_path, capsys):
    out = _previous_run(tmp_path / "run")
    nb = _notebook(tmp_path / "new.ipynb",
                   "from helpers import results\n"
                   "import pandas as pd\n"
                   "results.save_table(pd.DataFrame({'b': [2]}), 'new_table')",
                   "raise ValueError('this run fails')")
    assert runner.main([str(nb), "--out", str(out), "--profile", "smoke"]) == 1
    assert _intact(out) and not (out / "new.ipynb").exists()  # the last complete run stays
    incomplete = out.with_name("run.incomplete")  # this one, whole and unmixed, beside it
    assert sorted(p.name for p in incomplete.iterdir()) == ["new.ipynb", "results", "runs.json"]
    assert sorted(p.name for p in (incomplete / "results").iterdir()) == ["new_table.csv",
                                                                          "new_table.json"]
    assert not out.with_name("run.partial").exists()
    assert not out.with_name("run.previous").exists()
    captured = capsys.readouterr()
    assert (f"this run is incomplete (new.ipynb FAILED): it is in {incomplete}; {out} still "
            "holds the last complete run\n") in captured.out
    assert f"see {incomplete / 'new.ipynb'}" in captured.err


def _fake_run_all(outcomes: dict[str, bool], calls: list):
    """run_all without kernels: writes each notebook's copy and a table, as a run would."""
    def run_all(paths, staging, **_kw):
        calls.append(staging)
        (staging / "results").mkdir(parents=True)
        runs = []
        for path in paths:
            if path.name not in outcomes:  # the run stops before this one
                break
            (staging / path.name).write_text(f"executed {path.name}")
            (staging / "results" / f"{path.stem}.csv").write_text("a\n1\n")
            ok = outcomes[path.name]
            runs.append(runner.NotebookRun(path.name, 0.1, ok, staging / path.name,
                                           "" if ok else "ValueError: planted"))
        return runs
    return run_all


def test_only_a_complete_run_replaces_the_last_complete_one(tmp_path, monkeypatch, capsys):
    """Complete: replaces <out>, the one before kept as <out>.previous. Failed or interrupted,
    however often: <out>.incomplete (the newest only), <out> and <out>.previous untouched."""
    a, b = _notebook(tmp_path / "a.ipynb", "1"), _notebook(tmp_path / "b.ipynb", "2")
    out, calls = tmp_path / "run", []
    incomplete, previous = tmp_path / "run.incomplete", tmp_path / "run.previous"

    def run(outcomes, *paths):
        monkeypatch.setattr(runner, "run_all", _fake_run_all(outcomes, calls))
        code = runner.main([*map(str, paths), "--out", str(out), "--profile", "smoke"])
        return code, capsys.readouterr().out.splitlines()[-1]

    assert run({"a.ipynb": False, "b.ipynb": True}, a, b) == (
        1, f"this run is incomplete (a.ipynb FAILED): it is in {incomplete}; there is no "
        f"complete run in {out} yet")
    assert not out.exists() and (incomplete / "a.ipynb").exists()
    assert run({"a.ipynb": True, "b.ipynb": True}, a, b) == (
        0, f"executed notebooks and results: {out}")
    assert not incomplete.exists()  # an incomplete run older than <out> is not kept
    assert json.loads((out / "runs.json").read_text())["notebooks"][0]["status"] == "ok"
    (out / "mark").write_text("the last complete run")
    assert run({"a.ipynb": True}, a) == (
        0, f"executed notebooks and results: {out} (the run before it: {previous})")
    assert (previous / "mark").exists() and not (out / "mark").exists()
    (out / "mark").write_text("the last complete run")
    kept = sorted(p.name for p in previous.iterdir())
    for cut_short in (False, True):  # a failure, then a run that stops after its first notebook
        if cut_short:
            monkeypatch.setattr(runner, "run_all", _fake_run_all({"a.ipynb": True}, calls))
            runs = runner.run_into([a, b], out, profile="smoke")
            assert [r.output for r in runs] == [incomplete / "a.ipynb"]
            assert runner.where_line(out, runs, [a, b]).startswith(
                "this run is incomplete (1 of 2 not run): it is in")
        else:
            assert run({"a.ipynb": False, "b.ipynb": False}, a, b)[0] == 1
        assert (out / "mark").read_text() == "the last complete run"
        assert sorted(p.name for p in previous.iterdir()) == kept
        assert (incomplete / "a.ipynb").exists() and not out.with_name("run.partial").exists()
    assert not (incomplete / "b.ipynb").exists()  # the newest incomplete run only
    assert len(calls) == 5 and all(c == tmp_path / "run.partial" for c in calls)


def test_the_staging_swap_alone(tmp_path):
    """results.swap_in, the one swap the runner uses: an incomplete run goes to
    <out>.incomplete (out untouched, prepare told where); a complete one replaces out, whose
    run before is removed without keep_previous; the staging folder is gone either way."""
    out = _previous_run(tmp_path / "run")
    seen = []
    for complete, keep in ((False, True), (True, False)):
        staging = results.staging_dir(out)
        (staging / "results").mkdir(parents=True)
        (staging / "new.ipynb").write_text(f"complete={complete}")
        target = results.swap_in(staging, out, complete=complete, keep_previous=keep,
                                 prepare=seen.append)
        assert not staging.exists() and (target / "new.ipynb").exists()
        if not complete:
            assert target == results.incomplete_dir(out) == tmp_path / "run.incomplete"
            assert _intact(out)
    assert seen == [tmp_path / "run.incomplete", out] and target == out
    assert (out / "new.ipynb").read_text() == "complete=True" and not (out / "old.ipynb").exists()
    assert not results.previous_dir(out).exists() and not results.incomplete_dir(out).exists()
    assert results.staging_dir(out) == tmp_path / "run.partial"


def test_ctrl_c_between_notebooks_keeps_the_last_complete_run(tmp_path, monkeypatch, capsys):
    out = _previous_run(tmp_path / "run")
    nb = _notebook(tmp_path / "a.ipynb", "1")

    def interrupted(paths, staging, **_kw):
        (staging / "results").mkdir(parents=True)
        (staging / "a.ipynb").write_text("cut short")
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_all", interrupted)
    assert runner.main([str(nb), "--out", str(out), "--profile", "smoke"]) == 130
    assert _intact(out)
    assert (out.with_name("run.incomplete") / "a.ipynb").read_text() == "cut short"
    assert capsys.readouterr().err == (
        f"interrupted (Ctrl-C); this run is incomplete (interrupted between two notebooks): it "
        f"is in {out.with_name('run.incomplete')}; {out} still holds the last complete run\n")


@pytest.mark.slow
def test_ctrl_c_ends_with_130_a_table_and_the_partial_copy(tmp_path):
    started = tmp_path / "sleeping"  # the second cell writes it: the kernel has reached it
    nb = _notebook(tmp_path / "slow.ipynb", "print('first cell ran')",
                   f"import time\nopen({str(started)!r}, 'w').close()\nfor _ in range(600):\n"
                   "    time.sleep(0.1)")
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "coursetools.runner", str(nb), "--out",
                             str(out), "--profile", "smoke"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            # a suite started in the background inherits SIGINT ignored, and a
                            # Python that starts so never turns Ctrl-C into KeyboardInterrupt
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120  # a kernel starts in seconds, on a loaded machine slower
    partial = out.with_name("run.partial")
    while time.monotonic() < deadline and not (started.exists() and partial.is_dir()):
        time.sleep(0.1)
    if not started.exists():
        proc.kill()
        pytest.fail(f"the kernel did not reach the sleeping cell in 120 s: {proc.communicate()}")
    time.sleep(0.5)  # inside the sleeping loop
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr and "Traceback" not in stdout
    assert any(line.startswith("slow.ipynb") and line.endswith("interrupted")
               for line in stdout.splitlines()), stdout  # the time table says so
    executed = nbformat.read(out.with_name("run.incomplete") / "slow.ipynb", as_version=4)
    assert "first cell ran" in executed.cells[0].outputs[0]["text"]
    assert f"this run is incomplete (slow.ipynb interrupted): it is in {out}.incomplete" in stdout


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
    with pytest.raises(errors.CourseError) as info:
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


# ------------------------------------------------------------------ a notebook cut short
def _no_kernel(monkeypatch) -> None:
    """Executing a notebook starts no kernel: each code cell gets the output 'ran'."""
    def preprocess(_self, nb, resources):
        for cell in nb.cells:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
        return nb, resources

    monkeypatch.setattr(runner.ExecutePreprocessor, "preprocess", preprocess)


def test_a_corrupt_notebook_is_named_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    """A notebook cut short (not JSON): one sentence naming it with the fix, the next notebook
    still runs, the time table marks it FAILED, no traceback."""
    _no_kernel(monkeypatch)
    cut = _notebook(tmp_path / "01_cut.ipynb", "print('x')")
    cut.write_bytes(cut.read_bytes()[:40])
    good = _notebook(tmp_path / "02_good.ipynb", "print('ran after the cut one')")
    out = tmp_path / "run"
    assert runner.main([str(cut), str(good), "--out", str(out), "--profile", "smoke"]) == 1
    captured = capsys.readouterr()
    table = {line.split()[0]: line.split()[-1] for line in captured.out.splitlines()
             if line.startswith(("01_cut", "02_good"))}
    assert table == {"01_cut.ipynb": "FAILED", "02_good.ipynb": "ok"}, captured.out
    assert "Traceback" not in captured.out + captured.err
    said = [line for line in captured.err.splitlines() if "01_cut.ipynb" in line]
    assert len(said) == 1 and said[0].startswith(f"FAILED 01_cut.ipynb: {cut} is not a readable "
                                                 "notebook (not JSON:"), captured.err
    assert f"restore it with 'git checkout -- {cut}'" in said[0] and "git diff" in said[0]
    executed = nbformat.read(out.with_name("run.incomplete") / "02_good.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"] == "ran\n"
    assert not (out.with_name("run.incomplete") / "01_cut.ipynb").exists()


def test_the_checks_before_a_run_pass_over_a_corrupt_notebook(tmp_path):
    """--param's checks read the notebooks: a corrupt one is left to the run, which names it."""
    cut = tmp_path / "01_cut.ipynb"
    cut.write_text('{"cells": [')
    takes = _notebook(tmp_path / "02_takes.ipynb", "steps = 3")
    nb = nbformat.read(takes, as_version=4)
    nb.cells[0].metadata["tags"] = ["parameters"]
    nbformat.write(nb, takes)
    assert runner.params_problem([cut, takes], ["steps=4"]) == ""
    with pytest.raises(runner.UnreadableNotebook, match="01_cut.ipynb is not a readable"):
        runner.read_notebook(cut)


# ------------------------------------------------------------------ a full disk
def _no_space(*_args, **_kwargs):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_during_a_run_removes_it_and_keeps_the_last_complete_one(tmp_path,
                                                                           monkeypatch, capsys):
    """A notebook whose write finds the disk full: the run stops, the partial run is removed
    (no <out>.incomplete filling the disk further), the last complete run stays, and one
    sentence names the folder and the room a run needs."""
    out = _previous_run(tmp_path / "run")
    a, b = _notebook(tmp_path / "a.ipynb", "1"), _notebook(tmp_path / "b.ipynb", "2")
    calls = []

    def full(paths, staging, **_kw):
        calls.append(paths)
        runs = _fake_run_all({"a.ipynb": True}, [])(paths[:1], staging)
        error = str(results.DiskFull(staging / "results" / "t.csv"))
        return [*runs, runner.NotebookRun("b.ipynb", 0.1, False, staging / "b.ipynb",
                                          f"CourseError: {error}")]

    monkeypatch.setattr(runner, "run_all", full)
    assert runner.main([str(a), str(b), "--out", str(out), "--profile", "smoke"]) == 1
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"runner: error: the disk holding {tmp_path} has ")
    assert "a run needs about 0.1 MB (the last run's size)" in err[0] and "--out" in err[0]
    assert err[0].endswith(f"this run was removed and {out} still holds the last complete run")
    assert "b.ipynb" in captured.out and "total" in captured.out  # the time table
    assert _intact(out) and sorted(p.name for p in tmp_path.iterdir()) == ["a.ipynb", "b.ipynb",
                                                                          "run"]


def test_a_full_disk_on_the_runners_own_write_is_one_sentence_too(tmp_path, monkeypatch,
                                                                 capsys):
    out = tmp_path / "run"
    a = _notebook(tmp_path / "a.ipynb", "1")
    monkeypatch.setattr(runner, "run_all", _fake_run_all({"a.ipynb": True}, []))
    monkeypatch.setattr(runner, "write_runs", _no_space)
    assert runner.main([str(a), "--out", str(out), "--profile", "smoke"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is full" in err and "Traceback" not in err
    assert err.rstrip().endswith(f"this run was removed and there is no complete run in {out} "
                                 "yet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ipynb"]


def test_the_executed_copy_on_a_full_disk_stops_the_run(tmp_path, monkeypatch):
    """The runner's write of an executed copy finds the disk full: the notebook fails saying
    so, and run_all starts no notebook after it."""
    a, b = _notebook(tmp_path / "a.ipynb", "1"), _notebook(tmp_path / "b.ipynb", "2")
    _no_kernel(monkeypatch)
    monkeypatch.setattr(runner, "atomic_write_text", _no_space)
    runs = runner.run_all([a, b], tmp_path / "out", profile="smoke", timeout=60)
    assert [r.name for r in runs] == ["a.ipynb"] and not runs[0].ok
    assert runner.says_no_space(runs[0].error) and "executed copy" in runs[0].error


def test_a_run_that_would_not_fit_is_refused_before_it_starts(tmp_path, monkeypatch, capsys):
    import shutil

    out = _previous_run(tmp_path / "run")
    (out / "big.bin").write_bytes(b"x" * 3_000_000)
    real = shutil.disk_usage
    monkeypatch.setattr(runner.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=1_000_000))
    nb = _notebook(tmp_path / "a.ipynb", "raise SystemExit('must not run')")
    assert runner.main([str(nb), "--out", str(out), "--profile", "smoke", "--check"]) == 2
    err = capsys.readouterr().err
    assert err == (f"runner: error: the disk holding {tmp_path} has 1.0 MB free, and a run "
                   "needs about 3.0 MB (the last run's size): free space there, or choose a "
                   "folder on another disk with --out (make run OUT=...)\n")
    assert _intact(out)


def test_a_results_write_on_a_full_disk_is_one_sentence_and_leaves_no_temporary(tmp_path,
                                                                              monkeypatch):
    class Full:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        write = _no_space

    monkeypatch.setattr(results.os, "fdopen", lambda *_a, **_k: Full())
    with pytest.raises(results.DiskFull) as info:
        results.atomic_write_text(tmp_path / "t.csv", "a\n1\n")
    assert str(info.value) == (f"No space left on device to write {tmp_path / 't.csv'}: free "
                               f"space in {tmp_path}, or set COURSE_RESULTS_DIR to a folder "
                               "with room, and run again.")
    assert isinstance(info.value, OSError) and results.no_space(info.value)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ settings the runner refuses
@pytest.mark.parametrize("name, value, said", [
    ("COURSE_RESULTS_DIR", "/tmp/elsewhere", "COURSE_RESULTS_DIR=/tmp/elsewhere is set, but a "
     "run keeps its tables beside its notebooks, in <out>/results: unset it"),
    ("COURSE_PROFLE", "full", "COURSE_PROFLE is not a course setting (did you mean "
     "COURSE_PROFILE?)"),
])
def test_a_setting_the_runner_would_ignore_is_refused_first(tmp_path, monkeypatch, capsys, name,
                                                           value, said):
    monkeypatch.setenv(name, value)
    monkeypatch.setenv("COURSE_SOMETHING_NEW", "1")  # not close to a course setting: left alone
    nb = _notebook(tmp_path / "a.ipynb", "raise SystemExit('must not run')")
    assert runner.main([str(nb), "--out", str(tmp_path / "run"), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"runner: error: {said}") and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_an_unwritable_results_folder_stops_a_notebook_at_its_parameter_check(tmp_path,
                                                                              monkeypatch):
    """papermill (or a learner) sets COURSE_RESULTS_DIR: the notebook's first check, before
    its work, says the folder cannot be written."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(blocker / "results"))
    with pytest.raises(errors.CourseError, match=f"Cannot write results to {blocker}"):
        errors.check_parameters({"steps": 3}, {"steps": int})


def test_the_runner_under_a_python_without_the_course_packages_says_which_python():
    """``python3 -m coursetools.runner --help`` where nbformat is missing: one line naming
    the Python to use, no traceback."""
    hide = ("import importlib.abc, runpy, sys\n"
            "class Hide(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('nbformat', 'nbconvert'):\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Hide())\n"
            "sys.argv = ['runner', '--help']\n"
            "runpy.run_module('coursetools.runner', run_name='__main__', alter_sys=True)\n")
    proc = subprocess.run([sys.executable, "-c", hide], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (f"runner: error: this Python ({sys.executable}) has no nbformat: run "
                           "the notebooks with 'make run', or with the course's Python: "
                           ".venv/bin/python -m coursetools.runner\n")
