#!/usr/bin/env bash
# `make lab`: JupyterLab on the notebooks, with the course's Python as their kernel.
#
#   bash scripts/lab.sh PYTHON REQUIREMENTS LAB_VENV KERNEL_PREFIX
#   bash scripts/lab.sh --kernelspec-only PYTHON KERNEL_PREFIX
#
# PYTHON is the course's Python (what scripts/ensure_env.sh prints). The lab server runs from its
# own virtual environment LAB_VENV, made from PYTHON when missing and filled with the jupyterlab
# and ipywidgets pins of REQUIREMENTS, so the course's environment never holds the server's
# dependencies (jupyter-events gives jsonschema its format checkers, and `import nbformat` then
# takes 2 s instead of 0.1 s in every process that reads a notebook, make test's among them).
# PYTHON gets only the ipywidgets pin, when missing (tqdm's progress bars in the notebooks), and
# ipykernel, which it has from requirements.txt. The kernelspec KERNEL_PREFIX/share/jupyter/kernels/
# python3, named as the notebooks name theirs, runs PYTHON; it is written on every start (PYTHON
# may have changed) and put first on JUPYTER_PATH, ahead of the lab environment's own python3.
# --kernelspec-only writes that kernelspec and stops.
set -euo pipefail

say() { printf 'make lab: %s\n' "$*"; }
die() { printf 'make lab: %s\n' "$*" >&2; exit 1; }

# The notebooks' metadata.kernelspec: a different display name would change every notebook saved.
kernel_name=python3
kernel_display="Python 3 (ipykernel)"

write_kernelspec() {  # write_kernelspec PYTHON PREFIX: the kernelspec that runs PYTHON
  local out
  out=$("$1" -m ipykernel install --prefix "$2" --name "$kernel_name" \
          --display-name "$kernel_display" 2>&1) \
    || die "could not write the kernelspec with $1 -m ipykernel install: ${out##*$'\n'}"
}

if [ "${1:-}" = --kernelspec-only ]; then
  [ $# = 3 ] || die "usage: scripts/lab.sh --kernelspec-only PYTHON KERNEL_PREFIX"
  write_kernelspec "$2" "$3"; exit 0
fi
[ $# = 4 ] || die "usage: scripts/lab.sh PYTHON REQUIREMENTS LAB_VENV KERNEL_PREFIX"
py=$1 requirements=$2 lab_venv=$3 prefix=$4
case $lab_venv in /*) ;; *) lab_venv=$PWD/$lab_venv ;; esac  # the server starts in notebooks/
lab_py=$lab_venv/bin/python

pin() {  # pin NAME: NAME's pin in requirements.txt
  grep -oE "^$1==[^ #]+" "$requirements" || die "$requirements pins no $1"
}

has() { "$1" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))" "${@:2}" 2>/dev/null; }

if has "$py" jupyter_server; then
  say "$py still holds JupyterLab's server from an older make lab: its dependencies make each 'import nbformat' take 2 s instead of 0.1 s and make test a minute longer; the lab no longer needs them there, so recreate that environment (the course's .venv: rm -rf .venv && make test)"
fi

if ! has "$py" ipywidgets; then
  widgets=$(pin ipywidgets)
  say "installing $widgets into the course's Python $py (the notebooks' progress bars draw with it)"
  "$py" -m pip install -q "$widgets" || die "pip could not install $widgets into $py"
fi

if ! has "$lab_py" jupyterlab ipywidgets; then
  pins="$(pin jupyterlab) $(pin ipywidgets)"
  if ! "$lab_py" -m pip --version >/dev/null 2>&1; then
    clear=; [ ! -e "$lab_venv/pyvenv.cfg" ] || clear=--clear
    "$py" -m venv ${clear:+"$clear"} "$lab_venv" >/dev/null 2>&1 \
      || die "could not create the lab's environment $lab_venv with $py -m venv: install the venv module (Debian: apt-get install python3-venv) and run make lab again"
  fi
  say "installing $pins into $lab_venv, the lab server's own environment (the pins of $requirements; the jupyterlab wheel alone is 17 MB, its dependencies come on top)"
  # shellcheck disable=SC2086  # $pins holds two requirements
  "$lab_py" -m pip install $pins || die "pip could not install $pins into $lab_venv"
fi

mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
write_kernelspec "$py" "$prefix"
export JUPYTER_PATH="$prefix/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"

root_flag=()
if [ "$(id -u)" = 0 ]; then root_flag=(--allow-root); fi
say "starting JupyterLab on notebooks/ with $py as the kernel; open the http://127.0.0.1:8888/lab?token=... URL it prints (Ctrl-C stops it)"
cd notebooks
exec "$lab_py" -m jupyterlab --no-browser --ServerApp.ip=127.0.0.1 --ServerApp.answer_yes=True \
  "${root_flag[@]}"
