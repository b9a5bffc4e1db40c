"""A notebook opened alone: its set-up cell installs the course (COURSE_REPO), or says why not."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PINS = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#"))
PINNED = [r.split("==")[0].lower() for r in tomllib.loads(
    (ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["pinned"]]
SETUP = (ROOT / "scripts" / "setup_cell.py").read_text().rstrip("\n")  # every notebook's
SETUP_SAYS = "setup: install torch for your GPU and set COURSE_REPO (see the README)"
OLDEST_PIP = "23.2.1"  # Python 3.11's own (ensurepip's); it refuses git+file:/// (no host)
NEEDS_A_CLONE = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                                   reason="the course is not a git checkout here (an archive?)")


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{cmd[:4]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.notebook
@NEEDS_A_CLONE
def test_a_notebook_copied_alone_installs_the_course_with_the_oldest_pip(tmp_path):
    """A notebook service's Python with pip 23.2: no COURSE_REPO or a missing ref stops in one
    sentence; a clone under a path with a space installs, and 02 runs from it."""
    head = _run(["git", "-C", str(ROOT), "rev-parse", "HEAD"]).stdout.strip()
    _run(["git", "clone", "-q", str(ROOT), str(clone := tmp_path / "a clone" / "course")])
    venv = tmp_path / "venv"  # torch, the kernel and the pinned packages, as in a notebook service
    _run([sys.executable, "-m", "venv", str(venv)])  # with Python's own pip
    python = venv / "bin" / "python"
    if _run([str(python), "-m", "pip", "--version"]).stdout.split()[1] != OLDEST_PIP:
        _run([str(python), "-m", "pip", "install", "-q", f"pip=={OLDEST_PIP}"])
    wanted = {name: PINS[name] for name in ("torch", "nbconvert", "ipykernel", *PINNED)}
    if not _link_installed(wanted, python):  # linked in from here (quicker), else installed
        _run([str(python), "-m", "pip", "install", "-q", "--no-compile",
              *(f"{name}=={version}" for name, version in wanted.items())])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COURSE_", "PYTHON"))}
    env.update(COURSE_REPO=str(clone), COURSE_REF=head, COURSE_PROFILE="smoke", HOME=str(
        tmp_path), PIP_NO_COMPILE="1", PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}")

    def cell(**changes) -> subprocess.CompletedProcess:
        return subprocess.run([str(python), "-c", SETUP], capture_output=True, text=True,
                              cwd=tmp_path, env=env | changes, timeout=300)

    assert (proc := cell(COURSE_REPO="")).returncode == 1 and proc.stderr.strip() == SETUP_SAYS
    proc = cell(COURSE_REF="no-such-ref")  # pip's own message, then one sentence
    assert proc.returncode == 1 and "did not match" in proc.stderr, proc.stderr
    said = f"setup: pip could not install the course from {clone} at no-such-ref (above)"
    assert proc.stderr.strip().splitlines()[-1] == said
    (alone := tmp_path / "service").mkdir()
    shutil.copy(clone / "notebooks" / (name := "02_fused_adam_vs_adamw.ipynb"), alone)
    _run([str(python), "-m", "nbconvert", "--to", "notebook", "--execute",
          "--ExecutePreprocessor.timeout=600", "--output", "executed.ipynb", name],
         cwd=alone, env=env, timeout=900)
    executed = nbformat.read(alone / "executed.ipynb", as_version=4)
    printed = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert f"commit {head[:12]}" in printed, "the header names the commit it was installed from"
    assert not [o for c in executed.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert list((alone / "results").glob("02_*.csv")), "the notebook saved no table"
    code = "import importlib.metadata as m, helpers; print(m.version('torch'), helpers.__file__)"
    version, where = _run([str(python), "-c", code], cwd=tmp_path).stdout.split()
    assert version.split("+")[0] == PINS["torch"] and where.startswith(str(venv))  # installed


def _link_installed(wanted: dict[str, str], python: Path) -> bool:
    """Hard-links ``wanted`` (name: version) and their requirements from here; False: cannot."""
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(_run([str(python), "-c", code]).stdout.strip())
    found, done, todo = {}, set(), [(name, "") for name in wanted]
    while todo:  # (distribution, one of its extras or ""), as pip resolves them
        name, extra = todo.pop()
        if (name := canonicalize_name(name), extra) in done:
            continue
        done.add((name, extra))
        try:
            found[name] = dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return False
        if name in wanted and dist.version.split("+")[0] != wanted[name]:
            return False
        for req in map(Requirement, dist.requires or []):
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo += [(req.name, e) for e in ("", *req.extras)]
    try:  # their .pyc too: the same Python
        for dist in found.values():
            for source, target in ((Path(dist.locate_file(f)), site / f) for f in dist.files or []
                                   if f.parts[0] != ".."):
                target.parent.mkdir(parents=True, exist_ok=True)
                if source.exists() and not target.exists():
                    os.link(source, target)
    except OSError:  # another file system: pip installs them instead
        return False
    return True


def test_every_notebook_has_the_setup_cell_after_its_parameters():  # scripts/setup_cell.py
    assert "set-up" in SETUP.splitlines()[0] and len(SETUP.splitlines()) <= 9  # short
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        index = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
        assert cells[index + 1].source == SETUP, f"{path.name}: not scripts/setup_cell.py"


@pytest.mark.slow
def test_in_an_archive_without_git_the_tests_that_clone_the_course_skip_saying_so(tmp_path):
    (copy := tmp_path / "course").mkdir()  # a tarball or zip: no fatal "not a git repository"
    for name in ("tests", "helpers", "coursetools", "notebooks", "scripts", "pyproject.toml",
                 "requirements.txt"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(ROOT / name, copy / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist",
         "tests/test_standalone.py", "tests/test_loop.py", "tests/test_new_chapter.py", "-k",
         "copied_alone or run_save_test or new_chapter_needs"],
        cwd=copy, env=env | {"PYTHONPATH": str(copy)}, capture_output=True, text=True, timeout=300)
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert proc.returncode == 0 and len(skipped) == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert all("git checkout" in line for line in skipped), skipped
