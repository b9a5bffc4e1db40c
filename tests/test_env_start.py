"""scripts/ensure_env.sh, the Makefile's filter and `make lab`, run on a copy against fakes."""

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
MAKE = ("make", "--no-print-directory")
GIT_ISOLATED = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}  # no user's filter

# A Python @VERSION@: answers the version, torch (has_torch beside bin/) and missing-modules
# probes ($FAKE_MISSING of those asked, then $FAKE_BROKEN until FAKE_FIXES=1), logs venv, pip.
FAKE_PYTHON = r"""#!/usr/bin/env bash
here=$(cd "$(dirname "$0")/.." && pwd)
log() { printf '%s\n' "$*" >> "$FAKE_LOG"; }
case "$1 $2" in
  "-c "*version_info*) echo "@VERSION@"; exit @TOO_OLD@ ;;
  "-c "*"import torch"*) [ -e "$here/has_torch" ] || exit 1; echo 2.13.0 ;;
  "- "*) cat >/dev/null
    if [ -e "$here/repaired" ]; then echo; elif [ -e "$here/filled" ]; then
      echo "${FAKE_BROKEN:-}"; else
      echo $(for m in ${FAKE_MISSING:-}; do case " $2 " in *" $m "*) echo "$m" ;; esac; done); fi ;;
  "-m nbstripout") exec "$FAKE_REAL_PYTHON" "$@" ;;
  "-m venv") shift 2
    if [ "$1" = --clear ]; then log "venv --clear ${0##*/}"; shift; rm -rf "$1"
    else log "venv ${0##*/}"; fi
    mkdir -p "$1/bin"; cp "$0" "$1/bin/python"; echo "version = @VERSION@.1" > "$1/pyvenv.cfg" ;;
  "-m pip") log "pip ${0##*/} ${*:3}"; echo "Downloading something.whl  [progress]"
    case " $* " in
      *" --force-reinstall "*) [ "${FAKE_FIXES:-}" != 1 ] || touch "$here/repaired" ;;
      *" -r "*) touch "$here/filled"; sed 's/^/  req: /' "${*: -1}" >> "$FAKE_LOG"
        ! grep -q '^torch==' "${*: -1}" || touch "$here/has_torch" ;;
    esac ;;
esac
exit 0
"""


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


class Checkout:
    """A temporary copy of the parts of the repository that ensure_env.sh and make read."""

    def __init__(self, tmp: Path):
        self.repo, self.bin, self.log = tmp / "repo", tmp / "bin", tmp / "log"
        (self.repo / "scripts").mkdir(parents=True)
        for name in ("scripts/ensure_env.sh", "requirements.txt", "Makefile"):
            shutil.copy(ROOT / name, self.repo / name)
        self.bin.mkdir()
        self.log.write_text("")

    def python(self, name: str, version: str, torch: bool = False) -> Path:
        path = self.bin / name if name != ".venv" else self.repo / ".venv" / "bin" / "python"
        too_old = "1" if tuple(map(int, version.split("."))) < (3, 11) else "0"
        _script(path, FAKE_PYTHON.replace("@VERSION@", version).replace("@TOO_OLD@", too_old))
        if torch:
            (path.parent.parent / "has_torch").touch()
        return path

    def run(self, *args: str, cmd: tuple[str, ...] = ("bash", "scripts/ensure_env.sh"),
            **env: str) -> subprocess.CompletedProcess:
        full = {"PATH": f"{self.bin}:/usr/bin:/bin", "FAKE_LOG": str(self.log),
                "FAKE_REAL_PYTHON": sys.executable, **GIT_ISOLATED, **env}
        return subprocess.run([*cmd, *args], cwd=self.repo, env=full, text=True,
                              capture_output=True, timeout=60)

    def calls(self, prefix: str = "") -> list[str]:
        return [c for c in self.log.read_text().splitlines() if c.startswith(prefix)]

    def reqs(self) -> list[str]:
        return [c.strip()[len("req: "):] for c in self.calls("  req: ")]

    def git(self, *args: str) -> str:
        proc = self.run(*args, cmd=("git",))
        assert proc.returncode == 0, proc.stderr
        return proc.stdout


def env_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("env:")]


@pytest.fixture
def co(tmp_path) -> Checkout:
    return Checkout(tmp_path)


