"""Execute course notebooks headless with nbconvert and write the executed copies.

    python -m coursetools.runner [NOTEBOOK ...] --out build/run [--profile auto|smoke|full]

With no notebook named, all of ``notebooks/*.ipynb`` run in order. Each executed copy is
written even when a cell fails, the failing cell is named, and a time table closes the run.
Kernels get ``COURSE_PROFILE``, ``COURSE_RESULTS_DIR=<out>/results``, ``COURSE_HEADLESS=1`` and
the checkout on ``PYTHONPATH``, so the runner works from any working directory.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbconvert.preprocessors import CellExecutionError, ExecutePreprocessor

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
                                    extra_arguments=["--IPKernelApp.log_level=ERROR"])
    start = time.perf_counter()
    if notebook_timeout is not None:
        deadline = start + notebook_timeout
        processor.timeout_func = lambda _cell: max(
            1, int(min(timeout, deadline - time.perf_counter())))
    target = out_dir / path.name
    ok, error = True, ""
    try:
        processor.preprocess(nb, {"metadata": {"path": str(path.parent)}})
    except CellExecutionError as exc:
        ok = False
        failing = _failing_cell(nb)
        error = failing[1] if failing else str(exc).strip().splitlines()[-1]
    except Exception as exc:  # kernel died, timeout, missing kernel
        ok = False
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    seconds = time.perf_counter() - start
    nbformat.write(nb, target)
    return NotebookRun(path.name, seconds, ok, target, error)


def run_all(paths: list[Path], out_dir: Path, *, profile: str = "auto",
            timeout: int = 900, notebook_timeout: float | None = None) -> list[NotebookRun]:
    """Execute notebooks in order and print one line per notebook as it finishes."""
    runs = []
    for path in paths:
        print(f"running {path.name} (profile {profile}) ...", flush=True)
        run = execute(path, out_dir, profile=profile, timeout=timeout,
                      notebook_timeout=notebook_timeout)
        status = "ok" if run.ok else f"FAILED - {run.error}"
        print(f"  {run.seconds:7.1f} s  {status}", flush=True)
        runs.append(run)
    return runs


def summary(runs: list[NotebookRun]) -> str:
    """The closing time table."""
    width = max([len(r.name) for r in runs] + [8])
    lines = [f"{'notebook':<{width}}  {'seconds':>8}  status"]
    lines += [f"{r.name:<{width}}  {r.seconds:8.1f}  {'ok' if r.ok else 'FAILED'}" for r in runs]
    lines.append(f"{'total':<{width}}  {sum(r.seconds for r in runs):8.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; exit status 1 when any notebook failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "run")
    parser.add_argument("--profile", default=os.environ.get("COURSE_PROFILE", "auto"),
                        choices=["auto", "smoke", "full"])
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    parser.add_argument("--notebook-timeout", type=float, default=None,
                        help="seconds per notebook (default: no limit beyond the per-cell one)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    missing = [p for p in paths if not p.exists()]
    if missing:
        print(f"runner: error: no such notebook: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    runs = run_all(paths, args.out, profile=args.profile, timeout=args.timeout,
                   notebook_timeout=args.notebook_timeout)
    print()
    print(summary(runs))
    print(f"\nexecuted notebooks and results: {args.out.resolve()}")
    failed = [r for r in runs if not r.ok]
    for r in failed:
        print(f"FAILED {r.name}: {r.error}\n  see {r.output}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
