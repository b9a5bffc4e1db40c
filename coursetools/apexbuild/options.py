"""The command line and the environment variables: ``--help``'s text, the options, and every
setting the run takes from the environment (checked here, before anything else: a usage error
exits 2), plus the paths under ``$APEX_WORKDIR`` and the PYTHONPATH the build sees."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field

from coursetools.apexbuild import constants as c
from coursetools.apexbuild.console import Stop


def usage() -> str:
    """The text of ``--help``."""
    n, course_cpu, course_wall = c.EST_CPUS, c.EST_COURSE_EXT_CPU_S, c.EST_COURSE_EXT_WALL_S
    full_cpu, full_wall = c.EST_FULL_CPU_S, c.EST_FULL_WALL_S
    return f"""\
Usage: ./{c.PROG} [--dry-run] [--force] [--course-only] [--legacy-amp | --legacy-only] [--help]

Builds NVIDIA Apex from {c.APEX_URL} at a pinned commit with its C++ and CUDA
extensions (APEX_CPP_EXT=1 APEX_CUDA_EXT=1 pip install -v --no-build-isolation --no-deps .)
into the Python environment of $PYTHON, then verifies it on the GPU.

Options:
  --help, -h      Show this help and exit.
  --dry-run       Run every preflight check and print the whole plan (source, commit, python,
                  pip, torch, CUDA_HOME, nvcc version, ninja, arch list, jobs, build-time
                  estimate, install targets); clone, build and install nothing. A check that
                  fails is shown in the plan as "FAIL <check>: <what is wrong and the fix>"
                  (one that cannot run without it as "not checked"), the first failure is
                  also printed as the error a real run would stop with, and the exit code is
                  that failure's (3). Without --dry-run the first failing check stops the
                  script at once.
  --force         Rebuild even if the same verified commit is already installed.
  --course-only   Build only the extensions the course uses ({c.course_extensions_text()}),
                  about 2.8x less CPU time than the full build (see the estimate below):
                  the choice for a machine with few CPUs. Apex's setup.py has no option for
                  this, so the script filters its extension list in the staged copy it builds
                  (the source folder itself is never changed); other fused kernels of Apex
                  (fused dense, MLP, softmax, ...) are then absent.
  --legacy-amp    Additionally install the legacy commit (the last one with apex.amp)
                  Python-only into $APEX_WORKDIR/legacy-amp. It never shadows the main
                  Apex: use it only via PYTHONPATH of a child process, e.g.
                  PYTHONPATH=.apex/legacy-amp python -c 'from apex import amp'
  --legacy-only   Only do the legacy install. Needs python, a CUDA build of torch and
                  pip; no nvcc and no visible GPU (nothing is compiled).

Environment:
  PYTHON               Python interpreter to build for. Default: the course's
                       <repo>/.venv/bin/python when it exists (what `make` creates), else
                       python3 on PATH; the plan's python line says which.
  APEX_REF             Full 40-hex commit to build
                       (default: {c.PINNED_REF}).
  APEX_SRC             Local Apex source folder to use instead of cloning. A git checkout
                       must have HEAD == APEX_REF; a plain folder without .git cannot be
                       verified and APEX_REF is recorded as given.
  APEX_LEGACY_REF      Legacy commit (default: {c.LEGACY_PINNED_REF}).
  APEX_LEGACY_SRC      Local legacy source folder, same rules as APEX_SRC.
  APEX_WORKDIR         Clones, build logs and marker files (default: <repo>/.apex).
  TORCH_CUDA_ARCH_LIST Compute capabilities to build for, e.g. "8.0;9.0". Default: the
                       distinct capabilities of the visible GPUs.
  APEX_JOBS            Total parallel compile jobs (default: min(CPUs, free GiB / {c.GIB_PER_JOB})).
                       Split into APEX_PARALLEL_BUILD (extensions at once, at most
                       {c.MAX_PARALLEL_EXT}) x MAX_JOBS (ninja jobs per extension); both are set by
                       this script.
  CUDA_HOME            Toolkit to use; nvcc is looked up in $CUDA_HOME/bin, then
                       $CONDA_PREFIX/bin, then PATH. CUDA_HOME is exported for the build.
  NVCC_APPEND_FLAGS    Passed through to nvcc unchanged.

