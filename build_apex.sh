#!/usr/bin/env bash
# build_apex.sh - build NVIDIA Apex (C++/CUDA extensions) from a pinned git commit for the
# course environment, verify it, and optionally install the legacy `apex.amp` Python-only
# into a separate folder that is only ever used through PYTHONPATH.
#
# The work is done by the Python package coursetools/apexbuild (standard library only), which
# probes the python Apex is built for ($PYTHON) in a subprocess. This finds a Python 3 to run
# it: python3 on PATH, else $PYTHON, else the course's .venv python.
# Run `./build_apex.sh --help` for options, environment variables and exit codes.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for py in python3 "${PYTHON:-}" "$REPO_ROOT/.venv/bin/python"; do
    if [[ -n "$py" ]] && "$py" -c 'import sys; sys.exit(sys.version_info < (3, 8))' >/dev/null 2>&1; then
        exec "$py" "$REPO_ROOT/coursetools/apexbuild/__main__.py" "$@"
    fi
done
why="no Python 3.8 or newer was found to run the build (looked for python3 on PATH, \$PYTHON"
why+=" and $REPO_ROOT/.venv/bin/python); install Python 3, or activate the course's environment"
why+=" (e.g. \`conda env create -f environment.yml && conda activate <env>\`) or set PYTHON."
printf 'build_apex.sh: error: %s\n' "$why" >&2
exit 3
