"""Shared helpers for the course notebooks: what measures, checks, tabulates, plots and reports.

The techniques the course teaches (the optimizers, the norms, the autocast + GradScaler steps,
the training loop of each path) are written in the notebooks' cells; these modules only measure
them. The core, by job (``from helpers import bench, machine``):

- ``bench``: timing (CUDA events, warm-up, median, IQR, L2 flush), training runs, peak memory;
- ``ceilings``: the device's measured ceilings, its datasheet peak, "% of ceiling" and MFU;
- ``environment``: the environment header saved with every result; the Apex build toolchain;
- ``machine``: what this machine can run, the one mixed-precision dtype choice, the one-line skip;
- ``run_profile``: the run profile (smoke / full), progress bars and the GPU memory cap;
- ``errors``: the one error style (a one-sentence ``CourseError``); ``settings``: the COURSE_*
  environment variables;
- ``results``: atomic CSV / JSON / PNG writes into the results folder; ``charts``: the standard
  charts (units, IQR error bars, differences to a baseline);
- ``verdicts``: timings against their spreads (the tie rule), losses against the noise floor;
- ``kernels``: kernel counts and the per-category time breakdown of a step;
- ``apexcheck``: which Apex kernels really work (notebook 01 and build_apex.sh);
- ``gpt``: the model, corpus and training recipe of notebooks 05-07.

``helpers.chapters`` holds one module per notebook for what is specific to it and not taught.
"""

__version__ = "0.2.0"

# Bumped whenever the timing method changes, so old and new numbers are never mixed silently.
BENCH_METHOD_VERSION = "2"
