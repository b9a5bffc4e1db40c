"""What the build is pinned to: the Apex commits, the minimum pip, the job budget, the figures
of the build-time estimate (with where they come from), and the versions the install hints
name (the pins of requirements.txt where it names the package)."""

from __future__ import annotations

import os
import re

PROG = "build_apex.sh"
APEX_URL = "https://github.com/NVIDIA/apex"
# Builds against torch 2.11 + CUDA 13.0 (upstream, 2026-07-08).
PINNED_REF = "6424da3b4faa6c8f062da4a48c424fff3f02d42d"
# Last upstream commit that still ships apex.amp (removed on 2025-05-08).
LEGACY_PINNED_REF = "e13873debc4699d39c6861074b9a3b2a02327f92"
MIN_PIP = "23.1"
GIB_PER_JOB = 4  # memory budget per parallel nvcc/ninja job
MAX_PARALLEL_EXT = 8  # extensions compiled at once (APEX_PARALLEL_BUILD cap)

# Build-time figures for the estimate printed before a build, from builds on NVIDIA H200 machines
# with 16 CPUs (TORCH_CUDA_ARCH_LIST=9.0a, torch 2.11 + CUDA 13.0), timed with bash's `time`:
# - the three extensions the course uses (amp_C, apex_C, fused_layer_norm_cuda), three builds on
#   2026-12-01: with --course-only as it is now (APEX_PARALLEL_BUILD=3 MAX_JOBS=5), 496 s user +
#   42 s sys of CPU time and 117 s wall - the figures used below; before that, with --course-only
#   still spreading its jobs as for 8 extensions (2 each), 598 s user + 47 s sys and 248 s wall;
#   and with all 48 jobs on them, 541 s user + 45 s sys and 126 s wall;
# - the full core build (APEX_CPP_EXT=1 APEX_CUDA_EXT=1, about 30 extensions, the default),
#   APEX_PARALLEL_BUILD=8 MAX_JOBS=2, one build on 2026-12-01: 246 s wall, 1417 s user + 103 s
#   sys of CPU time.
EST_CPUS = 16  # CPUs of the machine the figures come from
EST_COURSE_EXT_CPU_S = 538  # CPU-seconds (496 user + 42 sys, --course-only) per architecture
EST_COURSE_EXT_WALL_S = 117  # its wall seconds per architecture (the model's floor)
EST_FULL_CPU_S = 1520  # full build: CPU-seconds (1417 user + 103 sys) per architecture
EST_FULL_WALL_S = 246  # full build: wall seconds per architecture (its floor)
# The extensions the course imports: what --course-only builds, and what verification checks.
COURSE_EXTENSIONS = "amp_C,apex_C,fused_layer_norm_cuda"

# Versions that the install hints pin where requirements.txt does not name the package.
COURSE_CUDA = "13.0"  # CUDA of the torch wheels the hints point at (cu130)
DEFAULT_TORCH_PIN = "2.13.0"
DEFAULT_NINJA_PIN = "1.13.0"
PIP_PIN = "26.3"
SETUPTOOLS_PIN = "84.2.1"
PACKAGING_PIN = "26.3"
WHEEL_PIN = "0.48.0"


def req_pin(root: str, name: str, default: str) -> str:
    """The exact version ``root/requirements.txt`` pins for ``name`` (its first line that starts
    ``name==``, up to a blank, ``#`` or ``;``), else ``default``."""
    path = os.path.join(root, "requirements.txt")
    if not os.path.isfile(path):
        return default
    with open(path, encoding="latin-1", newline="") as fh:
        lines = fh.read().split("\n")
    pattern = re.compile(rf"{re.escape(name)}==([^ \t\n\r\f\v#;]*)")
    for line in lines:
        match = pattern.match(line)
        if match:
            return match.group(1) or default
    return default


def course_extensions_text() -> str:
    """``amp_C, apex_C, fused_layer_norm_cuda``: the extensions as the messages list them."""
    return COURSE_EXTENSIONS.replace(",", ", ")
