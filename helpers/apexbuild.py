"""Building Apex from a notebook: what the toolchain here offers (torch's CUDA, nvcc, ninja,
a GPU), found the way ``build_apex.sh`` finds it, and running that script with its output
streamed into the notebook."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from helpers import gpu
from helpers.results import repo_root


def find_nvcc() -> Path | None:
    """nvcc where build_apex.sh looks: ``$CUDA_HOME/bin``, ``$CONDA_PREFIX/bin``, then PATH."""
    for var in ("CUDA_HOME", "CONDA_PREFIX"):
        base = os.environ.get(var)
        if base and os.access(Path(base) / "bin" / "nvcc", os.X_OK):
            return Path(base) / "bin" / "nvcc"
    found = shutil.which("nvcc")
    return Path(found) if found else None


def nvcc_release(nvcc: Path | None) -> str | None:
    """The ``major.minor`` CUDA release that ``nvcc --version`` reports, or None."""
    if nvcc is None:
        return None
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+\.\d+)", out.stdout)
    return match.group(1) if match else None


def toolchain() -> dict:
    """What building Apex needs here: torch's CUDA, nvcc and its release, ninja, a GPU."""
    nvcc = find_nvcc()
    release = nvcc_release(nvcc)
    torch_cuda = torch.version.cuda
    torch_mm = ".".join(torch_cuda.split(".")[:2]) if torch_cuda else None
    try:
        import ninja  # noqa: F401

        has_ninja = True
    except ImportError:
        has_ninja = shutil.which("ninja") is not None
    return {
        "torch_cuda": torch_cuda,
        "nvcc": str(nvcc) if nvcc else None,
        "nvcc_release": release,
        "nvcc_matches_torch": bool(release and torch_mm and release == torch_mm),
        "ninja": has_ninja,
        "gpu": gpu.cuda_available(),
    }


def build_script() -> Path:
    """``build_apex.sh`` at the root of the course checkout (or the working directory)."""
    root = repo_root()
    return (root if root is not None else Path.cwd()) / "build_apex.sh"


def run_build_script(args: Sequence[str] = (), *, script: Path | None = None,
                     timeout: float | None = None, echo: Callable[[str], None] = print) -> int:
    """Run ``build_apex.sh ARGS`` for this Python (``PYTHON=sys.executable``), streaming its
    output line by line through ``echo``; return its exit status (124 after ``timeout``)."""
    script = Path(script) if script is not None else build_script()
    if not script.is_file():
        echo(f"{script} is missing: run this from a full checkout of the course.")
        return 127
    env = dict(os.environ, PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    # Its own process group, so that a timeout or an interrupt also stops pip, ninja and nvcc.
    proc = subprocess.Popen(["bash", str(script), *args], cwd=script.parent, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    timer = threading.Timer(timeout, _stop, (proc,)) if timeout else None
    if timer is not None:
        timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            echo(line.rstrip("\n"))
        rc = proc.wait()
    except BaseException:  # KeyboardInterrupt from the notebook's stop button
        _stop(proc)
        raise
    finally:
        if timer is not None:
            timer.cancel()
    if timeout and rc < 0:
        echo(f"{script.name} {' '.join(args)} was stopped after {timeout:.0f} s.")
        return 124
    return rc


def _stop(proc: subprocess.Popen) -> None:
    """Kill the process group that ``proc`` leads (the script and everything it started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# What each exit status of build_apex.sh means (its --help lists the same codes).
EXIT_CODES = {
    0: "exit 0: done - for --dry-run, the plan above is what a build would do; nothing was touched",
    2: "exit 2: usage error - an unknown option or a malformed APEX_REF / APEX_JOBS (see --help)",
    3: "exit 3: preflight stopped before touching anything; the error line above names what is "
       "missing and the command that fixes it",
    4: "exit 4: fetching or compiling Apex failed; the last lines of .apex/build.log are above",
    5: "exit 5: Apex installed but failed its check on the GPU; see .apex/verify.log, then "
       "rebuild with ./build_apex.sh --force",
    124: "stopped: it ran past its time limit",
    127: "not run: build_apex.sh was not found",
}


def explain_exit(rc: int) -> str:
    """One sentence for an exit status of ``build_apex.sh``."""
    return EXIT_CODES.get(rc, f"exit {rc}: unexpected; read the output above")


def readiness_table(env: dict, tools: dict | None = None):
    """What this machine offers for running and building Apex, one check per row."""
    import pandas as pd

    tools = tools if tools is not None else toolchain()
    nvcc = f"CUDA {tools['nvcc_release']} at {tools['nvcc']}" if tools["nvcc"] else "not found"
    rows = [
        ("torch's CUDA", tools["torch_cuda"] or "none (CPU build of torch)",
         "the CUDA release torch was built with; Apex must be compiled with the same"),
        ("GPU", env.get("gpu_name") or "none visible to torch",
         "Apex's fused kernels run only on a CUDA GPU"),
        ("compute capability", env.get("gpu_capability") or "-",
         "the architecture Apex compiles for (TORCH_CUDA_ARCH_LIST)"),
        ("bf16 native", bool(env.get("bf16_supported")),
         "capability 8.0+: bf16 mixed precision without loss scaling"),
        ("driver", env.get("driver") or "-",
         "runs every CUDA program; must support torch's CUDA release (nvidia-smi shows it)"),
        ("nvcc (toolkit)", nvcc, "the compiler: needed only to build Apex, not to run it"),
        ("nvcc matches torch", tools["nvcc_matches_torch"],
         "Apex's setup.py refuses an nvcc whose major.minor differs from torch's CUDA"),
        ("ninja", tools["ninja"], "parallel compiles; without it the build is serial and slow"),
    ]
    return pd.DataFrame(rows, columns=["check", "here", "why_it_matters"])
