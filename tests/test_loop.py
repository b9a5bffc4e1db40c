"""The learner's loop in a clone: run a notebook in place, check, commit; `make lab`'s setup."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from jupyter_core.application import JupyterApp

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "notebooks/01_environment_and_apex_build.ipynb"  # the quickest in the smoke profile
LOOP_FILES = ("Makefile", ".gitattributes", "tests/test_hygiene.py")  # from the working tree
GIT_ISOLATED = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}  # no user's filter
LAB_VENV = Path(os.environ.get("COURSE_LAB_VENV") or ROOT / ".venv-lab")  # make lab's LAB_VENV
LAB_SCRIPT = ROOT / "scripts" / "lab.sh"


def _run(args, cwd: Path, **kwargs) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | GIT_ISOLATED
    env |= {f"GIT_{who}_{what}": value for who in ("AUTHOR", "COMMITTER")
            for what, value in (("NAME", "Learner"), ("EMAIL", "learner@example.org"))}
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True,
                          env=env | {"COURSE_PROFILE": "smoke"}, **kwargs)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _make(target: str, clone: Path) -> str:
    """`make TARGET` in the clone with this Python as the course's (its environment untouched)."""
    return _run(["make", "-s", target, f"ENSURE_RUN=echo {sys.executable}"], clone)


def _problems(text: str) -> list[str]:
    nb = nbformat.reads(text, as_version=4)
    return [f"cell {i} has " + ("outputs" if c.outputs else "an execution count")
            for i, c in enumerate(nb.cells) if c.cell_type == "code"
            and (c.outputs or c.execution_count is not None)]


