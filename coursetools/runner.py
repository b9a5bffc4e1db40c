"""Execute course notebooks headless with nbconvert and write the executed copies.

    python -m coursetools.runner [NOTEBOOK ...] --out build/run [--profile auto|smoke|full]
                                 [--param NAME=VALUE ...]

With no notebook named, all of ``notebooks/*.ipynb`` run in order. Each executed copy is
written even when a cell fails or the run is interrupted (Ctrl-C: exit 130), the failing cell is
named, and a time table closes the run. The profile, the output folder and every ``--param``
are checked before any notebook starts (``--check`` does only that). A run executes into
``<out>.partial``. A complete run (every notebook ok) then replaces ``<out>``, and the run before
it is kept as ``<out>.previous``; a run that failed or was interrupted becomes
``<out>.incomplete`` instead, so ``<out>`` always holds the last complete run, never one mixed
with another's tables, and the closing line says where each is.
Kernels get ``COURSE_PROFILE``, ``COURSE_RESULTS_DIR=<out>.partial/results``,
``COURSE_HEADLESS=1`` and the checkout on ``PYTHONPATH``, so the runner works from any working
directory.

``--param amp_dtype=fp16`` sets a parameter with papermill (a cell tagged
``injected-parameters`` after the parameters cell, as ``papermill -p`` writes it) in every
notebook whose parameters cell defines that name. Refused before any notebook starts: a name no
notebook defines, and a value of a type a notebook that defines the name does not take (the types
of its ``errors.check_parameters(globals(), {...})`` call, read from its source, and that
function's rule: a bool is no number; a tuple reaches the notebook as a list). Where
``nvidia-smi`` runs, the GPU memory in use (every process on the GPU, what a smaller card would
have to hold) is sampled during each notebook and its peak reported.

Longer than 400 lines because it is one command: checking, executing, parameter injection,
memory sampling and the time table all serve ``make run`` and are tested as one.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

try:
    import nbformat
    from nbconvert.preprocessors import CellExecutionError, ExecutePreprocessor

    from helpers.run_profile import ProfileError, resolve
except ModuleNotFoundError as _missing:  # a Python without the course's packages
    if __name__ != "__main__":
        raise
    sys.exit(f"runner: error: this Python ({sys.executable}) has no {_missing.name}: run the "
             "notebooks with 'make run', or with the course's Python: "
             ".venv/bin/python -m coursetools.runner")

from helpers import settings
from helpers.errors import CourseError, check_parameters, one_line
from helpers.results import (
    NO_SPACE,
    DiskFull,
    atomic_write_text,
    folder_bytes,
    incomplete_dir,
    megabytes,
    no_space,
    previous_dir,
    staging_dir,
    swap_in,
)
from helpers.settings import HEADLESS_VAR, PROFILE_VAR, RESULTS_DIR_VAR

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CHAPTER_GLOB = "[0-9][0-9]_*.ipynb"  # a chapter is notebooks/NN_<topic>.ipynb; NN orders them


def course_notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """The course's notebooks in their order, found in ``folder``: no list to edit for a new one."""
    return sorted(folder.glob(CHAPTER_GLOB))


class UnreadableNotebook(CourseError):
    """A notebook file that is not a notebook (cut short, not JSON); the message is the one
    sentence naming it, with the fix."""


