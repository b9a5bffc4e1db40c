"""The run profile this machine gets: ``smoke`` (tiny sizes in seconds on a CPU) or ``full``
(the course sizes on a GPU), chosen by :func:`resolve`; the progress bars; and the GPU memory
cap that rehearses a smaller card (:func:`cap_gpu_memory`)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from helpers import machine
from helpers.errors import CourseError
from helpers.settings import HEADLESS_VAR, MEMORY_VAR, PROFILE_VAR

NAMES = ("smoke", "full")

T = TypeVar("T")


class ProfileError(CourseError):
    """A profile name the course does not know or cannot honour (one sentence)."""


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
        cuda = machine.cuda_available()
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