def _hygiene(clone: Path):
    """The clone's own tests/test_hygiene.py: its checks read the clone."""
    spec = importlib.util.spec_from_file_location("clone_hygiene",
                                                  clone / "tests" / "test_hygiene.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def clone(tmp_path, monkeypatch):
    """A clone of the course's HEAD, with the working tree's loop files committed on top."""
    if not (shutil.which("git") and shutil.which("make") and (ROOT / ".git").exists()):
        pytest.skip("the loop needs git, make and a git checkout of the course")
    for name, value in GIT_ISOLATED.items():  # for the checks run in this process too
        monkeypatch.setenv(name, value)
    path = tmp_path / "course"
    _run(["git", "clone", "-q", str(ROOT), str(path)], ROOT)
    for name in LOOP_FILES:
        shutil.copy2(ROOT / name, path / name)
    _run(["git", "add", *LOOP_FILES], path)
    _run(["git", "commit", "-q", "--allow-empty", "-m", "the working tree's loop files"], path)
    # files a second older than git's index are not "racily clean" (one nbstripout run each)
    past = time.time() - 2
    for name in filter(None, _run(["git", "ls-files", "-z"], path).split("\0")):
        os.utime(path / name, (past, past))
    _run(["git", "update-index", "-q", "--refresh"], path)
    return path


@pytest.mark.notebook
@pytest.mark.smoke("01")
def test_run_save_test_commit_keeps_the_sources_clean(clone, smoke_run):
    nb_path, check = clone / NOTEBOOK, lambda: _hygiene(clone).notebook_problem(nb_path)
    committed = _run(["git", "show", f"HEAD:{NOTEBOOK}"], clone)
    assert _problems(committed) == []
    # saved with its outputs, as `make lab` does: the smoke run's, and its kernel's language_info
    ran = nbformat.read(smoke_run[0] / Path(NOTEBOOK).name, as_version=4)
    nb, ran_cells = nbformat.read(nb_path, as_version=4), {c.id: c for c in ran.cells}
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        done = ran_cells[cell.id]
        cell.outputs, cell.execution_count = done.outputs, done.execution_count
    nb.metadata["language_info"] = ran.metadata["language_info"]
    nbformat.write(nb, nb_path)
    dirty = _problems(nb_path.read_text())
    assert dirty
    assert check() == (f"{NOTEBOOK} {dirty[0]} and git's nbstripout filter, which keeps outputs "
                       "out of commits, is not set up in this clone: run `make filter`")
    _make("filter", clone)  # its sentence: test_env_start
    assert _make("filter", clone).strip() == "" and check() is None
    _run(["git", "diff", "--exit-code"], clone)
    # an edit, saved with outputs: git takes the edit without outputs or kernel metadata
    nb = nbformat.read(nb_path, as_version=4)
    next(c for c in nb.cells if c.cell_type == "markdown").source += "\n\nA learner's note."
    nbformat.write(nb, nb_path)
    _run(["git", "add", NOTEBOOK], clone)
    staged = _run(["git", "show", f":{NOTEBOOK}"], clone)
    assert _problems(staged) == [] and "A learner's note." in staged
    assert nbformat.reads(staged, as_version=4).metadata == \
        nbformat.reads(committed, as_version=4).metadata
    _run(["git", "commit", "-q", "-m", "a learner's note"], clone)
    assert _run(["git", "status", "--porcelain"], clone) == ""
    assert _problems(nb_path.read_text()) == dirty, "the working copy keeps its outputs"
    _hygiene(clone).test_notebook_is_stripped_and_valid(nb_path)  # `make test` passes there
    # staged with outputs (the filter bypassed): the sentence's command fixes it
    _run(["git", "-c", "filter.nbstripout.clean=cat", "add", "--renormalize", NOTEBOOK], clone)
    fix = f"make filter && git add --renormalize {NOTEBOOK}"
    assert check() == (f"In {NOTEBOOK} as staged for the next commit, {dirty[0]}: run `{fix}` "
                       "to stage it without them")
    _make("filter", clone)
    _run(["git", "add", "--renormalize", NOTEBOOK], clone)
    assert check() is None and _run(["git", "status", "--porcelain"], clone) == ""
    assert "have no outputs" in _make("strip", clone)  # `make strip`: no change to git either
    assert _problems(nb_path.read_text()) == []
    _run(["git", "diff", "--exit-code"], clone)


# run by a Python with jupyter_server; answer_yes skips ServerApp._confirm_exit's question
SERVER_TRAITS = """
import inspect, sys
from jupyter_server.serverapp import ServerApp
unknown = set(sys.argv[1:]) - set(ServerApp.class_traits(config=True))
assert not unknown, f"unknown ServerApp options: {unknown}"
assert "self.answer_yes" in inspect.getsource(ServerApp._confirm_exit)
"""


def test_make_lab_stops_on_one_ctrl_c_without_a_question():
    start = LAB_SCRIPT.read_text().split('exec "$lab_py" -m jupyterlab', 1)[1]
    options = dict(re.findall(r"--ServerApp\.(\w+)=(\S+)", start))
    assert options.get("answer_yes") == "True", "make lab passes --ServerApp.answer_yes=True"
    assert "answer_yes" in JupyterApp.class_traits(config=True)  # ServerApp's base's trait
    server_python = LAB_VENV / "bin" / "python"  # make lab's, unless this one has the server
    if importlib.util.find_spec("jupyter_server") is not None:
        server_python = Path(sys.executable)
    elif not (server_python.exists()
              and any(LAB_VENV.glob("lib/python3*/site-packages/jupyter_server"))):
        pytest.skip("no lab environment here (make lab makes one)")
    proc = subprocess.run([server_python, "-c", SERVER_TRAITS, *options], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_make_lab_gives_the_notebooks_the_course_python_as_their_kernel(tmp_path):
    """Its name is the notebooks' (a save keeps their metadata); it runs this Python."""
    subprocess.run(["bash", str(LAB_SCRIPT), "--kernelspec-only", sys.executable, str(tmp_path)],
                   check=True, capture_output=True, timeout=60)
    specs = {d.name: json.loads((d / "kernel.json").read_text())
             for d in (tmp_path / "share" / "jupyter" / "kernels").iterdir()}
    notebooks = [nbformat.read(p, as_version=4) for p in ROOT.glob("notebooks/*.ipynb")]
    assert {(name, spec["display_name"]) for name, spec in specs.items()} == {
        (nb.metadata.kernelspec.name, nb.metadata.kernelspec.display_name) for nb in notebooks}
    assert [spec["argv"][0] for spec in specs.values()] == [sys.executable]
