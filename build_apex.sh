#!/usr/bin/env bash
# build_apex.sh - build NVIDIA Apex (C++/CUDA extensions) from a pinned git commit for the
# course environment, verify it, and optionally install the legacy `apex.amp` Python-only
# into a separate folder that is only ever used through PYTHONPATH.
#
# Apex is not on PyPI (the `apex` package there is unrelated), so it is built from source.
# Every environment problem is caught by one Python probe BEFORE anything is cloned or built.
# Run `./build_apex.sh --help` for options, environment variables and exit codes.
set -euo pipefail

readonly PROG="build_apex.sh"
readonly APEX_URL="https://github.com/NVIDIA/apex"
# Builds against torch 2.11 + CUDA 13.0 (upstream, 2026-07-08).
readonly PINNED_REF="6424da3b4faa6c8f062da4a48c424fff3f02d42d"
# Last upstream commit that still ships apex.amp (removed on 2025-05-08).
readonly LEGACY_PINNED_REF="e13873debc4699d39c6861074b9a3b2a02327f92"
readonly MIN_PIP="23.1"
readonly GIB_PER_JOB=4       # memory budget per parallel nvcc/ninja job
readonly MAX_PARALLEL_EXT=8  # extensions compiled at once (APEX_PARALLEL_BUILD cap)

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
readonly EST_CPUS=16                 # CPUs of the machine the figures come from
readonly EST_COURSE_EXT_CPU_S=538    # CPU-seconds (496 user + 42 sys, --course-only) per architecture
readonly EST_COURSE_EXT_WALL_S=117   # its wall seconds per architecture (the model's floor)
readonly EST_FULL_CPU_S=1520         # full build: CPU-seconds (1417 user + 103 sys) per architecture
readonly EST_FULL_WALL_S=246         # full build: wall seconds per architecture (its floor)
# The extensions the course imports: what --course-only builds, and what verification checks.
readonly COURSE_EXTENSIONS="amp_C,apex_C,fused_layer_norm_cuda"

# Versions that the install hints pin where requirements.txt does not name the package.
readonly COURSE_CUDA="13.0"          # CUDA of the torch wheels the hints point at (cu130)
readonly DEFAULT_TORCH_PIN="2.13.0"
readonly DEFAULT_NINJA_PIN="1.13.0"
readonly PIP_PIN="26.3"
readonly SETUPTOOLS_PIN="84.2.1" PACKAGING_PIN="26.3" WHEEL_PIN="0.48.0"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly REPO_ROOT

