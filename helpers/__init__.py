"""Shared helpers for the course notebooks: what measures, checks, tabulates, plots and reports.

The techniques the course teaches (the optimizers, the norms, the autocast + GradScaler steps,
the training loop of each path) are written in the notebooks' cells; these modules only measure
them. Import them by name, e.g. ``from helpers import bench, machine``:

- ``bench``: timing (CUDA events, warm-up, median, IQR, L2 flush), training runs, peak memory;
- ``ceilings``: the device's measured ceilings, its datasheet peak, "% of ceiling" and MFU;
- ``environment``: the environment header saved with every result; the Apex build toolchain;
- ``machine``: what this machine can run, the one mixed-precision dtype choice, one-line errors,
  and the run profile it gets (smoke / full), progress bars and the GPU memory cap;
- ``results``: atomic CSV / JSON / PNG writes into the results folder, and the standard charts;
- ``verdicts``: timings against their spreads (the tie rule), losses against the noise floor;
- ``kernels``: kernel counts and the per-category time breakdown of a step;
- one module per chapter for what is specific to it and not taught: ``apexcheck`` (01),
  ``optimizers`` (02), ``norms`` (03), ``legacy_amp`` (04), ``gpt`` (05: the model and corpus),
  ``fp8`` (06: FP8 scaling, torchao checks) and ``scaling`` (07: the torchrun launcher and the
  memory and communication model).
"""

__version__ = "0.2.0"

# Bumped whenever the timing method changes, so old and new numbers are never mixed silently.
BENCH_METHOD_VERSION = "2"