def shown(path: Path) -> str:
    """``path`` as the reader types it: relative to the working directory when inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def read_notebook(path: Path):
    """The notebook at ``path`` (nbformat 4); :class:`UnreadableNotebook` when it is not one."""
    try:
        return nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 - NotJSONError, a decoding or schema error, OSError
        try:
            json.loads(Path(path).read_bytes())
            why = one_line(exc)
        except ValueError as bad:  # the JSON's own error says where it breaks off
            why = f"not JSON: {bad}"
        except OSError as gone:
            why = one_line(gone)
        name = shown(path)
        raise UnreadableNotebook(
            f"{name} is not a readable notebook ({why}): restore it with "
            f"'git checkout -- {name}' (or see what changed with 'git diff -- {name}')") from None


def _readable(paths: list[Path]) -> list[tuple[Path, object]]:
    """(path, notebook) of the notebooks of ``paths`` that can be read; the others are left to
    the run, which names each one as it comes to it."""
    found = []
    for path in paths:
        try:
            found.append((path, read_notebook(path)))
        except UnreadableNotebook:
            continue
    return found


@dataclass
class NotebookRun:
    """The outcome of one notebook."""

    name: str
    seconds: float
    ok: bool
    output: Path
    error: str = ""
    interrupted: bool = False
    parameters: dict | None = None  # the ones set with --param (this notebook defines them)
    peak_gpu_gib: float | None = None  # GPU memory in use at its peak, all processes (nvidia-smi)

    @property
    def status(self) -> str:
        """'ok', 'FAILED' or 'interrupted'."""
        return "interrupted" if self.interrupted else "ok" if self.ok else "FAILED"


def _failing_cell(nb) -> tuple[int, str] | None:
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
                return index, f"{out.get('ename')}: {out.get('evalue')} (cell {index}: {first!r})"
    return None


class ParameterError(CourseError):
    """A --param the notebooks cannot take; its message is the one sentence to print."""


def parse_params(items: list[str]) -> dict:
    """``["amp_dtype=fp16", "steps=40"]`` -> ``{"amp_dtype": "fp16", "steps": 40}`` (values as
    Python literals where they parse, else strings)."""
    params = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip().isidentifier():
            raise ParameterError(f"--param {item!r} is not NAME=VALUE, e.g. --param amp_dtype=fp16")
        try:
            params[name.strip()] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            params[name.strip()] = raw
    return params


def parameter_names(nb) -> set[str]:
    """The names the notebook's cell tagged ``parameters`` assigns."""
    cell = next((c for c in nb.cells if "parameters" in c.metadata.get("tags", [])), None)
    if cell is None:
        return set()
    tree = ast.parse(cell.source)
    return {t.id for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


def unknown_params(paths: list[Path], params: dict) -> list[str]:
    """The names in ``params`` that no notebook of ``paths`` defines."""
    known = set().union(*(parameter_names(nb) for _, nb in _readable(paths)))
    return sorted(set(params) - known)


def as_injected(value):
    """``value`` as the notebook's kernel gets it through papermill, which writes a tuple (or a
    set, bytes, a complex number) as the string of it: a tuple becomes a list, so that its values
    stay values; what papermill cannot write as itself becomes that string."""
    if isinstance(value, tuple | list):
        return [as_injected(v) for v in value]
    if isinstance(value, dict):
        return {k: as_injected(v) for k, v in value.items()}
    return value if value is None or isinstance(value, str | int | float) else str(value)


def _type_of(node: ast.expr) -> tuple[type, ...] | None:
    """``int`` -> (int,), ``type(None)`` -> (NoneType,), ``(int, type(None))`` -> both; None
    for anything else (a type the runner cannot know without running the notebook)."""
    if isinstance(node, ast.Tuple):
        kinds = [_type_of(e) for e in node.elts]
        return None if None in kinds or not kinds else tuple(k for ks in kinds for k in ks)
    if isinstance(node, ast.Name) and isinstance(getattr(builtins, node.id, None), type):
        return (getattr(builtins, node.id),)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"
            and len(node.args) == 1 and not node.keywords
            and isinstance(node.args[0], ast.Constant) and node.args[0].value is None):
        return (type(None),)
    return None