@pytest.mark.parametrize("how", ["PYTHON", "PYTHON, a .venv here", "COURSE_PYTHON", "make run"])
def test_an_old_python_stops_in_one_sentence_before_pip(co, how):
    old = co.python("python3.10", "3.10")
    co.python("python3", "3.12")
    if "venv" in how:
        co.python(".venv", "3.12", True)
    env = {"COURSE_PYTHON": str(old)} if how == "COURSE_PYTHON" else {"PYTHON": "python3.10"}
    proc = co.run("run", cmd=MAKE, **env) if how == "make run" else co.run("--for=run", **env)
    assert proc.returncode != 0 and proc.stdout == ""
    said = env_lines(proc.stderr)
    assert len(said) == 1 and "is Python 3.10, and the course needs Python 3.11 or newer" in said[0]
    assert len(proc.stderr.strip().splitlines()) == 1 or how == "make run", proc.stderr
    assert co.calls() == [] and (co.repo / ".venv").exists() == ("venv" in how)


@pytest.mark.parametrize(("made", "venv", "env", "uses", "fills", "words"), [
    (("python3", "3.10"), ("3.12", True), {}, ".venv", False, ["python3 is Python 3.10", "3.12"]),
    (("python3", "3.13", True), ("3.12", True), {}, "python3", False, ["not reusing it", "3.12"]),
    (("python3.13", "3.13"), ("3.12", True), {"PYTHON": "python3.13"}, ".venv", True,
     ["Python 3.12", "Python 3.13: recreating"]),
    (("python3", "3.13"), ("3.11", False), {}, ".venv", True,
     ["Python 3.11", "Python 3.13: recreating"]),
    (("python3", "3.13"), ("3.13", False), {}, ".venv", True,
     ["installing requirements.txt into it again"]),
], ids=["old python3", "python3 with torch", "PYTHON=python3.13", ".venv 3.11", "interrupted"])
def test_the_working_python_is_taken_and_a_venv_of_another_version_recreated(co, made, venv, env,
                                                                            uses, fills, words):
    co.python(*made)
    venv_py = co.python(".venv", *venv)
    proc = co.run("--for=run", **env)
    want = venv_py if uses == ".venv" else co.bin / uses
    assert proc.returncode == 0 and proc.stdout.strip() == str(want), proc.stderr
    lines = env_lines(proc.stderr)
    assert len(lines) == 1 + fills and all(w in lines[0] for w in words), lines
    assert bool(co.calls("venv --clear python3")) == ("recreating" in words[-1]), co.calls()
    cfg = co.repo / ".venv" / "pyvenv.cfg"
    assert bool(co.calls()) == fills == (cfg.exists() and "version = 3.13" in cfg.read_text())


def test_first_venv_says_what_it_installs_and_shows_pips_progress(co):
    co.python("python3", "3.12")
    proc = co.run("--for=run")
    assert proc.stdout == f"{co.repo / '.venv' / 'bin' / 'python'}\n", proc.stderr
    [said] = env_lines(proc.stderr)
    assert "requirements.txt into .venv" in said and "CUDA build of several GB" in said, said
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in said
    assert "[progress]" in proc.stderr, "pip's output goes to stderr"
    upgrade, install = co.calls("pip ")  # a current pip first, then the pins, loudly
    assert upgrade.endswith("install -q --upgrade pip>=23.1"), upgrade
    assert " -r " in install and " -q" not in install, install
    reqs = co.reqs()
    assert "torch==2.13.0" in reqs and "numpy==2.4.6" in reqs and "papermill==2.7.0" in reqs
    assert not [r for r in reqs if r.startswith(("jupyterlab", "ipywidgets"))]


