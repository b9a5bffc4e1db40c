"""Faults injected on purpose: one sentence with the fix, the right exit code, nothing lost."""

import errno
import fcntl
import importlib.metadata as md
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook

from coursetools import runner
from helpers import environment, errors, machine, results

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_results_dir(monkeypatch):
    # the runner refuses COURSE_RESULTS_DIR, which tests/conftest.py sets for every test
    monkeypatch.delenv("COURSE_RESULTS_DIR", raising=False)


def _notebook(path: Path, *sources: str) -> Path:
    nbformat.write(new_notebook(cells=[new_code_cell(s) for s in sources]), path)
    return path


def _previous_run(out: Path) -> Path:
    """An earlier complete run: ``out`` a link to its folder, an executed notebook, a table."""
    (out.with_name(f"{out.name}-1") / "results").mkdir(parents=True)
    out.symlink_to(f"{out.name}-1")
    (out / "old.ipynb").write_text("{}")
    (out / "results" / "old_table.csv").write_text("a\n1\n")
    return out


def _intact(out: Path) -> bool:
    return ((out / "old.ipynb").read_text() == "{}"
            and (out / "results" / "old_table.csv").read_text() == "a\n1\n")


def _visible(folder: Path) -> list[str]:  # what is there besides the notebooks and the lock
    return sorted(p.name for p in folder.iterdir() if p.suffix != ".ipynb" and p.name[0] != ".")