Build-time estimate (printed before a build and in the plan; an estimate, not a measurement),
from builds on {n}-CPU NVIDIA H200 machines (2026-12-01), one architecture each: the CPU time
a build took there x architectures / jobs, where jobs = min(CPUs, APEX_PARALLEL_BUILD x
MAX_JOBS), and never less than the wall time it took there x architectures; without a GPU
or TORCH_CUDA_ARCH_LIST (a dry run on a CPU machine) for one architecture, as it says:
  --course-only     {course_cpu} CPU-s, {course_wall} s wall (the three extensions)
  full build        {full_cpu} CPU-s, {full_wall} s wall (about 30 extensions; the default)

Files (under $APEX_WORKDIR):
  src/apex, src/apex-legacy  source trees that are built
  build.log, legacy-build.log, verify.log
  installed.json         written after a verified build (commit, torch, CUDA, arch, ...)
  legacy-amp/            the legacy apex.amp install (PYTHONPATH only)
  legacy-installed.json  written after the legacy install is verified

Exit codes:
  0  success (or already built and verified; for --dry-run: every check passed)
  2  usage error (unknown option, malformed APEX_REF/APEX_JOBS)
  3  preflight failed (missing python/torch/nvcc/pip/ninja/GPU, version mismatch,
     APEX_SRC not at APEX_REF); --dry-run exits 3 too, after printing the whole plan
  4  fetching or building Apex failed (see the build log)
  5  verification of the installed Apex failed
"""


def usage_error(message: str) -> None:
    """Print ``build_apex.sh: MESSAGE`` and the --help hint to stderr; stop with status 2."""
    print(f"{c.PROG}: {message}", file=sys.stderr)
    print(f"Try ./{c.PROG} --help", file=sys.stderr)
    raise Stop(2)


def shell_pwd(env: dict[str, str]) -> str:
    """The working directory as the shell names it: ``$PWD`` when that is this directory (it may
    go through a symlink), else the physical path."""
    pwd = env.get("PWD", "")
    try:
        if pwd.startswith("/") and os.path.samefile(pwd, "."):
            return pwd
    except OSError:
        pass
    return os.getcwd()


def env_in(env: dict[str, str], folder: str, **extra: str) -> dict[str, str]:
    """``env`` for a child run in ``folder``: its ``PWD`` names that folder, as after a shell's
    ``cd FOLDER``, plus ``extra``."""
    return dict(env, PWD=os.path.normpath(folder), **extra)


def clean_pythonpath(pythonpath: str, legacy_dir: str, pwd: str) -> str:
    """``pythonpath`` without the legacy folder (as given, relative, with ``/./`` or a trailing
    slash) and without empty entries: the legacy apex.amp must never leak into the main
    build or its verification through the caller's PYTHONPATH."""
    kept = []
    for entry in pythonpath.split("\n", 1)[0].split(":"):
        if not entry:
            continue
        absolute = entry if entry.startswith("/") else f"{pwd}/{entry}"
        absolute = absolute.replace("/./", "/")
        if (absolute[:-1] if absolute.endswith("/") else absolute) == legacy_dir:
            continue
        kept.append(entry)
    return ":".join(kept)


def _ref(value: str) -> str:
    """A commit as given, with A-F lowered (``tr 'A-F' 'a-f'``) and trailing newlines dropped."""
    return value.rstrip("\n").translate(str.maketrans("ABCDEF", "abcdef"))