@pytest.mark.parametrize("case", ["repaired", "venv", "COURSE_PYTHON"])
def test_a_package_pip_cannot_import_is_reinstalled_once_then_named(co, case):
    co.python("python3", "3.12")
    own = case == "COURSE_PYTHON"
    py = co.python("python3.12", "3.12", torch=True) if own else co.python(".venv", "3.12", True)
    env = {"COURSE_PYTHON": str(py)} if own else {}
    proc = co.run("--for=run", FAKE_MISSING="nbformat", FAKE_BROKEN="nbformat",
                  FAKE_FIXES="1" if case == "repaired" else "", **env)
    pips = co.calls("pip ")  # the pins once, the broken one once: no loop
    assert len(pips) == 2 and pips[1].endswith("--force-reinstall --no-deps nbformat==5.11.1")
    lines = env_lines(proc.stderr)
    assert lines[0].startswith("env: missing: nbformat; installing")
    error = {"repaired": None, "COURSE_PYTHON": f"env: error: {py} cannot import nbformat even "
             "after pip reinstalled it: repair that Python's packages, or unset COURSE_PYTHON "
             "so that the course makes its own .venv", "venv": "env: error: nbformat still "
             "cannot be imported after reinstalling it, so .venv is broken beyond repair: "
             "remove it and start again with: rm -rf .venv && make test"}[case]
    assert proc.returncode == (1 if error else 0) and lines[1:] == ([error] if error else [])
    assert proc.stdout == ("" if error else f"{py}\n")


@pytest.mark.parametrize(("args", "said"), [
    ("--for=run", ""), ("", "env: missing: pytest ruff yaml;"),
    ("--for=test", "env: missing: pytest ruff yaml;"),
    ("--for=bogus", "env: error: unknown argument '--for=bogus'")])
def test_only_the_tests_need_the_test_tools_and_a_python_keeps_its_torch(co, args, said):
    py = co.python("python3.12", "3.12", torch=True)
    proc = co.run(*args.split(), COURSE_PYTHON=str(py), FAKE_MISSING="pytest ruff yaml")
    assert said in proc.stderr and ("missing" in proc.stderr) == ("missing" in said), proc.stderr
    assert proc.returncode == ("bogus" in args)
    reqs = co.reqs()  # the pins, less torch and the lab's: torchao is not torch
    assert ("torchao==0.18.0" in reqs) == ("missing" in said)
    assert not [r for r in reqs if r.startswith(("torch==", "jupyterlab", "ipywidgets"))]


@pytest.mark.skipif(not (shutil.which("git") and shutil.which("make")), reason="needs git, make")
def test_a_checkout_under_a_path_with_a_space_sets_up_git_s_filter(tmp_path):
    """make quotes the .venv's path in its recipes and in git's filter, which strips outputs."""
    co = Checkout(tmp_path / "my course")
    co.python("python3", "3.12")
    venv_py = co.python(".venv", "3.12", True)  # of the same version: reused, nothing installed
    assert co.run("--for=run").stdout == f"{venv_py}\n" and co.calls() == []
    assert "filter" in co.run("help", cmd=MAKE).stdout
    shutil.copy(ROOT / ".gitattributes", co.repo)
    cell = nbformat.v4.new_code_cell("1 + 1", id="kept-id", execution_count=1, outputs=[
        nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=1)])
    (co.repo / "notebooks").mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), co.repo / "notebooks" / "01_x.ipynb")
    said = {"not a git checkout": co.run("filter", cmd=MAKE)}  # an archive
    co.git("init", "-q")
    (co.repo / ".git" / "config.lock").touch()  # git's lock: .git/config cannot be written
    said[".git/config cannot be written"] = co.run("filter", cmd=MAKE)
    (co.repo / ".git" / "config.lock").unlink()
    for why, proc in said.items():
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        assert len(proc.stdout.splitlines()) == 1 and why in proc.stdout, proc.stdout
    proc = co.run("filter", cmd=MAKE)
    assert proc.stdout == ("make: set up git's nbstripout filter: notebooks/*.ipynb go into "
                           "commits without their outputs\n"), proc.stdout + proc.stderr
    assert co.run("filter", cmd=MAKE).stdout == "", "once set up, quiet"
    clean = co.git("config", "filter.nbstripout.clean").strip()
    assert clean == f'"{venv_py}" -m nbstripout --keep-id', clean
    co.git("add", "notebooks/01_x.ipynb")
    staged = co.git("show", ":notebooks/01_x.ipynb")
    assert '"outputs": []' in staged and '"execution_count": null' in staged, staged
    assert '"id": "kept-id"' in staged