def _parse_cell(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except SyntaxError:  # IPython syntax (a magic): parse what IPython would run
        try:
            from IPython.core.inputtransformer2 import TransformerManager

            return ast.parse(TransformerManager().transform_cell(source))
        except (ImportError, SyntaxError):
            return None


def parameter_types(nb) -> dict[str, tuple[type, ...]]:
    """The types the notebook declares in its ``errors.check_parameters(globals(), {...})``
    call, read from its source without running it: name -> the types it accepts. A name whose
    types are not builtins (or ``type(None)``) is left out: the notebook checks it itself."""
    types: dict[str, tuple[type, ...]] = {}
    for cell in nb.cells:
        if cell.cell_type != "code" or "check_parameters" not in cell.source:
            continue
        tree = _parse_cell(cell.source)
        for node in ast.walk(tree) if tree is not None else ():
            func = getattr(node, "func", None)
            name = getattr(func, "attr", None) or getattr(func, "id", None)
            if (not isinstance(node, ast.Call) or name != "check_parameters"
                    or len(node.args) < 2 or not isinstance(node.args[1], ast.Dict)):
                continue
            for key, value in zip(node.args[1].keys, node.args[1].values, strict=True):
                kinds = _type_of(value)
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and kinds:
                    types[key.value] = kinds
    return types


def _kinds_text(kinds: tuple[type, ...]) -> str:
    return " or ".join("None" if k is type(None) else k.__name__ for k in kinds)


def _notebook_label(paths: list[Path]) -> str:
    """'notebook 05' or 'notebooks 05, 06 and 07' (the file name where it has no number)."""
    names = [p.name[:2] if p.name[:2].isdigit() else p.name for p in paths]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"notebook{'s' if len(names) > 1 else ''} {listed}"


def type_problems(paths: list[Path], items: list[str]) -> str:
    """'' when every --param has a type each notebook that takes it accepts, else the one
    sentence naming the command-line setting. The rule is the notebooks' own: each value, as
    papermill gives it to the kernel, goes through :func:`helpers.errors.check_parameters`
    with the types the notebook declares (:func:`parameter_types`)."""
    params = parse_params(items)
    raw = {item.partition("=")[0].strip(): item.strip() for item in items}
    refusing: dict[tuple[str, str], list[Path]] = {}
    for path, nb in _readable(paths):
        defined = parameter_names(nb)
        for name, kinds in parameter_types(nb).items():
            if name not in params or name not in defined:
                continue
            try:
                check_parameters({name: as_injected(params[name])}, {name: kinds})
            except CourseError:
                refusing.setdefault((name, _kinds_text(kinds)), []).append(path)
    if not refusing:
        return ""
    parts = []
    order = list(params)  # as given on the command line
    for (name, want), where in sorted(refusing.items(), key=lambda kv: order.index(kv[0][0])):
        value, given = as_injected(params[name]), params[name]
        got = f"{type(value).__name__} {value!r}"
        if type(value) is not type(given):
            got += f" (papermill passes a {type(given).__name__} as {_a(type(value).__name__)})"
        setting = f"--param {raw[name]}" + ("" if parts else " (make run PARAMS=...)")
        parts.append(f"{setting}: {_notebook_label(where)} expect{'' if len(where) > 1 else 's'} "
                     f"{name} to be {want}, got {got}")
    many = len({name for name, _ in refusing}) > 1
    them, cells = ("them", "the values of the parameters cells") if many else (
        "it", "the value of the parameters cell")
    return ("; ".join(parts) + f"; change {them} on the command line, or leave {them} out to keep "
            f"{cells}")


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def inject(nb, params: dict, kernel: str = "python3"):
    """(notebook, what was set): papermill's injected-parameters cell for the names ``nb``
    defines; ``nb`` unchanged when it defines none of them."""
    wanted = {k: as_injected(v) for k, v in params.items() if k in parameter_names(nb)}
    if not wanted:
        return nb, {}
    try:
        from papermill.parameterize import parameterize_notebook
    except ImportError:
        raise ParameterError("--param needs papermill: pip install papermill==2.7.0 "
                             "(the version requirements.txt pins)") from None
    for cell in nb.cells:  # what papermill's own loader adds: every cell's tags, its metadata
        cell.metadata.setdefault("tags", [])
    nb.metadata.setdefault("papermill", {})
    return parameterize_notebook(nb, wanted, kernel_name=kernel, language="python"), wanted


class GpuMemorySampler:
    """``nvidia-smi`` in the background, sampling the GPU memory in use every ``interval_ms``;
    :meth:`peak_gib` gives the largest sample since a mark. Inert where nvidia-smi is missing."""

    def __init__(self, interval_ms: int = 200):
        self.samples: list[tuple[float, float]] = []
        self._proc = None
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return
        index = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        try:
            self._proc = subprocess.Popen(
                [exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                 f"-lms={interval_ms}", f"--id={index}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                self.samples.append((time.perf_counter(), float(line.strip()) / 1024))
            except ValueError:
                continue

    def peak_gib(self, since: float) -> float | None:
        """The largest sample taken after ``since`` (a perf_counter time), or None."""
        time.sleep(0.3)  # the sample of the notebook's last moments
        values = [gib for t, gib in self.samples if t >= since]
        return max(values) if values else None

    def close(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=5)


def execute(path: Path, out_dir: Path, *, profile: str = "auto", timeout: int = 900,
            notebook_timeout: float | None = None, kernel: str = "python3",
            params: dict | None = None, sampler: GpuMemorySampler | None = None) -> NotebookRun:
    """Execute one notebook in its own folder; write ``out_dir/<name>`` whatever happens.

    ``timeout`` bounds each cell; ``notebook_timeout`` the whole notebook (the cell running when
    it expires is interrupted and reported as the failing one). ``params`` are set with
    papermill where the notebook defines them."""
    try:
        source = read_notebook(path)
    except UnreadableNotebook as exc:  # named, and the run goes on with the next notebook
        return NotebookRun(path.name, 0.0, False, path, str(exc))
    path = path.resolve()
    target = out_dir / path.name
    results = (out_dir / "results").resolve()
    try:
        results.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if not no_space(exc):
            raise
        return NotebookRun(path.name, 0.0, False, target, f"{one_line(exc)} ({results})")
    saved = dict(os.environ)  # the kernel's variables, for this notebook only
    os.environ.update({PROFILE_VAR: profile, RESULTS_DIR_VAR: str(results), HEADLESS_VAR: "1",
                       "PYTHONUNBUFFERED": "1"})
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    try:
        return _execute(source, path, target, timeout=timeout, kernel=kernel, params=params,
                        notebook_timeout=notebook_timeout, sampler=sampler)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _execute(nb, path: Path, target: Path, *, timeout: int, notebook_timeout: float | None,
             kernel: str, params: dict | None, sampler: GpuMemorySampler | None) -> NotebookRun:
    """:func:`execute` once the notebook is read and its kernel's variables are set."""
    nb, applied = inject(nb, params or {}, kernel)
    # The kernel's own log (e.g. its note on local TCP sockets) stays out of the run's output.
    processor = ExecutePreprocessor(timeout=timeout, kernel_name=kernel,
                                    extra_arguments=["--IPKernelApp.log_level=CRITICAL"])
    start = time.perf_counter()
    if notebook_timeout is not None:
        deadline = start + notebook_timeout
        processor.timeout_func = lambda _cell: max(
            1, int(min(timeout, deadline - time.perf_counter())))
    ok, error, interrupted = True, "", False
    try:
        processor.preprocess(nb, {"metadata": {"path": str(path.parent)}})
    except KeyboardInterrupt:  # Ctrl-C: keep what ran, in the executed copy
        ok, interrupted, error = False, True, "interrupted (Ctrl-C)"
    except CellExecutionError as exc:
        ok = False
        failing = _failing_cell(nb)
        error = failing[1] if failing else str(exc).strip().splitlines()[-1]
    except Exception as exc:  # kernel died, timeout, missing kernel
        ok = False
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    seconds = time.perf_counter() - start
    try:
        atomic_write_text(target, nbformat.writes(nb) + "\n")
    except OSError as exc:  # a full disk: the run stops there (run_all), and says so
        if not no_space(exc):
            raise
        ok, error = False, f"{one_line(exc)} (writing the executed copy {target})"
    peak = sampler.peak_gib(start) if sampler is not None else None
    return NotebookRun(path.name, seconds, ok, target, error, interrupted, applied or None, peak)


def run_all(paths: list[Path], out_dir: Path, *, profile: str = "auto",
            timeout: int = 900, notebook_timeout: float | None = None,
            params: dict | None = None) -> list[NotebookRun]:
    """Execute notebooks in order and print one line per notebook as it finishes."""
    runs = []
    sampler = GpuMemorySampler() if profile == "full" else None
    try:
        for path in paths:
            print(f"running {path.name} (profile {profile}) ...", flush=True)
            run = execute(path, out_dir, profile=profile, timeout=timeout,
                          notebook_timeout=notebook_timeout, params=params, sampler=sampler)
            status = ("ok" if run.ok else run.error if run.interrupted
                      else f"FAILED - {run.error}")
            if run.parameters:
                status += "  (" + ", ".join(f"{k}={v!r}" for k, v in run.parameters.items()) + ")"
            print(f"  {run.seconds:7.1f} s  {status}", flush=True)
            runs.append(run)
            if run.interrupted or says_no_space(run.error):
                break  # on a full disk, every notebook after it would fail the same way
    finally:
        if sampler is not None:
            sampler.close()
    return runs


def out_problem(out: Path) -> str:
    """'' when ``out`` (and ``<out>.partial`` beside it) can be written, with room there for a
    run the size of the last one, else one sentence."""
    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return (f"cannot write the run's output to {out} ({blocker} is a file, not a folder): "
                "choose a writable folder with --out (make run OUT=...).")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out.parent):
            pass
        if out.exists():
            probe = out / ".write-test"
            probe.touch()
            probe.unlink()
    except OSError as exc:
        if no_space(exc):
            return space_sentence(out)
        return (f"cannot write the run's output to {out} ({exc.strerror or exc}): choose a "
                "writable folder with --out (make run OUT=...).")
    if shutil.disk_usage(out.parent).free < last_run_bytes(out):
        return space_sentence(out)
    return ""


def is_complete(runs: list[NotebookRun], paths: list[Path]) -> bool:
    """Every notebook of ``paths`` ran, and each one ok."""
    return len(runs) == len(paths) and all(r.ok for r in runs)


def repoint_outputs(staging: Path, final: Path) -> None:
    """In the executed copies under ``staging``, the printed paths into ``staging`` (a script
    written, a table read) name ``final`` instead: where the files are once the run moved."""
    old, new = str(staging.resolve()), str(final.resolve())
    for path in staging.glob("*.ipynb"):
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception:  # noqa: BLE001 - an unreadable copy stays as it was
            continue
        changed = False
        for cell in nb.cells:
            for output in cell.get("outputs", []):
                if output.get("output_type") == "stream" and old in output.get("text", ""):
                    output["text"] = output["text"].replace(old, new)
                    changed = True
        if changed:
            try:
                atomic_write_text(path, nbformat.writes(nb) + "\n")
            except OSError:  # a full disk: the copy keeps the staging folder's paths
                continue


class NoSpaceForRun(CourseError):
    """The disk filled during a run, which was then removed; the message is the one sentence.
    ``runs``: the notebooks that ran, for the time table."""

    def __init__(self, sentence: str, runs: list[NotebookRun]):
        super().__init__(sentence)
        self.runs = runs


def says_no_space(error: str) -> bool:
    """True when a notebook's error is a full disk (its own write, or the runner's)."""
    return NO_SPACE in error or "[Errno 28]" in error or "[Errno 122]" in error


def last_run_bytes(out: Path) -> int:
    """The size of the last run here: ``out``, else ``<out>.incomplete`` (0 without either)."""
    return next((folder_bytes(p) for p in (out, incomplete_dir(out)) if p.is_dir()), 0)


def space_sentence(out: Path) -> str:
    """The one sentence for a disk without room for a run: the folder, the room there and what
    a run needs (the last run's size, where there is one)."""
    folder = next((p for p in (out.parent, *out.parent.parents) if p.exists()), out.parent)
    free, need = shutil.disk_usage(folder).free, last_run_bytes(out)
    room = (f"has {megabytes(free)} free, and a run needs about {megabytes(need)} (the last "
            "run's size)" if need else f"is full ({megabytes(free)} free)")
    return (f"the disk holding {folder.resolve()} {room}: free space there, or choose a folder "
            "on another disk with --out (make run OUT=...)")


def run_into(paths: list[Path], out: Path, *, profile: str, timeout: int = 900,
             notebook_timeout: float | None = None, keep_previous: bool = True,
             params: dict | None = None) -> list[NotebookRun]:
    """:func:`run_all` into ``<out>.partial``. A complete run (:func:`is_complete`) then
    replaces ``out`` (``out`` before it becomes ``<out>.previous`` when ``keep_previous``, else
    is removed) and removes an older ``<out>.incomplete``; a run that failed or was interrupted
    becomes ``<out>.incomplete`` (replacing an older one) and leaves ``out``, the last complete
    run, as it was. A run that fills the disk is removed, and :class:`NoSpaceForRun` says so
    (``out`` and ``<out>.incomplete`` as they were). Each run's ``output`` names where its
    executed copy is now."""
    staging = staging_dir(out)
    runs: list[NotebookRun] = []
    try:
        runs = run_all(paths, staging, profile=profile, timeout=timeout,
                       notebook_timeout=notebook_timeout, params=params)
        if any(says_no_space(r.error) for r in runs):
            raise DiskFull(staging)
        if staging.exists():
            write_runs(staging / "runs.json", runs, profile)
    except OSError as exc:
        if not no_space(exc):
            _set_aside(staging, out, runs, complete=False, keep_previous=keep_previous)
            raise
        shutil.rmtree(staging, ignore_errors=True)  # what it wrote would not be whole
        kept = (f"{out.resolve()} still holds the last complete run" if out.exists() else
                f"there is no complete run in {out.resolve()} yet")
        raise NoSpaceForRun(f"{space_sentence(out)}; this run was removed and {kept}",
                            runs) from None
    except BaseException:  # also on Ctrl-C between two notebooks: that run is incomplete
        _set_aside(staging, out, runs, complete=False, keep_previous=keep_previous)
        raise
    _set_aside(staging, out, runs, complete=is_complete(runs, paths), keep_previous=keep_previous)
    return runs


def _set_aside(staging: Path, out: Path, runs: list[NotebookRun], *, complete: bool,
               keep_previous: bool) -> None:
    """:func:`helpers.results.swap_in` of the run in ``staging``; each run's ``output`` then
    names where its executed copy is."""
    target = swap_in(staging, out, complete=complete, keep_previous=keep_previous,
                     prepare=lambda target: repoint_outputs(staging, target))
    for run in runs:
        if run.output.parent == staging:  # not an unreadable source, which stays where it is
            run.output = target / run.output.name


def where_line(out: Path, runs: list[NotebookRun] | None, paths: list[Path]) -> str:
    """The one line that says where this run is, and where the last complete one is (``runs``
    None: interrupted between two notebooks)."""
    previous = previous_dir(out)
    if runs is not None and is_complete(runs, paths):
        return (f"executed notebooks and results: {out.resolve()}" + (
            f" (the run before it: {previous.resolve()})" if previous.exists() else ""))
    bad = [f"{r.name} {r.status}" for r in runs or [] if not r.ok]
    unrun = len(paths) - len(runs or [])
    why = ("interrupted between two notebooks" if runs is None else
           ", ".join(bad + [f"{unrun} of {len(paths)} not run"] * bool(unrun)))
    last = (f"{out.resolve()} still holds the last complete run" if out.exists() else
            f"there is no complete run in {out.resolve()} yet")
    return f"this run is incomplete ({why}): it is in {incomplete_dir(out).resolve()}; {last}"


def write_runs(path: Path, runs: list[NotebookRun], profile: str) -> None:
    """The run's record beside its notebooks: each notebook's status, time, GPU memory and the
    parameters set, with the environment variables that change the numbers."""
    import json

    from helpers.environment import RELEVANT_VARS
    from helpers.results import atomic_write_text

    record = {"profile": profile,
              "environment": {k: os.environ[k] for k in RELEVANT_VARS if k in os.environ},
              "notebooks": [{"name": r.name, "status": r.status, "seconds": round(r.seconds, 1),
                             "peak_gpu_gib": None if r.peak_gpu_gib is None
                             else round(r.peak_gpu_gib, 2),
                             "parameters": r.parameters or {}, "error": r.error} for r in runs]}
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")


def summary(runs: list[NotebookRun]) -> str:
    """The closing time table."""
    width = max([len(r.name) for r in runs] + [8])
    gpu = any(r.peak_gpu_gib is not None for r in runs)
    head = f"{'notebook':<{width}}  {'seconds':>8}" + ("  GPU GiB" if gpu else "") + "  status"
    lines = [head]
    for r in runs:
        mem = (f"  {r.peak_gpu_gib:7.1f}" if r.peak_gpu_gib is not None else f"  {'-':>7}"
               ) if gpu else ""
        lines.append(f"{r.name:<{width}}  {r.seconds:8.1f}{mem}  {r.status}")
    lines.append(f"{'total':<{width}}  {sum(r.seconds for r in runs):8.1f}")
    if gpu:
        lines.append("GPU GiB: the most GPU memory in use during the notebook, all processes "
                     "(nvidia-smi, sampled every 0.2 s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; exit status 1 when any notebook failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "run")
    parser.add_argument("--profile", default=os.environ.get(PROFILE_VAR, "auto"),
                        help="auto, smoke or full (any case)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    parser.add_argument("--notebook-timeout", type=float, default=None,
                        help="seconds per notebook (default: no limit beyond the per-cell one)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="set a parameter in every notebook that defines it (papermill)")
    parser.add_argument("--check", action="store_true",
                        help="only check the profile and the output folder, then exit")
    args = parser.parse_args(argv)
    paths = args.notebooks or course_notebooks()
    missing = [p for p in paths if not p.exists()]
    problem = (f"no such notebook: {', '.join(map(str, missing))}" if missing else
               settings_problem(os.environ) or profile_problem(args.profile)
               or out_problem(args.out) or params_problem(paths, args.param))
    if problem:
        print(f"runner: error: {problem}", file=sys.stderr)
        return 2
    if args.check:
        return 0
    profile = resolve(args.profile).name
    try:
        runs = run_into(paths, args.out, profile=profile, timeout=args.timeout,
                        notebook_timeout=args.notebook_timeout, params=parse_params(args.param))
    except KeyboardInterrupt:  # between two notebooks
        print(f"interrupted (Ctrl-C); {where_line(args.out, None, paths)}", file=sys.stderr)
        return 130
    except NoSpaceForRun as full:
        print()
        print(summary(full.runs))
        print(f"runner: error: {full}", file=sys.stderr)
        return 1
    print()
    print(summary(runs))
    print(f"\n{where_line(args.out, runs, paths)}")
    if any(r.interrupted for r in runs):
        return 130
    failed = [r for r in runs if not r.ok]
    sources = {p.resolve() for p in paths}  # an unreadable notebook has no executed copy
    for r in failed:
        see = "" if r.output.resolve() in sources else f"\n  see {r.output}"
        print(f"FAILED {r.name}: {r.error}{see}", file=sys.stderr)
    return 1 if failed else 0


def settings_problem(environ) -> str:
    """'' when every ``COURSE_*`` setting in ``environ`` is one the runner honours, else the one
    sentence: ``COURSE_RESULTS_DIR`` (a run keeps its tables beside its notebooks), or a name
    that is a misspelling of a course setting."""
    where = environ.get(RESULTS_DIR_VAR)
    if where:
        return (f"{RESULTS_DIR_VAR}={where} is set, but a run keeps its tables beside its "
                f"notebooks, in <out>/results: unset it ('unset {RESULTS_DIR_VAR}') and "
                "choose the run's folder with --out (make run OUT=...)")
    for name in sorted(n for n in environ if n.startswith("COURSE_")):
        if name in settings.KNOWN:
            continue
        close = difflib.get_close_matches(name, settings.KNOWN, n=1, cutoff=0.85)
        if close:
            return (f"{name} is not a course setting (did you mean {close[0]}?): rename it, "
                    f"or unset {name}")
    return ""


def params_problem(paths: list[Path], items: list[str]) -> str:
    """'' when every --param parses and some notebook defines it, else the one sentence."""
    try:
        params = parse_params(items)
        if "profile" in params:  # the run's profile, which the report records, is its own option
            return ("--param profile=... is refused: choose the profile with --profile (make "
                    "PROFILE=...), which the run records")
        unknown = unknown_params(paths, params) if params else []
        if params and not unknown:
            from papermill.parameterize import parameterize_notebook  # noqa: F401
    except ParameterError as exc:
        return str(exc)
    except ImportError:
        return ("--param needs papermill: pip install papermill==2.7.0 "
                "(the version requirements.txt pins)")
    if unknown:
        return (f"no notebook here has a parameter {', '.join(map(repr, unknown))}: see the "
                "parameters cell (the first code cell) of each notebook")
    return type_problems(paths, items) if params else ""


def profile_problem(name: str) -> str:
    """'' when ``name`` is a profile this machine can run, else the one sentence why not."""
    try:
        resolve(name)
    except ProfileError as exc:
        return str(exc)
    return ""


if __name__ == "__main__":
    try:
        code = main()
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: kernel-client threads print nothing on the way out