@dataclass
class Options:
    """One run's settings: the options, the environment's, and what follows from them."""

    root: str
    env: dict[str, str]
    pwd: str
    dry_run: bool = False
    force: bool = False
    want_main: bool = True
    want_legacy: bool = False
    course_only: bool = False
    python: str = ""
    python_source: str = ""
    apex_ref: str = ""
    legacy_ref: str = ""
    apex_src: str = ""
    legacy_src: str = ""
    workdir: str = ""
    apex_jobs: str = ""
    clean_pythonpath: str = ""
    torch_pin: str = field(default="")
    ninja_pin: str = field(default="")

    @property
    def marker(self) -> str:
        return f"{self.workdir}/installed.json"

    @property
    def legacy_dir(self) -> str:
        return f"{self.workdir}/legacy-amp"

    @property
    def legacy_marker(self) -> str:
        return f"{self.workdir}/legacy-installed.json"

    @property
    def build_log(self) -> str:
        return f"{self.workdir}/build.log"

    @property
    def legacy_log(self) -> str:
        return f"{self.workdir}/legacy-build.log"

    @property
    def verify_log(self) -> str:
        return f"{self.workdir}/verify.log"


def parse(argv: list[str], env: dict[str, str], root: str) -> Options:
    """The options of ``argv`` and the settings of ``env``; ``--help`` prints the usage and stops
    with 0, a usage error stops with 2 (the first of them in the order of the arguments)."""
    opts = Options(root=root, env=env, pwd=shell_pwd(env))
    env["PWD"] = opts.pwd  # what every child of a shell gets
    for arg in argv:
        if arg in ("-h", "--help"):
            sys.stdout.write(usage())
            raise Stop(0)
        elif arg == "--dry-run":
            opts.dry_run = True
        elif arg == "--force":
            opts.force = True
        elif arg == "--legacy-amp":
            opts.want_legacy = True
        elif arg == "--course-only":
            opts.course_only = True
        elif arg == "--legacy-only":
            opts.want_legacy, opts.want_main = True, False
        else:
            usage_error(f"unknown option: {arg}")

    # The course's .venv (built by `make`) when PYTHON is not set, else python3 on PATH.
    venv_python = f"{root}/.venv/bin/python"
    if env.get("PYTHON"):
        opts.python, opts.python_source = env["PYTHON"], "from PYTHON"
    elif os.path.isfile(venv_python) and os.access(venv_python, os.X_OK):
        opts.python, opts.python_source = venv_python, "the course's .venv; PYTHON is unset"
    else:
        opts.python = "python3"
        opts.python_source = "python3 on PATH; PYTHON is unset and there is no .venv"
    opts.apex_ref = _ref(env.get("APEX_REF") or c.PINNED_REF)
    opts.legacy_ref = _ref(env.get("APEX_LEGACY_REF") or c.LEGACY_PINNED_REF)
    opts.apex_src = env.get("APEX_SRC", "")
    opts.legacy_src = env.get("APEX_LEGACY_SRC", "")
    opts.workdir = env.get("APEX_WORKDIR") or f"{root}/.apex"
    opts.apex_jobs = env.get("APEX_JOBS", "")
    if not re.fullmatch(r"[0-9a-f]{40}", opts.apex_ref):
        usage_error(f"APEX_REF must be a full 40-hex commit SHA, got '{opts.apex_ref}'")
    if not re.fullmatch(r"[0-9a-f]{40}", opts.legacy_ref):
        usage_error(f"APEX_LEGACY_REF must be a full 40-hex commit SHA, got '{opts.legacy_ref}'")
    if opts.apex_jobs and not re.fullmatch(r"[1-9][0-9]*", opts.apex_jobs):
        usage_error(f"APEX_JOBS must be a positive integer, got '{opts.apex_jobs}'")
    if not opts.workdir.startswith("/"):
        opts.workdir = f"{opts.pwd}/{opts.workdir}"
    opts.clean_pythonpath = clean_pythonpath(env.get("PYTHONPATH", ""), opts.legacy_dir, opts.pwd)
    opts.torch_pin = c.req_pin(root, "torch", c.DEFAULT_TORCH_PIN)
    opts.ninja_pin = c.req_pin(root, "ninja", c.DEFAULT_NINJA_PIN)
    return opts
