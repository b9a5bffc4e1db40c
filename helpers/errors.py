"""The course's one error style: a :class:`CourseError` carries the one sentence the reader
needs, and a notebook or script shows that sentence alone.

- :func:`stop` ends a notebook or script on its sentence; :func:`check_parameters` refuses a
  parameters-cell value of the wrong type (and a results folder that cannot be written) before
  any work;
- :func:`one_line` turns any exception into ``Type: first line`` for such a sentence, and
  :func:`cuda_failure` names the fix for a failed first kernel launch;
- :func:`oom_exit` and :func:`compile_guard` for the two failures a reader meets most.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


class CourseError(Exception):
    """The course's one error: its message is the one sentence the reader needs, with the fix.

    A notebook shows that sentence alone (IPython renders ``_render_traceback_``), a script
    prints it alone on stderr and exits with status 1 (:func:`_script_hook`), and code that
    wants to react catches it by class."""

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


def _script_hook(kind, value, tb, _previous=sys.excepthook) -> None:
    """A script's uncaught :class:`CourseError` is its sentence on stderr and exit status 1
    (what ``SystemExit(sentence)`` gives), not a traceback; anything else goes on as before."""
    if isinstance(value, CourseError):  # one write: ranks failing together do not interleave
        sys.stderr.write(f"{value}\n")
        sys.stderr.flush()
        return
    _previous(kind, value, tb)


sys.excepthook = _script_hook


def one_line(exc: BaseException, limit: int = 200) -> str:
    """``Type: first line`` of the innermost cause of ``exc`` (Dynamo and Apex wrap the real
    error; a first line that only introduces the next, ending in ':', is joined to it)."""
    seen = {id(exc)}
    while True:
        inner = getattr(exc, "inner_exception", None) or exc.__cause__
        if inner is None or id(inner) in seen:
            break
        seen.add(id(inner))
        exc = inner
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    if first.endswith(":") and len(lines) > 1:
        first = f"{first} {lines[1]}"
    text = f"{type(exc).__name__}: {first}".rstrip(": ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_parameters(namespace: dict, expected: dict[str, type | tuple[type, ...]]) -> None:
    """Refuse, in one sentence and before any work, a parameters-cell value of the wrong type:
    ``check_parameters(globals(), {"steps": (int, type(None)), "lr": float})``. An int passes
    for a float; a bool never passes for a number. A results folder named by
    ``COURSE_RESULTS_DIR`` (papermill, a learner) is checked here too, so that one that cannot
    be written stops the notebook before its work, not at its first table."""
    import os

    from helpers.settings import RESULTS_DIR_VAR

    if os.environ.get(RESULTS_DIR_VAR):
        from helpers.results import results_dir

        results_dir()  # its one sentence, when the folder cannot be written
    for name, kinds in expected.items():
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        value = namespace.get(name)
        ok = any(isinstance(value, k) and not (isinstance(value, bool) and k in (int, float))
                 or (k is float and isinstance(value, int) and not isinstance(value, bool))
                 for k in kinds)
        if not ok:
            want = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
            stop(f"Parameter {name} = {value!r} must be {want}: fix it in the parameters cell "
                 "(the first code cell) and run the notebook again.")


def cuda_failure(exc: BaseException) -> str:
    """One sentence, with the fix, for a CUDA error raised by a first kernel launch."""
    text = str(exc)
    if "no kernel image" in text:
        return ("CUDA error: this torch has no kernels for this GPU's compute capability; "
                "install a torch build that supports it (pip install torch from the CUDA index "
                "matching your driver).")
    if "driver" in text.lower() or "CUDA_ERROR" in text or "initialization" in text.lower():
        return (f"CUDA error from the driver ({one_line(exc)}): run nvidia-smi; update the "
                "NVIDIA driver to one that supports torch's CUDA release, or restart the "
                "machine if nvidia-smi fails too.")
    return f"CUDA error ({one_line(exc)}): run nvidia-smi and check the GPU is not in use."


def stop(sentence: str) -> None:
    """End the notebook (or script) here with one sentence and no traceback."""
    raise CourseError(sentence)


@contextlib.contextmanager
def oom_exit(what: str) -> Iterator[None]:
    """Turn a CUDA out-of-memory error inside the block into one clear sentence."""
    import torch

    try:
        yield
    except torch.cuda.OutOfMemoryError:
        free, total = torch.cuda.mem_get_info() if torch.cuda.is_available() else (0, 0)
        stop(f"Out of GPU memory while {what} ({free / 2**30:.1f} of {total / 2**30:.1f} GiB "
             "free): run with profile = 'smoke', or free the GPU (other processes, notebooks).")


class CompileFailed(CourseError):
    """torch.compile (or the first call, which compiles) failed; the message is one line."""


@contextlib.contextmanager
def compile_guard(fix: str) -> Iterator[None]:
    """Turn any failure of ``torch.compile`` inside the block (not out-of-memory) into a
    one-line :class:`CompileFailed` that ends with ``fix``."""
    import torch

    try:
        yield
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:
        raise CompileFailed(f"torch.compile failed ({one_line(exc)}); {fix}") from None
