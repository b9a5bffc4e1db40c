"""What this machine can run, and how the course says so in one sentence.

- the capability checks: a CUDA GPU, native bf16, Apex's compiled extensions, the legacy
  ``apex.amp`` install, and the one choice of the mixed-precision dtype (:func:`amp_dtype`);
- :func:`needs`, the one-line skip every GPU-only cell uses;
- :func:`one_line` and :func:`stop`, the one-sentence errors; :func:`oom_exit` and
  :func:`compile_guard` for the two failures a reader meets most;
- the run profile this machine gets (:func:`resolve`: ``smoke``, tiny sizes in seconds on a CPU,
  or ``full``, the course sizes on a GPU), the progress bars, and the GPU memory cap that
  rehearses a smaller card (:func:`cap_gpu_memory`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import torch

from helpers.results import repo_root

# Apex's compiled extensions the course relies on, and what each one provides.
APEX_EXTENSIONS: dict[str, str] = {
    "amp_C": "multi-tensor apply kernels (FusedAdam, FusedSGD, FusedLAMB, fused grad scaling)",
    "apex_C": "flatten/unflatten of tensor lists (C++)",
    "fused_layer_norm_cuda": "FusedLayerNorm, FusedRMSNorm and their Mixed variants",
}
BUILD_HINT = "build it with ./build_apex.sh (see notebook 01)"
AMP_DTYPES = ("auto", "bf16", "fp16")


# ------------------------------------------------------------------ one-sentence errors
class CourseError(RuntimeError):
    """An error whose message is already the one sentence the reader needs."""


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
    for a float; a bool never passes for a number."""
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
    raise SystemExit(sentence)


@contextlib.contextmanager
def oom_exit(what: str) -> Iterator[None]:
    """Turn a CUDA out-of-memory error inside the block into one clear sentence."""
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
    try:
        yield
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:
        raise CompileFailed(f"torch.compile failed ({one_line(exc)}); {fix}") from None


# ------------------------------------------------------------------ capabilities
def cuda_available() -> bool:
    """True when torch sees a CUDA GPU."""
    return bool(torch.cuda.is_available())


def device() -> torch.device:
    """The course's device: the current CUDA GPU if any, else the CPU."""
    return torch.device("cuda" if cuda_available() else "cpu")


def capability() -> tuple[int, int] | None:
    """The GPU's compute capability, or None without a GPU."""
    return torch.cuda.get_device_capability() if cuda_available() else None


def usable_gpu_gib() -> float | None:
    """GiB of GPU memory this process may use: the card's total times the per-process fraction
    (``torch.cuda.set_per_process_memory_fraction``); None without a GPU."""
    if not cuda_available():
        return None
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30
    if hasattr(torch.cuda, "get_per_process_memory_fraction"):
        return total * torch.cuda.get_per_process_memory_fraction()
    # an older torch: the cap this course set, if any
    try:
        return min(total, float(os.environ.get(MEMORY_VAR) or total))
    except ValueError:
        return total


def bf16_supported() -> bool:
    """True on a CUDA GPU with native bf16 (compute capability 8.0 or newer).

    Not ``torch.cuda.is_bf16_supported()``: that also says True where bf16 is emulated."""
    cap = capability()
    return cap is not None and cap[0] >= 8


def amp_dtype(request: str = "auto", dev: torch.device | str | None = None) -> torch.dtype:
    """The mixed-precision dtype, chosen in one place: bf16 on GPUs of compute capability 8.0+
    and on the CPU, fp16 (with a GradScaler) below; ``request`` "bf16" or "fp16" forces one."""
    name = str(request).strip().lower()
    if name not in AMP_DTYPES:
        raise CourseError(f"amp_dtype = {request!r} is not one of {', '.join(AMP_DTYPES)}: "
                          "set amp_dtype = 'auto' in the parameters cell.")
    dev = torch.device(dev) if dev is not None else device()
    if name == "auto":
        name = "fp16" if dev.type == "cuda" and not bf16_supported() else "bf16"
    if name == "bf16" and dev.type == "cuda" and not bf16_supported():
        raise CourseError("amp_dtype = 'bf16' needs a GPU of compute capability 8.0 or newer; "
                          "this one has none: set amp_dtype = 'auto' (fp16 + GradScaler here).")
    return torch.bfloat16 if name == "bf16" else torch.float16


def amp_dtype_line(dtype: torch.dtype, request: str = "auto") -> str:
    """One line saying which mixed-precision dtype this run uses, and why."""
    cap = capability()
    where = f"compute capability {cap[0]}.{cap[1]}" if cap else "the CPU"
    why = "forced by amp_dtype" if str(request).lower() != "auto" else f"chosen for {where}"
    scaler = "with GradScaler" if dtype == torch.float16 else "no loss scaling needed"
    return f"mixed precision: {str(dtype).removeprefix('torch.')} ({why}; {scaler})"