# req_pin NAME DEFAULT: the exact version requirements.txt pins for NAME (NAME==X), else DEFAULT.
req_pin() {
    local pin=""
    if [[ -f "$REPO_ROOT/requirements.txt" ]]; then
        pin="$(sed -n "s/^$1==\([^[:space:]#;]*\).*/\1/p" "$REPO_ROOT/requirements.txt" | head -n 1)"
    fi
    printf '%s' "${pin:-$2}"
}
TORCH_PIN="$(req_pin torch "$DEFAULT_TORCH_PIN")"
NINJA_PIN="$(req_pin ninja "$DEFAULT_NINJA_PIN")"
readonly TORCH_PIN NINJA_PIN

usage() {
    cat <<EOF
Usage: ./$PROG [--dry-run] [--force] [--course-only] [--legacy-amp | --legacy-only] [--help]

Builds NVIDIA Apex from $APEX_URL at a pinned commit with its C++ and CUDA
extensions (APEX_CPP_EXT=1 APEX_CUDA_EXT=1 pip install -v --no-build-isolation --no-deps .)
into the Python environment of \$PYTHON, then verifies it on the GPU.

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
  --course-only   Build only the extensions the course uses (${COURSE_EXTENSIONS//,/, }),
                  about 2.8x less CPU time than the full build (see the estimate below):
                  the choice for a machine with few CPUs. Apex's setup.py has no option for
                  this, so the script filters its extension list in the staged copy it builds
                  (the source folder itself is never changed); other fused kernels of Apex
                  (fused dense, MLP, softmax, ...) are then absent.
  --legacy-amp    Additionally install the legacy commit (the last one with apex.amp)
                  Python-only into \$APEX_WORKDIR/legacy-amp. It never shadows the main
                  Apex: use it only via PYTHONPATH of a child process, e.g.
                  PYTHONPATH=.apex/legacy-amp python -c 'from apex import amp'
  --legacy-only   Only do the legacy install. Needs python, a CUDA build of torch and
                  pip; no nvcc and no visible GPU (nothing is compiled).

Environment:
  PYTHON               Python interpreter to build for. Default: the course's
                       <repo>/.venv/bin/python when it exists (what \`make\` creates), else
                       python3 on PATH; the plan's python line says which.
  APEX_REF             Full 40-hex commit to build
                       (default: $PINNED_REF).
  APEX_SRC             Local Apex source folder to use instead of cloning. A git checkout
                       must have HEAD == APEX_REF; a plain folder without .git cannot be
                       verified and APEX_REF is recorded as given.
  APEX_LEGACY_REF      Legacy commit (default: $LEGACY_PINNED_REF).
  APEX_LEGACY_SRC      Local legacy source folder, same rules as APEX_SRC.
  APEX_WORKDIR         Clones, build logs and marker files (default: <repo>/.apex).
  TORCH_CUDA_ARCH_LIST Compute capabilities to build for, e.g. "8.0;9.0". Default: the
                       distinct capabilities of the visible GPUs.
  APEX_JOBS            Total parallel compile jobs (default: min(CPUs, free GiB / $GIB_PER_JOB)).
                       Split into APEX_PARALLEL_BUILD (extensions at once, at most
                       $MAX_PARALLEL_EXT) x MAX_JOBS (ninja jobs per extension); both are set by
                       this script.
  CUDA_HOME            Toolkit to use; nvcc is looked up in \$CUDA_HOME/bin, then
                       \$CONDA_PREFIX/bin, then PATH. CUDA_HOME is exported for the build.
  NVCC_APPEND_FLAGS    Passed through to nvcc unchanged.

Build-time estimate (printed before a build and in the plan; an estimate, not a measurement),
from builds on $EST_CPUS-CPU NVIDIA H200 machines (2026-12-01), one architecture each: the CPU time
a build took there x architectures / jobs, where jobs = min(CPUs, APEX_PARALLEL_BUILD x
MAX_JOBS), and never less than the wall time it took there x architectures; without a GPU
or TORCH_CUDA_ARCH_LIST (a dry run on a CPU machine) for one architecture, as it says:
  --course-only     $EST_COURSE_EXT_CPU_S CPU-s, ${EST_COURSE_EXT_WALL_S} s wall (the three extensions)
  full build        $EST_FULL_CPU_S CPU-s, ${EST_FULL_WALL_S} s wall (about 30 extensions; the default)

Files (under \$APEX_WORKDIR):
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
EOF
}

say() { printf '%s: %s\n' "$PROG" "$*"; }
warn() { printf '%s: warning: %s\n' "$PROG" "$*" >&2; }
die() { # die CODE MESSAGE
    local code=$1
    shift
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit "$code"
}
usage_error() {
    printf '%s: %s\n' "$PROG" "$*" >&2
    printf 'Try ./%s --help\n' "$PROG" >&2
    exit 2
}

# ---------------------------------------------------------------- options and environment
DRY_RUN=0 FORCE=0 WANT_MAIN=1 WANT_LEGACY=0 COURSE_ONLY=0
for arg in "$@"; do
    case "$arg" in
        -h | --help) usage; exit 0 ;;
        --dry-run) DRY_RUN=1 ;;
        --force) FORCE=1 ;;
        --legacy-amp) WANT_LEGACY=1 ;;
        --course-only) COURSE_ONLY=1 ;;
        --legacy-only) WANT_LEGACY=1 WANT_MAIN=0 ;;
        *) usage_error "unknown option: $arg" ;;
    esac
done

# The course's .venv (built by `make`) when PYTHON is not set, else python3 on PATH.
if [[ -n "${PYTHON:-}" ]]; then
    PYTHON_SOURCE="from PYTHON"
elif [[ -f "$REPO_ROOT/.venv/bin/python" && -x "$REPO_ROOT/.venv/bin/python" ]]; then
    PYTHON="$REPO_ROOT/.venv/bin/python" PYTHON_SOURCE="the course's .venv; PYTHON is unset"
else
    PYTHON="python3" PYTHON_SOURCE="python3 on PATH; PYTHON is unset and there is no .venv"
fi
APEX_REF="$(printf '%s' "${APEX_REF:-$PINNED_REF}" | tr 'A-F' 'a-f')"
APEX_LEGACY_REF="$(printf '%s' "${APEX_LEGACY_REF:-$LEGACY_PINNED_REF}" | tr 'A-F' 'a-f')"
APEX_SRC="${APEX_SRC:-}"
APEX_LEGACY_SRC="${APEX_LEGACY_SRC:-}"
APEX_WORKDIR="${APEX_WORKDIR:-$REPO_ROOT/.apex}"
APEX_JOBS="${APEX_JOBS:-}"
[[ "$APEX_REF" =~ ^[0-9a-f]{40}$ ]] || usage_error "APEX_REF must be a full 40-hex commit SHA, got '$APEX_REF'"
[[ "$APEX_LEGACY_REF" =~ ^[0-9a-f]{40}$ ]] ||
    usage_error "APEX_LEGACY_REF must be a full 40-hex commit SHA, got '$APEX_LEGACY_REF'"
[[ -z "$APEX_JOBS" || "$APEX_JOBS" =~ ^[1-9][0-9]*$ ]] ||
    usage_error "APEX_JOBS must be a positive integer, got '$APEX_JOBS'"
[[ "$APEX_WORKDIR" == /* ]] || APEX_WORKDIR="$PWD/$APEX_WORKDIR"

readonly MARKER="$APEX_WORKDIR/installed.json"
readonly LEGACY_DIR="$APEX_WORKDIR/legacy-amp"
readonly LEGACY_MARKER="$APEX_WORKDIR/legacy-installed.json"
readonly BUILD_LOG="$APEX_WORKDIR/build.log"
readonly LEGACY_LOG="$APEX_WORKDIR/legacy-build.log"
readonly VERIFY_LOG="$APEX_WORKDIR/verify.log"

# Never let the legacy folder leak into the main build/verify through the caller's PYTHONPATH.
CLEAN_PYTHONPATH=""
IFS=':' read -r -a _pp_entries <<<"${PYTHONPATH:-}"
for _pp in "${_pp_entries[@]}"; do
    [[ -n "$_pp" ]] || continue
    _abs="$_pp"
    [[ "$_abs" == /* ]] || _abs="$PWD/$_abs"
    _abs="${_abs//\/.\//\/}"  # a/./b -> a/b
    [[ "${_abs%/}" == "$LEGACY_DIR" ]] && continue
    CLEAN_PYTHONPATH="${CLEAN_PYTHONPATH:+$CLEAN_PYTHONPATH:}$_pp"
done

# ------------------------------------------------------------------ preflight bookkeeping
# check_fail LABEL CODE MESSAGE...: a preflight check failed. A real run dies with MESSAGE at
# once; --dry-run records it, runs the remaining checks and shows it as "FAIL LABEL: MESSAGE"
# in the plan, then exits with the first failure's code (and prints that one as the error).
declare -A FAIL_OF=() SKIP_OF=()
FAIL_COUNT=0 FIRST_FAIL_CODE=0 FIRST_FAIL_MSG=""
check_fail() {
    local label=$1 code=$2
    shift 2
    ((DRY_RUN)) || die "$code" "$@"
    FAIL_OF[$label]="$*"
    FAIL_COUNT=$((FAIL_COUNT + 1))
    if ((FIRST_FAIL_CODE == 0)); then
        FIRST_FAIL_CODE=$code FIRST_FAIL_MSG="$*"
    fi
}
# not_checked LABEL REASON: a check that cannot run because an earlier one failed (dry run).
not_checked() { SKIP_OF[$1]="$2"; }
failed() { [[ -n "${FAIL_OF[$1]:-}" ]]; }

# --------------------------------------------------------------------- environment probe
# (1) python must exist before it can be probed.
PYTHON_BIN="$(command -v "$PYTHON" || true)"
PROBED=0 probe_out=""
if [[ -z "$PYTHON_BIN" ]]; then
    check_fail python 3 "Python interpreter '$PYTHON' was not found, and Apex is" \
        "built for the Python environment that will run the notebooks; activate that environment" \
        "(e.g. \`conda env create -f environment.yml && conda activate <env>\`) or set PYTHON=/path/to/python."
else
    [[ "$PYTHON_BIN" == /* ]] || PYTHON_BIN="$PWD/$PYTHON_BIN"

    # One probe, printing key=value lines; all decisions are made in bash below. nvcc is looked
    # up by the course's one implementation, helpers.environment.find_nvcc (the repo is its argument).
    if probe_out="$("$PYTHON_BIN" - "$REPO_ROOT" <<'PY'
# build_apex.sh environment probe
import os, shutil, sys, sysconfig
def out(key, value):
    print(f"{key}={str(value).replace(chr(10), ' ').strip()}")
out("python_version", sys.version.split()[0])
out("site_packages", sysconfig.get_paths().get("purelib", "?"))
try:
    import pip
    out("pip_version", pip.__version__)
except Exception:
    out("pip_version", "none")
ninja_bin = shutil.which("ninja") or ""
try:
    import ninja
    bin_dir = getattr(ninja, "BIN_DIR", os.path.join(os.path.dirname(ninja.__file__), "data", "bin"))
    ninja_bin = ninja_bin or os.path.join(bin_dir, "ninja")
    has_ninja = True
except Exception:
    has_ninja = bool(ninja_bin)
out("ninja", "yes" if has_ninja else "no")
out("ninja_bin", ninja_bin)
import importlib.util
out("build_deps_missing", ",".join(m for m in ("setuptools", "packaging")
                                   if importlib.util.find_spec(m) is None))
cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
try:  # cgroup v2 CPU quota (containers)
    quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
    if quota != "max":
        cpus = min(cpus, max(1, -(-int(quota) // int(period))))
except Exception:
    pass
out("cpu_count", cpus)
free = None
try:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            free = int(line.split()[1]) * 1024
    limit = open("/sys/fs/cgroup/memory.max").read().strip()
    if limit != "max":  # cgroup v2 memory limit (containers)
        used = int(open("/sys/fs/cgroup/memory.current").read())
        free = min(free or 1 << 62, int(limit) - used)
except Exception:
    pass
out("mem_free_gib", f"{free / 2**30:.1f}" if free is not None else "")
try:
    import torch
except Exception as exc:
    out("torch_error", f"{type(exc).__name__}: {exc}")
else:
    out("torch_version", torch.__version__)
    out("torch_cuda", torch.version.cuda)
    avail = torch.cuda.is_available()
    out("cuda_available", avail)
    count = torch.cuda.device_count() if avail else 0
    out("gpu_count", count)
    caps = []
    for i in range(count):
        major, minor = torch.cuda.get_device_capability(i)
        caps.append(f"{major}.{minor}")
    out("gpu_caps", ",".join(caps))
    try:  # $CUDA_HOME/bin, then $CONDA_PREFIX/bin, then PATH
        sys.path.insert(0, sys.argv[1])
        from helpers.environment import find_nvcc, nvcc_release, nvcc_toolkit
        nvcc = find_nvcc()
        out("nvcc", nvcc or "")
        out("nvcc_release", nvcc_release(nvcc) or "")
        out("nvcc_cuda_home", nvcc_toolkit(nvcc) or "")
    except Exception as exc:
        out("nvcc_error", f"{type(exc).__name__}: {exc}")
PY
    )"; then
        PROBED=1
    else
        check_fail python 3 "'$PYTHON_BIN' failed to run the environment probe, so nothing about" \
            "the environment can be trusted; check that \`$PYTHON -c 'import sys'\` works in this shell."
    fi
fi

declare -A P=()
while IFS='=' read -r key value; do
    [[ -n "$key" ]] && P["$key"]="$value"
done <<<"$probe_out"
p() { printf '%s' "${P[$1]:-}"; }

# version_ge A B: true when dotted version A >= B (numeric major.minor comparison).
version_ge() {
    local a_major a_minor b_major b_minor
    IFS=. read -r a_major a_minor _ <<<"$1."
    IFS=. read -r b_major b_minor _ <<<"$2."
    a_major="${a_major//[!0-9]/}" a_minor="${a_minor//[!0-9]/}"
    b_major="${b_major//[!0-9]/}" b_minor="${b_minor//[!0-9]/}"
    ((${a_major:-0} > ${b_major:-0})) && return 0
    ((${a_major:-0} == ${b_major:-0} && ${a_minor:-0} >= ${b_minor:-0}))
}
major_minor() { sed -n 's/^\([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1.\2/p' <<<"$1"; }

# ------------------------------------------------------------------------------ preflight
# Every check runs in this order; a real run stops at the first failure (check_fail).
NO_PYTHON="needs a working python, see FAIL python"
if ((!PROBED)); then
    for _label in torch pip "build backend" ninja jobs estimate; do
        not_checked "$_label" "$NO_PYTHON"
    done
    if ((WANT_MAIN)); then
        not_checked nvcc "$NO_PYTHON"
        not_checked CUDA_HOME "$NO_PYTHON"
    fi
fi

# (2) torch
TORCH_OK=0 TORCH_VERSION="" TORCH_CUDA="" TORCH_CUDA_MM=""
if ((PROBED)); then
    if [[ -z "$(p torch_error)" && -n "$(p torch_version)" ]]; then
        TORCH_OK=1
        TORCH_VERSION="$(p torch_version)"
        TORCH_CUDA="$(p torch_cuda)"
        [[ "$TORCH_CUDA" == "None" ]] && TORCH_CUDA=""
        TORCH_CUDA_MM="$(major_minor "$TORCH_CUDA")"
    else
        check_fail torch 3 "PyTorch cannot be imported by" \
            "$PYTHON_BIN ($(p torch_error)), and Apex is compiled against and runs on the installed torch;" \
            "install torch with CUDA first, e.g. \`conda env create -f environment.yml\`."
    fi
fi

# (3) CPU-only torch. The legacy install compiles nothing, but its setup.py needs torch's
# CUDA_HOME, which a CPU build of torch leaves unset - and apex.amp's O1-O3 need a GPU anyway.
if ((TORCH_OK)) && [[ -z "$TORCH_CUDA" ]]; then
    if ((WANT_MAIN)); then
        check_fail torch 3 "torch $TORCH_VERSION is a CPU-only build (torch.version.cuda" \
            "is None), but Apex's CUDA kernels need a CUDA build of torch; install one, e.g." \
            "\`conda env create -f environment.yml\` or \`$PYTHON -m pip install torch==$TORCH_PIN" \
            "--index-url https://download.pytorch.org/whl/cu${COURSE_CUDA//./}\`."
    else
        check_fail torch 3 "torch $TORCH_VERSION is a CPU-only build (torch.version.cuda is None): the legacy" \
            "apex.amp install needs a CUDA build of torch (its setup.py reads torch's CUDA_HOME and" \
            "amp.initialize needs a GPU); run it on the GPU machine, e.g. \`make apex\` there."
    fi
fi

# nvcc as the probe found it (helpers.environment.find_nvcc). Sets NVCC, NVCC_CUDA_HOME,
# NVCC_VERSION; without a working lookup the main build stops (the legacy install goes on).
NVCC="" NVCC_CUDA_HOME="" NVCC_VERSION="" NVCC_NOTE=""
find_nvcc() {
    if [[ -n "$(p nvcc_error)" ]]; then
        if ((WANT_MAIN)); then
            check_fail nvcc 3 "the course's nvcc lookup (helpers.environment in $REPO_ROOT)" \
                "failed in $PYTHON_BIN ($(p nvcc_error)), and Apex's CUDA extensions are compiled" \
                "with nvcc; run this script from a full checkout of the course, in its environment."
        else
            warn "could not look for nvcc ($(p nvcc_error)); the legacy install goes on without it"
        fi
        return 0
    fi
    NVCC="$(p nvcc)"
    [[ -n "$NVCC" ]] || return 0
    [[ -n "${CUDA_HOME:-}" && "$NVCC" != "$CUDA_HOME/bin/nvcc" ]] &&
        warn "CUDA_HOME=$CUDA_HOME has no bin/nvcc; using $NVCC instead"
    # Its toolkit (helpers.environment.nvcc_toolkit: where the CUDA headers are, also for a
    # wrapper script such as /usr/local/bin/nvcc), else the folder above its bin.
    NVCC_CUDA_HOME="$(p nvcc_cuda_home)"
    [[ -n "$NVCC_CUDA_HOME" ]] || NVCC_CUDA_HOME="$(cd "$(dirname "$NVCC")/.." && pwd)"
    NVCC_VERSION="$(p nvcc_release)"  # "Cuda compilation tools, release 13.0, V13.0.48" -> 13.0
}

# The plan's CUDA_HOME: the toolkit of the nvcc found, exported for the build only once that nvcc
# has passed its checks; the line says why it is not used otherwise.
PLAN_CUDA_HOME=""
if ((WANT_MAIN)); then
    # (4) nvcc; the toolkit hints name torch's CUDA, or for a CPU-only torch the CUDA of the
    # torch build suggested above.
    want_cuda="${TORCH_CUDA_MM:-$COURSE_CUDA}"
    if ((!TORCH_OK)); then
        ((PROBED)) && not_checked nvcc "the course's nvcc lookup, helpers.environment, imports torch, see FAIL torch"
        ((PROBED)) && not_checked CUDA_HOME "the toolkit of the nvcc found, and nvcc is not looked up, see FAIL torch"
    else
        find_nvcc
        # Until nvcc passes: its toolkit, not used because of the FAIL nvcc line.
        PLAN_CUDA_HOME="${NVCC_CUDA_HOME:-unknown} (the toolkit of ${NVCC:-no nvcc found}, unused until nvcc passes, see FAIL nvcc)"
        if failed nvcc; then
            PLAN_CUDA_HOME="unknown (the course's nvcc lookup failed, see FAIL nvcc)"
        elif [[ -z "$NVCC" ]]; then
            PLAN_CUDA_HOME="unknown (no nvcc found, see FAIL nvcc)"
            check_fail nvcc 3 "no nvcc found (looked in \$CUDA_HOME/bin, \$CONDA_PREFIX/bin and" \
                "PATH), and Apex's CUDA extensions are compiled with nvcc; install the CUDA toolkit" \
                "matching torch's CUDA $want_cuda, e.g. \`conda install -c conda-forge" \
                "cuda-nvcc=$want_cuda cuda-toolkit=$want_cuda\`, or set CUDA_HOME to an installed toolkit."
        # (5) nvcc version == torch.version.cuda (Apex's setup.py raises late otherwise)
        elif [[ -z "$NVCC_VERSION" ]]; then
            check_fail nvcc 3 "could not read the CUDA release from \`$NVCC --version\`," \
                "which Apex's setup.py needs to match torch's CUDA $want_cuda; check that this nvcc" \
                "runs, or set CUDA_HOME to a working CUDA $want_cuda toolkit."
        elif [[ -z "$TORCH_CUDA_MM" ]]; then
            NVCC_NOTE="; not compared with torch, a CPU-only build, see FAIL torch"
            PLAN_CUDA_HOME="$NVCC_CUDA_HOME (the toolkit of $NVCC, unused while torch is a CPU-only build, see FAIL torch)"
        elif [[ "$NVCC_VERSION" != "$TORCH_CUDA_MM" ]]; then
            check_fail nvcc 3 "nvcc at $NVCC is CUDA $NVCC_VERSION but torch" \
                "$TORCH_VERSION was built with CUDA $TORCH_CUDA_MM, and Apex's setup.py refuses mismatched" \
                "versions; install the matching toolkit (\`conda install -c conda-forge" \
                "cuda-nvcc=$TORCH_CUDA_MM cuda-toolkit=$TORCH_CUDA_MM\`) or set CUDA_HOME to a CUDA" \
                "$TORCH_CUDA_MM toolkit."
        else
            export CUDA_HOME="$NVCC_CUDA_HOME"
            PLAN_CUDA_HOME="$CUDA_HOME"
        fi
    fi
elif ((TORCH_OK)); then
    # The legacy Python-only install needs no compiler, but use a real toolkit if there is one.
    find_nvcc
fi

# (6) pip, plus the build backend that --no-build-isolation expects to be present already
PIP_VERSION="$(p pip_version)"
if ((PROBED)); then
    if [[ -z "$PIP_VERSION" || "$PIP_VERSION" == "none" ]]; then
        check_fail pip 3 "pip is not available for $PYTHON_BIN, and Apex is installed with pip;" \
            "install it with \`$PYTHON -m ensurepip --upgrade\`."
    elif ! version_ge "$PIP_VERSION" "$MIN_PIP"; then
        check_fail pip 3 "pip $PIP_VERSION is older than $MIN_PIP, which Apex's" \
            "build instructions require for --no-build-isolation installs with build settings; upgrade it" \
            "with \`$PYTHON -m pip install --upgrade pip==$PIP_PIN\` (any pip >= $MIN_PIP works)."
    fi
    [[ -z "$(p build_deps_missing)" ]] || check_fail "build backend" 3 "the build backend packages" \
        "$(p build_deps_missing) are missing, and --no-build-isolation builds use the installed ones;" \
        "install them with \`$PYTHON -m pip install setuptools==$SETUPTOOLS_PIN packaging==$PACKAGING_PIN" \
        "wheel==$WHEEL_PIN\`."
fi

ARCH_LIST="" ARCH_SOURCE="" JOBS_BUDGET=1 PARALLEL_BUILD=1 NINJA_JOBS=1 JOBS_REASON="" NINJA_BIN=""
CPUS=1 ESTIMATE=""

# minutes SECONDS: whole minutes, rounded, at least 1.
minutes() {
    local m=$((($1 + 30) / 60))
    ((m >= 1)) || m=1
    printf '%s' "$m"
}
# build_estimate ARCH_LIST CPUS JOBS: the estimate sentence, from the EST_* figures at the top.
# Model: a build takes its measured CPU-seconds per architecture, spread over the parallel jobs
# (at most the CPUs), and never less than the wall time measured per architecture. An empty
# ARCH_LIST (no GPU seen and TORCH_CUDA_ARCH_LIST unset: a dry run on a CPU machine) is taken as
# one architecture, what a machine with one GPU model builds, and the sentence says so.
build_estimate() {
    local archs=() n cpus=$2 par=$3 course full chosen for_archs="" assumed=""
    read -r -a archs <<<"${1//[;,]/ }"
    n=${#archs[@]}
    if ((n >= 1)); then
        for_archs=" for $n architecture(s)"
    else
        n=1
        assumed=", each for one architecture, as on a machine with one GPU model (no GPU is seen"
        assumed+=" here; each architecture in TORCH_CUDA_ARCH_LIST adds as much again: \"8.0;9.0\" doubles it)"
    fi
    ((par <= cpus)) || par=$cpus
    ((par >= 1)) || par=1
    course=$((EST_COURSE_EXT_CPU_S * n / par)) full=$((EST_FULL_CPU_S * n / par))
    ((course >= EST_COURSE_EXT_WALL_S * n)) || course=$((EST_COURSE_EXT_WALL_S * n))
    ((full >= EST_FULL_WALL_S * n)) || full=$((EST_FULL_WALL_S * n))
    if ((COURSE_ONLY)); then chosen="--course-only"; else chosen="the full build"; fi
    printf 'about %s min on %s CPUs%s with --course-only (the course'"'"'s three extensions),' \
        "$(minutes "$course")" "$cpus" "$for_archs"
    printf ' about %s min for the full build (~30 extensions)%s; this run: %s' "$(minutes "$full")" \
        "$assumed" "$chosen"
    printf ' [an estimate from builds on %s-CPU H200 machines (2026-12-01): %s and %s CPU-s per architecture / %s jobs, at least %s and %s s wall per architecture]' \
        "$EST_CPUS" "$EST_COURSE_EXT_CPU_S" "$EST_FULL_CPU_S" "$par" "$EST_COURSE_EXT_WALL_S" "$EST_FULL_WALL_S"
}

if ((WANT_MAIN)); then
    # (7) ninja (without it torch compiles every file serially)
    if ((PROBED)); then
        [[ "$(p ninja)" == "yes" ]] || check_fail ninja 3 "ninja was not found (neither \`import ninja\`" \
            "nor a ninja binary on PATH), and without it torch compiles Apex's extensions one file at a" \
            "time and ignores MAX_JOBS; install it with \`$PYTHON -m pip install ninja==$NINJA_PIN\`."
        NINJA_BIN="$(p ninja_bin)"
    fi
    # (8) GPU or an explicit arch list
    GPU_CAPS="$(p gpu_caps)"
    if [[ -n "${TORCH_CUDA_ARCH_LIST:-}" ]]; then
        ARCH_LIST="$TORCH_CUDA_ARCH_LIST" ARCH_SOURCE="from TORCH_CUDA_ARCH_LIST"
    elif ((!PROBED)); then
        not_checked "arch list" "$NO_PYTHON"
    elif ((!TORCH_OK)); then
        not_checked "arch list" "torch lists the visible GPUs, see FAIL torch"
    elif [[ "$(p cuda_available)" == "True" && -n "$GPU_CAPS" ]]; then
        ARCH_LIST="$(tr ',' '\n' <<<"$GPU_CAPS" | sort -u -t. -k1,1n -k2,2n | paste -sd';' -)"
        ARCH_SOURCE="from the visible GPUs"
    else
        check_fail "arch list" 3 "torch sees no GPU and TORCH_CUDA_ARCH_LIST is unset, so there is no" \
            "way to know which GPU architectures to compile Apex for; run this on the GPU machine or" \
            "set it, e.g. \`TORCH_CUDA_ARCH_LIST=\"8.0;9.0\" ./$PROG\`."
    fi

    # Parallelism: budget = min(CPUs, free GiB / GIB_PER_JOB) unless APEX_JOBS overrides it.
    cpus="$(p cpu_count)" mem="$(p mem_free_gib)"
    [[ "$cpus" =~ ^[0-9]+$ ]] || cpus=1
    CPUS="$cpus"
    if [[ -n "$APEX_JOBS" ]]; then
        JOBS_BUDGET="$APEX_JOBS" JOBS_REASON="from APEX_JOBS"
    elif [[ "${mem%%.*}" =~ ^[0-9]+$ ]]; then
        mem_jobs=$((${mem%%.*} / GIB_PER_JOB))
        JOBS_BUDGET=$((cpus < mem_jobs ? cpus : mem_jobs))
        JOBS_REASON="min($cpus CPUs, $mem GiB free / $GIB_PER_JOB GiB per job)"
    else
        JOBS_BUDGET="$cpus" JOBS_REASON="$cpus CPUs, free memory unknown"
    fi
    ((JOBS_BUDGET >= 1)) || JOBS_BUDGET=1
    # Extensions compiled at once: at most MAX_PARALLEL_EXT, and no more than --course-only builds,
    # so that its three extensions get all the jobs (with 8 slots they got 2 jobs each).
    ext_cap=$MAX_PARALLEL_EXT
    ((COURSE_ONLY)) && ext_cap=3
    PARALLEL_BUILD=$((JOBS_BUDGET < ext_cap ? JOBS_BUDGET : ext_cap))
    NINJA_JOBS=$((JOBS_BUDGET / PARALLEL_BUILD))
    ((NINJA_JOBS >= 1)) || NINJA_JOBS=1

    # Build-time estimate (see the EST_* figures at the top).
    # Without an arch list (no GPU seen): for one architecture, as the sentence says.
    if ((PROBED)); then
        ESTIMATE="$(build_estimate "$ARCH_LIST" "$CPUS" $((PARALLEL_BUILD * NINJA_JOBS)))"
    fi
fi

# ------------------------------------------------------------------------ source folders
# resolve_source LABEL NAME REF SRC: checks a local source folder against REF (read-only).
# Sets SRC_KIND to clone | git | plain (empty when the check failed in a dry run).
resolve_source() {
    local label=$1 name=$2 ref=$3 src=$4 head
    SRC_KIND=""
    if [[ -z "$src" ]]; then
        SRC_KIND=clone
        return 0
    fi
    if [[ ! -f "$src/setup.py" ]]; then
        check_fail "$label" 3 "$name=$src has no setup.py, so it is not an Apex source" \
            "folder; point $name at an Apex checkout or unset it to clone $APEX_URL."
        return 0
    fi
    if [[ -e "$src/.git" ]]; then
        if ! command -v git >/dev/null; then
            check_fail "$label" 3 "$name=$src is a git checkout but git is not installed," \
                "so its commit cannot be checked; install git or unset $name."
            return 0
        fi
        head="$(git -C "$src" rev-parse HEAD 2>/dev/null || true)"
        if [[ "$head" != "$ref" ]]; then
            check_fail "$label" 3 "$name=$src is checked out at ${head:-<unknown>}, but the" \
                "requested commit is $ref; run \`git -C $src checkout $ref\` or set the commit to $head."
            return 0
        fi
        SRC_KIND=git
    else
        SRC_KIND=plain
        say "note: $name=$src has no .git, so its commit cannot be verified; recording $ref as given."
    fi
}
SRC_KIND=""
MAIN_SRC_KIND="" LEGACY_SRC_KIND=""
if ((WANT_MAIN)); then
    resolve_source source APEX_SRC "$APEX_REF" "$APEX_SRC"
    MAIN_SRC_KIND="$SRC_KIND"
fi
if ((WANT_LEGACY)); then
    resolve_source "legacy source" APEX_LEGACY_SRC "$APEX_LEGACY_REF" "$APEX_LEGACY_SRC"
    LEGACY_SRC_KIND="$SRC_KIND"
fi

# json_get FILE KEY: string/number value of a top-level key in a marker this script wrote.
json_get() {
    [[ -f "$1" ]] || return 0
    sed -n -e "s/^  \"$2\": \"\(.*\)\",\{0,1\}\$/\1/p" -e "s/^  \"$2\": \([^\",]*\),\{0,1\}\$/\1/p" "$1" |
        head -n 1
}
describe_source() { # KIND SRC REF CLONE_DIR
    case "$1" in
        clone) printf 'clone %s into %s, checkout %s' "$APEX_URL" "$4" "$3" ;;
        git) printf 'local git checkout %s (HEAD verified = %s)' "$2" "$3" ;;
        plain) printf 'local folder %s (commit not verifiable; recorded as %s)' "$2" "$3" ;;
    esac
}

# ------------------------------------------------------------------------------------ plan
# row LABEL VALUE: one plan line; a failed check's line reads "FAIL LABEL: <its sentence>".
row() {
    local label=$1 value=$2
    if [[ -n "${FAIL_OF[$label]:-}" ]]; then
        printf '  FAIL %s: %s\n' "$label" "${FAIL_OF[$label]}"
    elif [[ -n "${SKIP_OF[$label]:-}" ]]; then
        printf '  %-17s %s\n' "$label:" "not checked (${SKIP_OF[$label]})"
    else
        printf '  %-17s %s\n' "$label:" "$value"
    fi
}
print_plan() {
    if ((DRY_RUN)); then
        say "plan (dry run: nothing will be cloned, built or installed)"
    else
        say "plan"
    fi
    row python "$PYTHON_BIN (Python $(p python_version); $PYTHON_SOURCE)"
    row pip "$PIP_VERSION (at least $MIN_PIP needed)"
    row "build backend" "setuptools and packaging are installed"
    row torch "$TORCH_VERSION (CUDA ${TORCH_CUDA:-none}; GPUs: $(p gpu_count) [$(p gpu_caps)])"
    row workdir "$APEX_WORKDIR"
    if ((WANT_MAIN)); then
        row source "$(describe_source "$MAIN_SRC_KIND" "$APEX_SRC" "$APEX_REF" "$APEX_WORKDIR/src/apex")"
        row commit "$APEX_REF"
        row CUDA_HOME "$PLAN_CUDA_HOME"
        row nvcc "$NVCC_VERSION ($NVCC$NVCC_NOTE)"
        row ninja "${NINJA_BIN:-found}"
        row "arch list" "TORCH_CUDA_ARCH_LIST=$ARCH_LIST ($ARCH_SOURCE)"
        row jobs "APEX_PARALLEL_BUILD=$PARALLEL_BUILD MAX_JOBS=$NINJA_JOBS (budget $JOBS_BUDGET: $JOBS_REASON)"
        row estimate "$ESTIMATE"
        [[ -n "${NVCC_APPEND_FLAGS:-}" ]] && row "nvcc flags" "NVCC_APPEND_FLAGS=$NVCC_APPEND_FLAGS"
        row build "APEX_CPP_EXT=1 APEX_CUDA_EXT=1 $PYTHON -m pip install -v --no-build-isolation --no-deps .$(
            if ((COURSE_ONLY)); then printf ' (--course-only: %s alone)' "${COURSE_EXTENSIONS//,/, }"; fi)"
        row "install target" "${P[site_packages]:-unknown (no working python)} (replaces any installed 'apex')"
        row "build log" "$BUILD_LOG"
        row marker "$MARKER ($(if [[ -f "$MARKER" ]]; then
            printf 'records %s, torch %s' "$(json_get "$MARKER" commit)" "$(json_get "$MARKER" torch_version)"
        else printf 'none yet'; fi))"
    fi
    if ((WANT_LEGACY)); then
        ((WANT_MAIN)) || row nvcc "not needed (Python-only install; ${NVCC:-a version-only stub is used})"
        row "legacy source" "$(describe_source "$LEGACY_SRC_KIND" "$APEX_LEGACY_SRC" "$APEX_LEGACY_REF" "$APEX_WORKDIR/src/apex-legacy")"
        row "legacy commit" "$APEX_LEGACY_REF (Python-only, last commit with apex.amp)"
        row "legacy target" "$LEGACY_DIR (pip --target; use only via PYTHONPATH)"
        row "legacy marker" "$LEGACY_MARKER"
    fi
}
print_plan
if ((DRY_RUN)); then
    if ((FAIL_COUNT)); then
        say "dry run: $FAIL_COUNT preflight check(s) failed (the FAIL lines above; a real run stops" \
            "at the first). Nothing was cloned, built or installed."
        printf '%s: error: %s\n' "$PROG" "$FIRST_FAIL_MSG" >&2
        exit "$FIRST_FAIL_CODE"
    fi
    say "dry run: nothing was cloned, built or installed."
    exit 0
fi

# ------------------------------------------------------------------------- fetch / stage
# stage_source KIND SRC REF DEST: make DEST a clean, writable tree of REF to build from.
stage_source() {
    local kind=$1 src=$2 ref=$3 dest=$4 head
    mkdir -p "$(dirname "$dest")"
    if [[ "$kind" == clone ]]; then
        if [[ ! -d "$dest/.git" ]]; then
            rm -rf "$dest"
            say "cloning $APEX_URL into $dest"
            git clone --quiet --filter=blob:none "$APEX_URL" "$dest" ||
                die 4 "git clone of $APEX_URL failed; check network access or set APEX_SRC to a local checkout."
        elif ! git -C "$dest" cat-file -e "$ref^{commit}" 2>/dev/null; then
            git -C "$dest" fetch --quiet origin || die 4 "git fetch in $dest failed; check network access."
        fi
        git -C "$dest" -c advice.detachedHead=false checkout --quiet --force "$ref" ||
            die 4 "commit $ref does not exist in $APEX_URL; check APEX_REF / APEX_LEGACY_REF."
        head="$(git -C "$dest" rev-parse HEAD)"
        [[ "$head" == "$ref" ]] || die 4 "$dest is at $head after checkout, expected $ref."
        # Stale objects from another torch/arch must not be reused.
        rm -rf "$dest/build" "$dest"/*.egg-info
    else
        # Build from a private copy: the user's folder stays clean and may be read-only.
        rm -rf "$dest"
        mkdir -p "$dest"
        cp -R "$src/." "$dest/"
        chmod -R u+w "$dest"
        rm -rf "$dest/.git" "$dest/build" "$dest"/*.egg-info
    fi
}

# ---------------------------------------------------------------------------- main Apex
VERIFIED="" VERIFY_MSG=""
# verify_main: helpers.apexcheck --verify imports the extensions and, on a GPU, runs a FusedAdam
# step and a FusedLayerNorm forward against torch in float64 (the course's one kernel check).
verify_main() {
    local out rc=0
    mkdir -p "$APEX_WORKDIR"
    out="$(cd "$APEX_WORKDIR" && PYTHONPATH="$REPO_ROOT${CLEAN_PYTHONPATH:+:$CLEAN_PYTHONPATH}" \
        "$PYTHON_BIN" -m helpers.apexcheck --verify --legacy-dir "$LEGACY_DIR" 2>>"$VERIFY_LOG")" ||
        rc=$?
    printf '%s\n' "$out" >>"$VERIFY_LOG"
    grep -Ev '^(verified|error|warning)=' <<<"$out" | sed 's/^/  /' || true
    VERIFIED="$(sed -n 's/^verified=//p' <<<"$out")"
    VERIFY_MSG="$(sed -n 's/^error=//p' <<<"$out")"
    grep -q '^warning=' <<<"$out" && warn "$(sed -n 's/^warning=//p' <<<"$out")"
    if [[ -z "$VERIFY_MSG" ]] && ((rc != 0)); then
        VERIFY_MSG="python -m helpers.apexcheck --verify exited with status $rc"
    fi
    [[ -z "$VERIFY_MSG" ]]
}

main_is_current() {
    local commit torch
    local built
    commit="$(json_get "$MARKER" commit)" torch="$(json_get "$MARKER" torch_version)"
    built="$(json_get "$MARKER" extensions)"
    [[ "$commit" == "$APEX_REF" && "$torch" == "$TORCH_VERSION" ]] || return 1
    if [[ "$built" == course-only ]] && ((!COURSE_ONLY)); then
        say "the installed Apex has only the course's extensions (--course-only); building the full set."
        return 1
    fi
    if verify_main; then
        say "Apex $APEX_REF is already built for torch $TORCH_VERSION and verified ($MARKER); use --force to rebuild."
        return 0
    fi
    say "$MARKER matches, but verification fails ($VERIFY_MSG); rebuilding."
    return 1
}

build_main() {
    local src="$APEX_WORKDIR/src/apex" start seconds rc=0 extra_path
    say "estimate: $ESTIMATE"
    stage_source "$MAIN_SRC_KIND" "$APEX_SRC" "$APEX_REF" "$src"
    ((COURSE_ONLY)) && keep_course_extensions "$src/setup.py"
    rm -f "$MARKER"
    say "removing any previously installed 'apex'"
    PYTHONPATH="$CLEAN_PYTHONPATH" "$PYTHON_BIN" -m pip uninstall -y apex >/dev/null 2>&1 ||
        warn "pip uninstall apex failed; continuing (the install below replaces it)"
    # nvcc's toolkit first; the ninja binary found by the probe (may live in the env's bin dir).
    extra_path="$CUDA_HOME/bin"
    [[ -n "$NINJA_BIN" ]] && extra_path+=":$(dirname "$NINJA_BIN")"
    say "building Apex $APEX_REF for TORCH_CUDA_ARCH_LIST=$ARCH_LIST with APEX_PARALLEL_BUILD=$PARALLEL_BUILD MAX_JOBS=$NINJA_JOBS"
    say "build log: $BUILD_LOG"
    start="$(date +%s)"
    (
        cd "$src"
        export APEX_CPP_EXT=1 APEX_CUDA_EXT=1 CUDA_HOME TORCH_CUDA_ARCH_LIST="$ARCH_LIST"
        export APEX_PARALLEL_BUILD="$PARALLEL_BUILD" MAX_JOBS="$NINJA_JOBS"
        export PATH="$extra_path:$PATH"
        echo "# $PROG: commit $APEX_REF, CUDA_HOME=$CUDA_HOME, TORCH_CUDA_ARCH_LIST=$ARCH_LIST," \
            "APEX_PARALLEL_BUILD=$APEX_PARALLEL_BUILD, MAX_JOBS=$MAX_JOBS, NVCC_APPEND_FLAGS=${NVCC_APPEND_FLAGS:-}"
        PYTHONPATH="$CLEAN_PYTHONPATH" "$PYTHON_BIN" -m pip install -v --no-build-isolation --no-deps .
    ) >"$BUILD_LOG" 2>&1 || rc=$?
    seconds=$(($(date +%s) - start))
    if ((rc != 0)); then
        tail -n 30 "$BUILD_LOG" >&2
        die 4 "pip install of Apex failed (exit $rc) after ${seconds}s; the last 30 lines are above," \
            "the full log is $BUILD_LOG."
    fi
    say "build finished in ${seconds}s"
    verify_main || die 5 "verification failed: $VERIFY_MSG - rebuild with ./$PROG --force (details in $VERIFY_LOG)."
    write_marker "$MARKER" commit="$APEX_REF" commit_verified="$([[ "$MAIN_SRC_KIND" == plain ]] && echo false || echo true)" \
        source="${APEX_SRC:-$APEX_URL}" torch_version="$TORCH_VERSION" torch_cuda="$TORCH_CUDA" \
        nvcc_version="$NVCC_VERSION" cuda_home="$CUDA_HOME" arch_list="$ARCH_LIST" \
        build_seconds="$seconds" date="$(date -u +%Y-%m-%dT%H:%M:%SZ)" verified_extensions="$VERIFIED" \
        extensions="$(if ((COURSE_ONLY)); then echo course-only; else echo full; fi)"
    say "Apex $APEX_REF installed and verified ($VERIFIED); marker: $MARKER"
}

# keep_course_extensions SETUP_PY: in the staged copy, keep only COURSE_EXTENSIONS in the
# ext_modules list Apex's setup.py hands to setup(); one sentence if that list is not found.
keep_course_extensions() {
    "$PYTHON_BIN" - "$1" "$COURSE_EXTENSIONS" <<'PY' || die 4 "--course-only: $1 has no top-level 'setup(' call after an 'ext_modules' list, so this Apex commit cannot be trimmed; build without --course-only."
import re, sys
path, keep = sys.argv[1], sys.argv[2].split(",")
text = open(path).read()
calls = [m.start() for m in re.finditer(r"^setup\(", text, re.M)]
if "ext_modules" not in text or len(calls) != 1:
    sys.exit(1)
trim = ("# added by the course's build_apex.sh --course-only: only the extensions it uses\n"
        f"ext_modules = [e for e in ext_modules if e.name in {keep!r}]\n"
        "print('[apex] --course-only:', [e.name for e in ext_modules])\n\n")
open(path, "w").write(text[:calls[0]] + trim + text[calls[0]:])
PY
}

# write_marker FILE key=value...: JSON marker (lists are comma separated, numbers/bools typed).
write_marker() {
    local file=$1
    shift
    "$PYTHON_BIN" - "$file" "$@" <<'PY'
import json, os, sys
path, data = sys.argv[1], {}
for item in sys.argv[2:]:
    key, value = item.split("=", 1)
    if key in ("verified_extensions",):
        data[key] = [v for v in value.split(",") if v]
    elif key == "build_seconds":
        data[key] = int(value)
    elif value in ("true", "false"):
        data[key] = value == "true"
    else:
        data[key] = value
with open(path + ".tmp", "w") as fh:
    json.dump(data, fh, indent=2)
    fh.write("\n")
os.replace(path + ".tmp", path)
PY
}

# ------------------------------------------------------------------------ legacy apex.amp
verify_legacy() {
    (cd "$APEX_WORKDIR" && PYTHONPATH="$LEGACY_DIR${CLEAN_PYTHONPATH:+:$CLEAN_PYTHONPATH}" \
        "$PYTHON_BIN" - "$LEGACY_DIR" >>"$VERIFY_LOG" 2>&1 <<'PY'
import os, sys
from apex import amp  # noqa: F401  (the whole point of the legacy install)
import apex
where = os.path.realpath(apex.__file__)
assert where.startswith(os.path.realpath(sys.argv[1]) + os.sep), f"apex came from {where}"
print(f"legacy apex.amp OK from {where}")
PY
    )
}

legacy_is_current() {
    [[ "$(json_get "$LEGACY_MARKER" commit)" == "$APEX_LEGACY_REF" && -d "$LEGACY_DIR/apex" ]] || return 1
    if verify_legacy; then
        say "legacy apex.amp $APEX_LEGACY_REF is already installed in $LEGACY_DIR; use --force to reinstall."
        return 0
    fi
    say "$LEGACY_MARKER matches, but \`from apex import amp\` fails there; reinstalling."
    return 1
}

install_legacy() {
    local src="$APEX_WORKDIR/src/apex-legacy" cuda_home="$NVCC_CUDA_HOME" stub rc=0
    stage_source "$LEGACY_SRC_KIND" "$APEX_LEGACY_SRC" "$APEX_LEGACY_REF" "$src"
    rm -f "$LEGACY_MARKER"
    rm -rf "$LEGACY_DIR"
    mkdir -p "$LEGACY_DIR"
    # The legacy setup.py runs `$CUDA_HOME/bin/nvcc -V` even when no extension is built. Without a
    # toolkit, give it a stub that only reports a version; nothing is compiled in this install.
    if [[ -z "$cuda_home" ]]; then
        cuda_home="$APEX_WORKDIR/stub-cuda"
        stub="$cuda_home/bin/nvcc"
        mkdir -p "$cuda_home/bin"
        printf '#!/bin/sh\necho "Cuda compilation tools, release %s, V%s.0"\n' \
            "${TORCH_CUDA:-12.8}" "${TORCH_CUDA:-12.8}" >"$stub"
        chmod +x "$stub"
        say "no nvcc found; using a version-only stub ($stub) for the Python-only legacy install"
    fi
    say "installing legacy apex.amp $APEX_LEGACY_REF into $LEGACY_DIR (log: $LEGACY_LOG)"
    (
        cd "$src"
        unset APEX_CPP_EXT APEX_CUDA_EXT
        export CUDA_HOME="$cuda_home"
        PYTHONPATH="$CLEAN_PYTHONPATH" "$PYTHON_BIN" -m pip install --no-deps --no-build-isolation --target "$LEGACY_DIR" .
    ) >"$LEGACY_LOG" 2>&1 || rc=$?
    if ((rc != 0)); then
        tail -n 30 "$LEGACY_LOG" >&2
        die 4 "pip install of the legacy Apex failed (exit $rc); the last 30 lines are above, the" \
            "full log is $LEGACY_LOG."
    fi
    verify_legacy || die 5 "legacy verification failed: \`from apex import amp\` with" \
        "PYTHONPATH=$LEGACY_DIR does not work - reinstall with ./$PROG --legacy-only --force" \
        "(details in $VERIFY_LOG)."
    write_marker "$LEGACY_MARKER" commit="$APEX_LEGACY_REF" path="$LEGACY_DIR" \
        date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    say "legacy apex.amp ready: PYTHONPATH=$LEGACY_DIR $PYTHON -c 'from apex import amp'"
}

# ------------------------------------------------------------------------------------ run
mkdir -p "$APEX_WORKDIR"
: >"$VERIFY_LOG"
if ((WANT_MAIN)); then
    if ((FORCE)) || ! main_is_current; then
        build_main
    fi
fi
if ((WANT_LEGACY)); then
    if ((FORCE)) || ! legacy_is_current; then
        install_legacy
    fi
fi
exit 0
