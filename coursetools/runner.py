"""Execute course notebooks headless with nbconvert and write the executed copies.

    python -m coursetools.runner [NOTEBOOK ...] --out build/run [--profile auto|smoke|full]

With no notebook named, all of ``notebooks/*.ipynb`` run in order. Each executed copy is
written even when a cell fails or the run is interrupted (Ctrl-C: exit 130), the failing cell is
named, and a time table closes the run. The profile and the output folder are checked before any
notebook starts (``--check`` does only that). A run executes into ``<out>.partial`` and then
replaces ``<out>`` (the run before it is kept as ``<out>.previous``), so a folder never mixes
the notebooks of one run with the tables of another.
Kernels get ``COURSE_PROFILE``, ``COURSE_RESULTS_DIR=<out>/results``, ``COURSE_HEADLESS=1`` and
the checkout on ``PYTHONPATH``, so the runner works from any working directory.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbconvert.preprocessors import CellExecutionError, ExecutePreprocessor

from helpers.profile import ProfileError, resolve

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


@dataclass
class NotebookRun:
    """The outcome of one notebook."""

    name: str
    seconds: float
    ok: bool
    output: Path
    error: str = ""
    interrupted: bool = False

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


def execute(path: Path, out_dir: Path, *, profile: str = "auto", timeout: int = 900,
            notebook_timeout: float | None = None, kernel: str = "python3") -> NotebookRun:
    """Execute one notebook in its own folder; write ``out_dir/<name>`` whatever happens.

    ``timeout`` bounds each cell; ``notebook_timeout`` the whole notebook (the cell running when
    it expires is interrupted and reported as the failing one)."""
    path = path.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    results = (out_dir / "results").resolve()
    results.mkdir(parents=True, exist_ok=True)
    os.environ.update(COURSE_PROFILE=profile, COURSE_RESULTS_DIR=str(results),
                      COURSE_HEADLESS="1", PYTHONUNBUFFERED="1")
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    nb = nbformat.read(path, as_version=4)
    # The kernel's own log (e.g. its note on local TCP sockets) stays out of the run's output.
    processor = ExecutePreprocessor(timeout=timeout, kernel_name=kernel,
                                    extra_arguments=["--IPKernelApp.log_level=CRITICAL"])
    start = time.perf_counter()
    if notebook_timeout is not None:
        deadline = start + notebook_timeout
        processor.timeout_func = lambda _cell: max(
            1, int(min(timeout, deadline - time.perf_counter())))
    target = out_dir / path.name
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
    nbformat.write(nb, target)
    return NotebookRun(path.name, seconds, ok, target, error, interrupted)


def run_all(paths: list[Path], out_dir: Path, *, profile: str = "auto",
            timeout: int = 900, notebook_timeout: float | None = None) -> list[NotebookRun]:
    """Execute notebooks in order and print one line per notebook as it finishes."""
    runs = []
    for path in paths:
        print(f"running {path.name} (profile {profile}) ...", flush=True)
        run = execute(path, out_dir, profile=profile, timeout=timeout,
                      notebook_timeout=notebook_timeout)
        status = ("ok" if run.ok else run.error if run.interrupted
                  else f"FAILED - {run.error}")
        print(f"  {run.seconds:7.1f} s  {status}", flush=True)
        runs.append(run)
        if run.interrupted:
            break
    return runs


def out_problem(out: Path) -> str:
    """'' when ``out`` (and ``<out>.partial`` beside it) can be written, else one sentence."""
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
        return (f"cannot write the run's output to {out} ({exc.strerror or exc}): choose a "
                "writable folder with --out (make run OUT=...).")
    return ""


def run_into(paths: list[Path], out: Path, *, profile: str, timeout: int = 900,
             notebook_timeout: float | None = None,
             keep_previous: bool = True) -> list[NotebookRun]:
    """:func:`run_all` into ``<out>.partial``, which then replaces ``out`` whatever happened
    (``out`` before it becomes ``<out>.previous`` when ``keep_previous``, else is removed)."""
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    runs: list[NotebookRun] = []
    try:
        runs = run_all(paths, staging, profile=profile, timeout=timeout,
                       notebook_timeout=notebook_timeout)
    finally:
        previous = out.with_name(out.name + ".previous")
        if out.exists():
            shutil.rmtree(previous, ignore_errors=True)
            if keep_previous:
                out.rename(previous)
            else:
                shutil.rmtree(out)
        if staging.exists():
            staging.rename(out)
    for run in runs:
        run.output = out / run.output.name
    return runs


def summary(runs: list[NotebookRun]) -> str:
    """The closing time table."""
    width = max([len(r.name) for r in runs] + [8])
    lines = [f"{'notebook':<{width}}  {'seconds':>8}  status"]
    lines += [f"{r.name:<{width}}  {r.seconds:8.1f}  {r.status}" for r in runs]
    lines.append(f"{'total':<{width}}  {sum(r.seconds for r in runs):8.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; exit status 1 when any notebook failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "run")
    parser.add_argument("--profile", default=os.environ.get("COURSE_PROFILE", "auto"),
                        help="auto, smoke or full (any case)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    parser.add_argument("--notebook-timeout", type=float, default=None,
                        help="seconds per notebook (default: no limit beyond the per-cell one)")
    parser.add_argument("--check", action="store_true",
                        help="only check the profile and the output folder, then exit")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    missing = [p for p in paths if not p.exists()]
    problem = (f"no such notebook: {', '.join(map(str, missing))}" if missing else
               profile_problem(args.profile) or out_problem(args.out))
    if problem:
        print(f"runner: error: {problem}", file=sys.stderr)
        return 2
    if args.check:
        return 0
    profile = resolve(args.profile).name
    try:
        runs = run_into(paths, args.out, profile=profile, timeout=args.timeout,
                        notebook_timeout=args.notebook_timeout)
    except KeyboardInterrupt:  # between two notebooks
        runs = []
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    print()
    print(summary(runs))
    print(f"\nexecuted notebooks and results: {args.out.resolve()}")
    if any(r.interrupted for r in runs):
        return 130
    failed = [r for r in runs if not r.ok]
    for r in failed:
        print(f"FAILED {r.name}: {r.error}\n  see {r.output}", file=sys.stderr)
    return 1 if failed else 0


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
