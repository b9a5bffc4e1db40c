"""A new chapter (notebook, chapter module, tests) in a clone needs no list edited anywhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from coursetools.runner import course_notebooks

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "demo_sums"
NUMBER = f"{len(course_notebooks()) + 1:02d}"  # the next chapter's number
GIT = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}  # no user's settings
CHAPTER_MODULE = f'''"""Notebook {NUMBER} (a throwaway chapter): two ways to sum a tensor."""

import pandas as pd


def sums(x):
    return pd.DataFrame({{"value": [float(x.sum()), float(x.cumsum(0)[-1])]}})
'''
CHAPTER_TESTS = f'''import pytest
import torch

from helpers.chapters import {TOPIC}


def test_both_sums_agree():
    assert {TOPIC}.sums(torch.arange(10.0))["value"].tolist() == [45.0, 45.0]


@pytest.mark.smoke("{NUMBER}")
def test_the_smoke_run_saved_the_sums(smoke_run):
    assert (smoke_run[0] / "results" / "{NUMBER}_sums.csv").exists()
'''


def _notebook() -> nbformat.NotebookNode:  # the course's shape, a table NN_sums saved
    first = nbformat.read(ROOT / "notebooks" / "01_environment_and_apex_build.ipynb", as_version=4)
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    cells = [md(f"# {NUMBER} - Two ways to sum\n\nA throwaway chapter: what it measures."),
             code('profile = "auto"  # "auto", "smoke" or "full"\nsize = 1000  # elements summed'),
             code(first.cells[2].source),  # the setup cell
             code("import torch\n\nfrom helpers import environment, errors, results\nfrom helpers."
                  f"chapters import {TOPIC} as chapter\nfrom helpers.run_profile import resolve"),
             code('errors.check_parameters(globals(), {"profile": str, "size": int})\nprofile = '
                  "resolve(profile)\nprint(profile.describe())\nenv = environment.print_report()"),
             code("table = chapter.sums(torch.arange(size, dtype=torch.float64))\n"
                  f'results.save_table(table, "{NUMBER}_sums", env=env)\ntable'),
             md("Both methods give the same sum: the table reads it.")]
    cells[1].metadata["tags"] = ["parameters"]
    for index, cell in enumerate(cells):
        cell.id = f"new-chapter-{index}"
    return nbformat.v4.new_notebook(cells=cells, metadata=first.metadata)


def _run(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 300):
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"} | GIT | (env or {})
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{args[:6]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    return proc


@pytest.mark.slow
@pytest.mark.notebook
def test_a_new_chapter_needs_no_list_edited(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of the course")
    _run(["git", "clone", "-q", str(ROOT), str(clone := tmp_path / "course")], ROOT)
    changed = _run(["sh", "-c", "git diff --name-only HEAD; git ls-files -o --exclude-standard"],
                   ROOT).stdout.split()
    for name in changed:  # the working tree's state, so that an edit is tested
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
        else:
            (clone / name).unlink(missing_ok=True)
    name = f"{NUMBER}_{TOPIC}.ipynb"
    nbformat.write(_notebook(), clone / "notebooks" / name)
    (clone / "helpers" / "chapters" / f"{TOPIC}.py").write_text(CHAPTER_MODULE)
    (clone / "tests" / f"test_{TOPIC}.py").write_text(CHAPTER_TESTS)
    _run(["git", "add", "-A"], clone)
    _run(["git", "-c", "user.name=C", "-c", "user.email=c@x", "commit", "-qm", "new"], clone)
    # the clone's tests that must pick the new chapter up by themselves, its smoke run alone
    env = {"PYTHONPATH": str(clone), "COURSE_TEST_NOTEBOOKS": NUMBER, "COURSE_PROFILE": "smoke"}
    wanted = [f"tests/test_{file}.py::test_{test}" for file, test in (
        ("notebooks", f"notebook_runs_and_saves_its_tables[{name[:-6]}]"),
        ("hygiene", f"notebook_is_stripped_and_valid[{name}]"), ("hygiene", "ruff_is_clean"),
        ("hygiene", "contributing_layout_lists_every_helper_module_and_no_other"),
        ("hygiene", "each_chapter_module_belongs_to_one_notebook"),
        ("hygiene", "the_core_never_imports_a_chapter_and_no_chapter_another"),
        ("notebooks", "the_notebooks_are_numbered_in_order_from_01"),
        ("standalone", "every_notebook_has_the_setup_cell_after_its_parameters"),
        (TOPIC, "both_sums_agree"), (TOPIC, "the_smoke_run_saved_the_sums"))]
    proc = _run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:xdist",
                 "--basetemp", str(tmp_path / "pytest"), *wanted], clone, env=env, timeout=600)
    passed = {line.split(" PASSED")[0] for line in proc.stdout.splitlines() if " PASSED" in line}
    assert not set(wanted) - passed, f"did not pass in the clone:\n{proc.stdout[-3000:]}"
    # a learner's experiment that fails: a few lines name the cell and the way back, and the
    # tests that read the notebook's smoke run skip instead of failing after it
    nb = nbformat.read(path := clone / "notebooks" / name, as_version=4)
    nb.cells[5].source += "\n1 / 0"
    nbformat.write(nb, path)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "--basetemp", str(tmp_path / "pytest"), wanted[0],
                           wanted[-1]],
                          cwd=clone, capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"} | env)
    said = proc.stdout.strip().splitlines()
    assert proc.returncode == 1 and len(said) <= 15, proc.stdout  # not 450
    assert said[-1].startswith("1 failed, 1 skipped"), proc.stdout
    assert "ZeroDivisionError: division by zero (cell 6: 'table = chapter.sums(" in proc.stdout
    assert f"get it back with 'git checkout -- notebooks/{name}'" in proc.stdout