# The course's Python (labpython) and the lab's (.venv-lab): logs each call as "course" or "lab"
LAB_PYTHON = r"""#!/usr/bin/env bash
case "$0" in */.venv-lab/bin/python) who=lab ;; *) who=course ;; esac
log() { printf '%s\n' "$*" >> "$FAKE_LOG"; }
case "$1 $2" in
  "-c "*) case " ${*:3} " in *" jupyter_server "*) [ "${FAKE_OLD_LAB:-}" = 1 ]; exit ;; esac
    exit "${FAKE_LAB_MISSING:-1}" ;;
  "-m venv") [ "${FAKE_NO_VENV:-}" != 1 ] || { echo "Error: no ensurepip" >&2; exit 1; }
    log "venv $who ${*:3}"; dir=${*: -1}
    mkdir -p "$dir/bin"; cp "$0" "$dir/bin/python"; touch "$dir/pyvenv.cfg" ;;
  "-m pip") [ "$3" = --version ] || log "pip $who ${*:3}" ;;
  "-m ipykernel") log "kernelspec $who ${*:3}" ;;
  "-m jupyterlab") log "jupyterlab $who ${*:3} cwd=${PWD##*/} JUPYTER_PATH=$JUPYTER_PATH"
    echo "[I ServerApp] http://127.0.0.1:8888/lab?token=abc" >&2 ;;
esac
exit 0
"""


def test_make_lab_stops_without_venv_then_installs_loudly_once_with_root_only_as_root(co):
    py = _script(co.bin / "labpython", LAB_PYTHON)
    _script(co.repo / "scripts" / "ensure_env.sh", f"#!/usr/bin/env bash\necho {py}\n")
    shutil.copy(ROOT / "scripts" / "lab.sh", co.repo / "scripts")
    (co.repo / "notebooks").mkdir()
    _script(co.bin / "id", '#!/usr/bin/env bash\n[ "$1" = -u ] && echo "$FAKE_UID"\n')
    proc = co.run("lab", cmd=MAKE, FAKE_UID="1000", FAKE_NO_VENV="1")
    [said] = [line for line in proc.stderr.splitlines() if line.startswith("make lab:")]
    assert proc.returncode != 0 and "apt-get install python3-venv" in said, proc.stderr
    assert not co.calls("pip lab") and not co.calls("jupyterlab ")
    co.log.write_text("")
    proc = co.run("lab", cmd=MAKE, FAKE_UID="0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lab_venv, prefix = co.repo / ".venv-lab", co.repo / ".venv-lab" / "course-kernel"
    assert f"venv course {lab_venv}" in co.calls(), "made by the course's Python"
    reqs = (ROOT / "requirements.txt").read_text().splitlines()
    pin = {line.split("==")[0]: line for line in reqs}
    pins = f"{pin['jupyterlab']} {pin['ipywidgets']}"  # the server's, without -q: pip's progress
    assert co.calls("pip ") == [f"pip course install -q {pin['ipywidgets']}",
                                f"pip lab install {pins}"]
    assert f"installing {pins} into {lab_venv}" in proc.stdout
    [args] = [call.split() for call in co.calls("jupyterlab ")]
    assert args[1] == "lab", "the server runs from the lab's environment"
    assert {"--ServerApp.ip=127.0.0.1", "--no-browser", "--allow-root"} <= set(args), args
    assert args[-2:] == ["cwd=notebooks", f"JUPYTER_PATH={prefix}/share/jupyter"], "its kernelspec"
    [spec] = co.calls("kernelspec course install")  # its kernel is the course's Python
    assert f"--prefix {prefix} --name python3" in spec, spec
    assert "http://127.0.0.1:8888/lab?token=abc" in proc.stderr, "the URL line is not swallowed"
    for old_lab in ("", "1"):  # then as a user, jupyterlab there; "1": also in the course's
        co.log.write_text("")
        proc = co.run("lab", cmd=MAKE, FAKE_UID="1000", FAKE_LAB_MISSING="0", FAKE_OLD_LAB=old_lab)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert co.calls("pip ") == co.calls("venv ") == [] and "installing" not in proc.stdout
        assert co.calls("kernelspec course"), "the kernelspec is written on every start"
        assert "--allow-root" not in co.calls("jupyterlab ")[0].split()
        said = [line for line in proc.stdout.splitlines() if "JupyterLab's server" in line]
        assert len(said) == bool(old_lab) and all("make test" in s and "rm -rf .venv" in s
                                                  for s in said), proc.stdout