def _full(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _fake_execute(outcomes: dict[str, str], monkeypatch) -> None:
    """execute without kernels: each notebook's copy and a table, ok or failing as told."""
    def execute(path, out_dir, **_kw):
        if path.name not in outcomes:  # Ctrl-C before it ends
            raise KeyboardInterrupt
        (out_dir / "results").mkdir(parents=True, exist_ok=True)
        (out_dir / path.name).write_text(f"executed {path.name}")
        (out_dir / "results" / f"{path.stem}.csv").write_text("a\n1\n")
        error = outcomes[path.name]
        return runner.NotebookRun(path.name, 0.1, "FAILED" if error else "ok",
                                  out_dir / path.name, error)
    monkeypatch.setattr(runner, "execute", execute)


@pytest.mark.parametrize("args, env, said", [
    (["--profile", "bogus"], {}, "unknown profile 'bogus'"),
    (["--profile", "full"], {}, "the 'full' profile needs a CUDA GPU"),  # none here, nor in CI
    (["--profile", "Smoke", "--check"], {}, None),  # checks only, names are case-insensitive
    (["--check"], {"COURSE_RESULTS_DIR": "/tmp/elsewhere"}, "COURSE_RESULTS_DIR=/tmp/elsewhere "
     "is set, but a run keeps its tables beside its notebooks, in <out>/results: unset it"),
    (["--check"], {"COURSE_PROFLE": "full"}, "COURSE_PROFLE is not a course setting (did you "
     "mean COURSE_PROFILE?)"),
])
def test_a_profile_or_setting_that_cannot_run_is_refused_before_any_notebook(
        tmp_path, monkeypatch, capsys, args, env, said):
    for name, value in {**env, "COURSE_SOMETHING_NEW": "1"}.items():  # not close: left alone
        monkeypatch.setenv(name, value)
    out = _previous_run(tmp_path / "run")
    nb = _notebook(tmp_path / "a.ipynb", "raise SystemExit('must not run')")
    assert runner.main([str(nb), "--out", str(out), *args]) == (2 if said else 0)
    captured = capsys.readouterr()
    assert captured.err.startswith(f"runner: error: {said}" if said else "")
    assert captured.err.count("\n") == bool(said) and captured.out == ""  # no banner
    assert _intact(out) and _visible(tmp_path) == ["run", "run-1"]


def test_an_output_folder_that_cannot_be_written_is_named_first(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    nb = _notebook(tmp_path / "a.ipynb", "print('ran')")
    assert runner.main([str(nb), "--out", str(blocker / "run"), "--profile", "smoke"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"runner: error: cannot write the run's output to {blocker / 'run'}")
    assert str(blocker) in err and "--out" in err and err.count("\n") == 1


def test_a_second_run_into_the_same_folder_is_refused(tmp_path, capsys):
    out = _previous_run(tmp_path / "run")
    nb = _notebook(tmp_path / "a.ipynb", "raise SystemExit('must not run')")
    with open(tmp_path / ".run.lock", "a") as first:  # the first run holds it
        fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for check in ([], ["--check"]):
            assert runner.main([str(nb), "--out", str(out), "--profile", "smoke", *check]) == 2
            assert capsys.readouterr().err == (
                f"runner: error: another run is writing to {out} now: wait for it to end, or "
                "choose another folder with --out (make run OUT=...)\n")
    assert _intact(out) and _visible(tmp_path) == ["run", "run-1"]


def test_only_a_complete_run_replaces_the_last_complete_one(tmp_path, monkeypatch, capsys):
    """A complete run becomes <out>, older ones go; an incomplete one stays beside (newest only)."""
    a, b = _notebook(tmp_path / "a.ipynb", "1"), _notebook(tmp_path / "b.ipynb", "2")
    runs = tmp_path / "runs"
    out = runs / "run"

    def run(**outcomes):
        _fake_execute({f"{k}.ipynb": v for k, v in outcomes.items()}, monkeypatch)
        code = runner.main([str(a), str(b), "--out", str(out), "--profile", "smoke"])
        return code, capsys.readouterr().out.splitlines()[-1]

    assert run(a="ValueError: planted", b="") == (
        1, f"this run is incomplete (a.ipynb FAILED): it is in {runs / 'run-1'}; there is "
        f"no complete run in {out} yet")
    assert not out.exists() and (runs / "run-1" / "summary.json").exists()
    assert run(a="", b="") == (0, f"executed notebooks and results: {out}")
    assert out.resolve() == runs / "run-2" and _visible(runs) == ["run", "run-2"]  # run-1 went
    assert json.loads((out / "summary.json").read_text())["notebooks"]["a.ipynb"]["ok"]
    assert run(a="ValueError: planted", b="")[0] == 1
    assert run(a="") == (130, f"this run is incomplete (b.ipynb interrupted): it is in "
                              f"{runs / 'run-4'}; {out} still holds the last complete run")
    assert out.resolve() == runs / "run-2" and _visible(runs) == ["run", "run-2", "run-4"]
    out.unlink()  # a run from before runs had folders: <out> itself a folder
    (runs / "run-2").rename(out)
    assert run(a="", b="")[0] == 0 and _visible(runs) == ["run", "run-5"]


@pytest.mark.slow
def test_ctrl_c_ends_with_130_a_line_and_the_executed_copy(tmp_path):
    started = tmp_path / "sleeping"  # the kernel has reached the second cell
    nb = _notebook(tmp_path / "slow.ipynb", "print('first cell ran')",
                   f"import time\nopen({str(started)!r}, 'w').close()\nfor _ in range(600):\n"
                   "    time.sleep(0.1)")
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "coursetools.runner", str(nb), "--out",
                             str(out), "--profile", "smoke"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            # a suite started in the background inherits SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not started.exists():
        time.sleep(0.1)
    if not started.exists():
        proc.kill()
        pytest.fail(f"the kernel did not reach the sleeping cell: {proc.communicate()}")
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in stderr + stdout, (stdout, stderr)
    assert any(x.startswith("slow.ipynb") and "interrupted" in x for x in stdout.splitlines())
    executed = nbformat.read(tmp_path / "run-1" / "slow.ipynb", as_version=4)
    assert "first cell ran" in executed.cells[0].outputs[0]["text"]
    assert f"this run is incomplete (slow.ipynb interrupted): it is in {out}-1" in stdout


def test_the_unrelated_pypi_apex_is_named(monkeypatch, capsys):
    monkeypatch.setattr(md, "packages_distributions", lambda: {"apex": ["apex"]})
    monkeypatch.setattr(md, "metadata", lambda name: {"Name": "apex", "Version": "0.9.10dev"})
    header = environment.format_report(environment.environment_report())
    assert "the unrelated apex 0.9.10dev from PyPI is installed" in header
    assert "pip uninstall apex" in header
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(machine, "apex_extension_status", lambda: {"amp_C": False})
    assert machine.needs(cuda=True, apex=("amp_C",)) is False
    line = capsys.readouterr().out
    assert "unrelated apex 0.9.10dev from PyPI" in line and "pip uninstall apex" in line
    assert "build_apex.sh" in line and line.count("\n") == 1


def test_a_corrupt_notebook_is_named_and_the_run_goes_on(tmp_path, capsys):
    """Cut short (not JSON): one sentence with the fix, the next still runs; --param: refused."""
    cut = _notebook(tmp_path / "01_cut.ipynb", "print('x')")
    cut.write_bytes(cut.read_bytes()[:40])
    good = _notebook(tmp_path / "02_good.ipynb", "print('ran after the cut one')")
    out = tmp_path / "run"
    assert runner.main([str(cut), str(good), "--out", str(out), "--profile", "smoke"]) == 1
    out_, err = capsys.readouterr()
    table = {x.split()[0]: x.split()[3] for x in out_.splitlines() if x.startswith(("01", "02"))}
    assert table == {"01_cut.ipynb": "FAILED", "02_good.ipynb": "ok"} and "Traceback" not in err
    [said] = [line for line in err.splitlines() if "01_cut.ipynb" in line]
    assert said.startswith(f"FAILED 01_cut.ipynb: {cut} is not a readable notebook (not JSON:")
    assert f"restore it with 'git checkout -- {cut}'" in said and "git diff" in said
    executed = nbformat.read(tmp_path / "run-1" / "02_good.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"] == "ran after the cut one\n"
    assert runner.main([str(cut), str(good), "--out", str(out), "--param", "x=1"]) == 2
    assert capsys.readouterr().err.startswith(f"runner: error: {cut} is not a readable notebook")


def test_a_full_disk_during_a_run_removes_it_and_keeps_the_last_complete_one(tmp_path,
                                                                           monkeypatch, capsys):
    """The run stops, its folder goes, the last complete one stays; one sentence with the room."""
    out = _previous_run(tmp_path / "run")
    a, b, c = (_notebook(tmp_path / f"{n}.ipynb", "1") for n in "abc")
    error = str(results.DiskFull(tmp_path / "run-2" / "results" / "t.csv"))
    _fake_execute({"a.ipynb": "", "b.ipynb": f"CourseError: {error}"}, monkeypatch)
    assert runner.main([str(a), str(b), str(c), "--out", str(out), "--profile", "smoke"]) == 1
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"runner: error: the disk holding {tmp_path} has ")
    assert "a run needs about 0.1 MB (the last run's size)" in err[0] and "--out" in err[0]
    assert err[0].endswith(f"this run was removed and {out} still holds the last complete run")
    assert "b.ipynb" in captured.out and "c.ipynb" not in captured.out  # stopped there
    assert _intact(out) and _visible(tmp_path) == ["run", "run-1"]


@pytest.mark.parametrize("write", ["the executed copy", "the summary"])
def test_a_full_disk_on_the_runners_own_write_is_one_sentence_too(tmp_path, monkeypatch,
                                                                 capsys, write):
    out = tmp_path / "run"
    a, b = _notebook(tmp_path / "a.ipynb", "1"), _notebook(tmp_path / "b.ipynb", "2")
    if write == "the summary":
        _fake_execute({"a.ipynb": "", "b.ipynb": ""}, monkeypatch)
        monkeypatch.setattr(runner, "write_summary", _full)
    else:
        monkeypatch.setattr(runner.papermill, "execute_notebook", _full)
    assert runner.main([str(a), str(b), "--out", str(out), "--profile", "smoke"]) == 1
    stdout, err = capsys.readouterr()
    assert err.count("\n") == 1 and "is full" in err and "Traceback" not in err
    assert err.endswith(f"this run was removed and there is no complete run in {out} yet\n")
    assert _visible(tmp_path) == []
    if write == "the executed copy":  # a's copy failed: the run stopped there
        [line] = [x for x in stdout.splitlines() if x.startswith(("a.ipynb", "b.ipynb"))]
        assert line.startswith("a.ipynb") and results.NO_SPACE in line and "(writing " in line


def test_a_run_that_would_not_fit_is_refused_before_it_starts(tmp_path, monkeypatch, capsys):
    out = _previous_run(tmp_path / "run")
    (out / "big.bin").write_bytes(b"x" * 3_000_000)
    real = runner.shutil.disk_usage
    monkeypatch.setattr(runner.shutil, "disk_usage", lambda p: real(p)._replace(free=1_000_000))
    nb = _notebook(tmp_path / "a.ipynb", "raise SystemExit('must not run')")
    assert runner.main([str(nb), "--out", str(out), "--profile", "smoke", "--check"]) == 2
    err = capsys.readouterr().err
    assert err == (f"runner: error: the disk holding {tmp_path} has 1.0 MB free, and a run "
                   "needs about 3.0 MB (the last run's size): free space there, or choose a "
                   "folder on another disk with --out (make run OUT=...)\n")
    assert _intact(out)


def test_a_results_write_on_a_full_disk_is_one_sentence_and_leaves_no_temporary(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(results.os, "replace", _full)
    with pytest.raises(results.DiskFull) as info:
        results.atomic_write_text(tmp_path / "t.csv", "a\n1\n")
    assert str(info.value) == (f"No space left on device to write {tmp_path / 't.csv'}: free "
                               f"space in {tmp_path}, or set COURSE_RESULTS_DIR to a folder "
                               "with room, and run again.")
    assert isinstance(info.value, OSError) and results.no_space(info.value)
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_results_folder_stops_a_notebook_at_its_header(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(blocker / "results"))
    with pytest.raises(errors.CourseError, match=f"Cannot write results to {blocker}") as info:
        environment.print_report({})  # the header, before the notebook's work
    assert "COURSE_RESULTS_DIR" in str(info.value)


def test_the_runner_under_a_python_without_the_course_packages_says_which_python():
    hide = ("import runpy, sys\n"
            "sys.modules['nbformat'] = sys.modules['papermill'] = None  # not importable\n"
            "runpy.run_module('coursetools.runner', run_name='__main__', alter_sys=True)\n")
    proc = subprocess.run([sys.executable, "-c", hide, "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (f"runner: error: this Python ({sys.executable}) has no nbformat: run "
                           "the notebooks with 'make run', or with the course's Python: "
                           ".venv/bin/python -m coursetools.runner\n")
