"""``python -m coursetools.apexbuild [OPTIONS]``, or this file run by path, which is how
``build_apex.sh`` runs it: the checkout that holds it goes first on ``sys.path`` (in place of
this folder), and the caller's PYTHONPATH is left as it is for the python Apex is built for."""

import os
import sys

if not __package__:  # run by path
    _here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.realpath(_here):
        sys.path.pop(0)
    sys.path.insert(0, os.path.dirname(os.path.dirname(_here)))

from coursetools.apexbuild.cli import main  # noqa: E402

if __name__ == "__main__":
    # Each line goes out as it is printed, in order with the children's (a notebook streams it).
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, errors="surrogateescape")
    sys.exit(main())
