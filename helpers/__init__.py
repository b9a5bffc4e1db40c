"""Shared helpers for the course notebooks.

Import the modules by name, e.g. ``from helpers import bench, profile``:

- ``profile``: the run profile (``smoke`` or ``full``) and the device it runs on;
- ``bench``: the one timing function every notebook uses (CUDA events, warm-up, median, IQR);
- ``roofline``: the device's measured ceilings and "% of ceiling" arithmetic;
- ``envinfo``: the environment report printed at the top of each notebook and saved with results;
- ``gpu``: what this machine can run (CUDA, bf16, Apex extensions) and one-line skips;
- ``results``: atomic CSV/JSON/PNG writes into the results folder;
- ``plots``: the course's standard charts;
- ``progress``: progress bars that stay quiet in headless runs;
- ``runner``: executes notebooks headless (``python -m helpers.runner``).
"""

__version__ = "0.1.0"

# Bumped whenever the timing method changes, so old and new numbers are never mixed silently.
BENCH_METHOD_VERSION = "1"
