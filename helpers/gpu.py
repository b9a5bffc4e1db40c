"""What this machine can run - CUDA, bf16, Apex's compiled extensions, legacy apex.amp - and
the one-line skip every GPU-only notebook cell uses."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import torch

from helpers.results import repo_root

# Apex's compiled extensions the course relies on, and what each one provides.
APEX_EXTENSIONS: dict[str, str] = {
    "amp_C": "multi-tensor apply kernels (FusedAdam, FusedSGD, FusedLAMB, fused grad scaling)",
    "apex_C": "flatten/unflatten of tensor lists (C++)",
    "fused_layer_norm_cuda": "FusedLayerNorm, FusedRMSNorm and their Mixed variants",
}

BUILD_HINT = "build it with ./build_apex.sh (see notebook 01)"


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


def cuda_available() -> bool:
    """True when torch sees a CUDA GPU."""
    return bool(torch.cuda.is_available())


def bf16_supported() -> bool:
    """True on a CUDA GPU with native bf16 (compute capability 8.0 or newer)."""
    return cuda_available() and torch.cuda.get_device_capability()[0] >= 8


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
    marker = apex_workdir() / "installed.json"
    try:
        return json.loads(marker.read_text())
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


def needs(*, cuda: bool = False, bf16: bool = False, apex: tuple[str, ...] = (),
          legacy_amp: bool = False) -> bool:
    """Return True when every requirement holds; otherwise print one line saying what the cell
    needs and how to get it, and return False. Use as ``if needs(cuda=True): ...``."""
    missing: list[str] = []
    if (cuda or bf16 or apex or legacy_amp) and not cuda_available():
        missing.append("a CUDA GPU")
    elif bf16 and not bf16_supported():
        missing.append("a GPU with bf16 (compute capability 8.0+)")
    if apex and cuda_available():
        status = apex_extension_status()
        absent = [name for name in apex if not status.get(name, False)]
        if absent:
            what = "Apex" if not apex_importable() else "Apex's compiled extension(s)"
            missing.append(f"{what} {', '.join(absent)} - {BUILD_HINT}")
    if legacy_amp and cuda_available() and not legacy_amp_available():
        missing.append(f"the legacy apex.amp install in {legacy_amp_dir()} - "
                       "run ./build_apex.sh --legacy-only")
    if missing:
        print("Skipped: this cell needs " + "; and ".join(missing) + ".")
        return False
    return True


def device() -> torch.device:
    """The course's device: the current CUDA GPU if any, else the CPU."""
    return torch.device("cuda" if cuda_available() else "cpu")