# ------------------------------------------------------------------ Apex
def apex_workdir() -> Path:
    """Where build_apex.sh keeps clones, logs and markers (``$APEX_WORKDIR`` or ``.apex``)."""
    env = os.environ.get("APEX_WORKDIR")
    if env:
        return Path(env)
    root = repo_root()
    return (root if root is not None else Path.cwd()) / ".apex"


def legacy_amp_dir() -> Path:
    """The separate install of the last Apex commit with ``apex.amp`` (``--legacy-amp``)."""
    env = os.environ.get("APEX_LEGACY_AMP_DIR")
    return Path(env) if env else apex_workdir() / "legacy-amp"


def wrong_apex() -> str | None:
    """The distribution that provides ``apex`` when it is PyPI's unrelated package, else None."""
    try:
        dists = importlib.metadata.packages_distributions().get("apex", [])
    except Exception:  # pragma: no cover - broken metadata
        return None
    for dist in dists:
        try:
            meta = importlib.metadata.metadata(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        if (meta.get("Name") or "").lower() == "apex" and "nvidia" not in str(
                meta.get("Summary", "") + meta.get("Author", "")).lower():
            version = meta.get("Version", "?")
            if not version.startswith("0.1"):  # NVIDIA's own builds call themselves 0.1
                return f"apex {version} from PyPI"
    return None


def apex_importable() -> bool:
    """True when the ``apex`` Python package imports (says nothing about its kernels)."""
    try:
        importlib.import_module("apex")
    except Exception:
        return False
    return True


@cache
def apex_extension_status() -> dict[str, bool]:
    """Which of Apex's compiled extensions import (False everywhere for a Python-only install)."""
    status = {}
    for name in APEX_EXTENSIONS:
        try:
            importlib.import_module(name)
            status[name] = True
        except Exception:
            status[name] = False
    return status


def apex_build_info() -> dict | None:
    """The marker build_apex.sh writes after a verified build, or None."""
    try:
        return json.loads((apex_workdir() / "installed.json").read_text())
    except (OSError, ValueError):
        return None


@cache
def legacy_amp_available() -> bool:
    """True when the isolated legacy install imports ``apex.amp`` in a child process."""
    path = legacy_amp_dir()
    if not path.is_dir():
        return False
    paths = [str(path), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    probe = subprocess.run([sys.executable, "-c", "from apex import amp"], env=env,
                           capture_output=True, timeout=120)
    return probe.returncode == 0


# ------------------------------------------------------------------ the one skip
FP8_CAPABILITY = (8, 9)  # Ada (8.9) and Hopper (9.0) run FP8 matrix products on tensor cores


def fp8_missing() -> str:
    """What FP8 matrix products need and this machine lacks, as one clause ('' if nothing)."""
    want = "FP8 tensor cores (compute capability 8.9 or newer: Ada, Hopper)"
    if not cuda_available():
        return f"a CUDA GPU with {want}"
    major, minor = capability()
    if (major, minor) < FP8_CAPABILITY:
        return f"a GPU with {want}; this one is {major}.{minor}"
    return ""


def missing(*, cuda: bool = False, bf16: bool = False, apex: tuple[str, ...] = (),
            legacy_amp: bool = False, fp8: bool = False, lacking: str = "") -> str:
    """What a cell needs and this machine lacks, with the fix, as one clause ('' if nothing).
    ``lacking`` is a chapter's own clause to add, e.g. ``fp8.torchao_lack()``."""
    lacks: list[str] = [lacking] if lacking else []
    if fp8 and (hardware := fp8_missing()):
        lacks.append(hardware)
    if (cuda or bf16 or apex or legacy_amp) and not cuda_available():
        lacks.append("a CUDA GPU")
    elif bf16 and not bf16_supported():
        lacks.append("a GPU with bf16 (compute capability 8.0+)")
    if apex and cuda_available():
        status = apex_extension_status()
        absent = [name for name in apex if not status.get(name, False)]
        if absent:
            wrong = wrong_apex()
            if wrong:
                lacks.append(f"NVIDIA Apex, but `apex` here is the unrelated {wrong} - "
                             f"pip uninstall apex, then {BUILD_HINT}")
            else:
                what = "Apex" if not apex_importable() else "Apex's compiled extension(s)"
                lacks.append(f"{what} {', '.join(absent)} - {BUILD_HINT}")
    if legacy_amp and cuda_available() and not legacy_amp_available():
        lacks.append(f"the legacy apex.amp install in {legacy_amp_dir()} - "
                     "run ./build_apex.sh --legacy-only")
    return "; and ".join(lacks)


def needs(**requirements) -> bool:
    """True when every requirement holds; otherwise print one line saying what the cell needs
    and how to get it, and return False. Use as ``if machine.needs(cuda=True): ...``."""
    lacks = missing(**requirements)
    if lacks:
        print(f"Skipped: this cell needs {lacks}.")
        return False
    return True


# --- the run profile ----------------------------------------------------------------------

PROFILE_VAR = "COURSE_PROFILE"
HEADLESS_VAR = "COURSE_HEADLESS"
# Rehearse a smaller card on a bigger one: COURSE_GPU_MEMORY_GIB=15 caps what this process may
# allocate (torch.cuda.set_per_process_memory_fraction); every size rule reads the capped value.
MEMORY_VAR = "COURSE_GPU_MEMORY_GIB"
NAMES = ("smoke", "full")

T = TypeVar("T")


class ProfileError(SystemExit):
    """A profile name the course does not know or cannot honour. A SystemExit, so that a
    notebook stops on its one sentence (IPython shows no traceback for it)."""

    def __str__(self) -> str:
        return str(self.code)


@dataclass(frozen=True)
class Profile:
    """The chosen profile, the device the notebook runs on and whether it runs headless."""

    name: str
    device: str
    headless: bool = False
    memory_cap: str = ""  # the line cap_gpu_memory() said, when a cap is set

    @property
    def is_full(self) -> bool:
        """True for the course sizes."""
        return self.name == "full"

    @property
    def has_cuda(self) -> bool:
        """True when the notebook runs on a CUDA GPU."""
        return self.device == "cuda"

    @property
    def show_progress(self) -> bool:
        """Progress bars only for interactive full-size runs."""
        return self.is_full and not self.headless

    def pick(self, smoke: T, full: T) -> T:
        """Return the value for this profile: ``profile.pick(smoke=64, full=8192)``."""
        return full if self.is_full else smoke

    def progress(self, iterable: Iterable | None = None, *, desc: str = "",
                 total: int | None = None, **kwargs: Any):
        """A tqdm bar, shown only in interactive full-size runs (quiet headless and in smoke).

        Interactive runs get ``tqdm.auto`` (a widget in Jupyter when ipywidgets is installed,
        text otherwise); quiet runs get a disabled plain bar, so no widget warning is printed."""
        from tqdm import std

        if not self.show_progress:
            return std.tqdm(iterable, desc=desc, total=total, disable=True, **kwargs)
        from tqdm.auto import tqdm  # imported only here: it warns when ipywidgets is missing

        return tqdm(iterable, desc=desc, total=total, leave=False, **kwargs)

    def describe(self) -> str:
        """One line for the notebook header."""
        where = "a CUDA GPU" if self.has_cuda else "the CPU"
        how = "headless" if self.headless else "interactive"
        line = f"profile '{self.name}' on {where} ({how})"
        if not self.has_cuda:
            line += ": no CUDA GPU here, so sizes are tiny and GPU-only cells are skipped"
        if self.memory_cap:
            line += f"\n{self.memory_cap}"
        return line


def cap_gpu_memory(device: int = 0) -> str:
    """Apply ``$COURSE_GPU_MEMORY_GIB`` to this process's CUDA allocator; '' when it is unset,
    else the one line that says what was capped. A value that is no positive number is refused
    in one sentence (:class:`ProfileError`)."""
    raw = os.environ.get(MEMORY_VAR, "").strip()
    if not raw:
        return ""
    try:
        gib = float(raw)
    except ValueError:
        gib = float("nan")
    if not gib > 0:
        raise ProfileError(f"{MEMORY_VAR}={raw!r} is not a positive number of GiB: unset it, "
                           f"or set e.g. {MEMORY_VAR}=15 to rehearse a 16 GB card")
    total = torch.cuda.get_device_properties(device).total_memory / 2**30
    fraction = min(1.0, gib / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return (f"GPU memory capped at {fraction * total:.1f} GiB of this GPU's {total:.1f} GiB "
            f"({MEMORY_VAR}={raw}; allocations beyond it fail as on a smaller card)")


def resolve(requested: str | None = None, *, cuda: bool | None = None) -> Profile:
    """Choose the profile.

    Precedence: an explicit ``requested`` name (the notebook's parameters cell, or papermill),
    then the ``COURSE_PROFILE`` environment variable, then ``auto``: ``full`` on CUDA, ``smoke``
    otherwise. ``full`` without a CUDA GPU is refused with a clear message.
    """
    if cuda is None:
        cuda = cuda_available()
    name = (requested or "").strip().lower()
    if name in ("", "auto"):
        name = os.environ.get(PROFILE_VAR, "").strip().lower() or "auto"
    if name == "auto":
        name = "full" if cuda else "smoke"
    if name not in NAMES:
        raise ProfileError(
            f"unknown profile '{name}': use one of {', '.join(NAMES)} or 'auto' "
            f"(set {PROFILE_VAR}=smoke, or profile = 'smoke' in the parameters cell)"
        )
    if name == "full" and not cuda:
        raise ProfileError(
            "the 'full' profile needs a CUDA GPU and none is visible to torch; "
            f"use {PROFILE_VAR}=smoke (or 'auto') on this machine"
        )
    headless = os.environ.get(HEADLESS_VAR, "") == "1"
    memory_cap = cap_gpu_memory() if cuda else ""
    return Profile(name=name, device="cuda" if cuda else "cpu", headless=headless,
                   memory_cap=memory_cap)
