"""The build-time estimate printed before a build and in the plan (an estimate, not a
measurement).

Its model: a build takes its measured CPU-seconds per architecture (the EST_* figures in
``constants``, with their source), spread over the parallel jobs (at most the CPUs), and never
less than the wall time measured per architecture. No arch list (no GPU seen and
TORCH_CUDA_ARCH_LIST unset: a dry run on a CPU machine) is taken as one architecture, what a
machine with one GPU model builds, and the sentence says so."""

from __future__ import annotations

import re

from coursetools.apexbuild import constants as c


def minutes(seconds: int) -> int:
    """Whole minutes, rounded, at least 1."""
    return max((seconds + 30) // 60, 1)


def build_estimate(arch_list: str, cpus: str, jobs: int, course_only: bool) -> str:
    """The estimate sentence for ``arch_list`` (``;`` or ``,`` separated), ``cpus`` CPUs and
    ``jobs`` parallel jobs."""
    words = re.sub(r"[;,]", " ", arch_list.split("\n", 1)[0]).replace("\t", " ").split(" ")
    n = len([w for w in words if w])
    if n >= 1:
        for_archs, assumed = f" for {n} architecture(s)", ""
    else:
        n, for_archs = 1, ""
        assumed = (", each for one architecture, as on a machine with one GPU model (no GPU is "
                   "seen here; each architecture in TORCH_CUDA_ARCH_LIST adds as much again: "
                   '"8.0;9.0" doubles it)')
    par = max(min(jobs, int(cpus)), 1)
    course = max(c.EST_COURSE_EXT_CPU_S * n // par, c.EST_COURSE_EXT_WALL_S * n)
    full = max(c.EST_FULL_CPU_S * n // par, c.EST_FULL_WALL_S * n)
    chosen = "--course-only" if course_only else "the full build"
    return (f"about {minutes(course)} min on {cpus} CPUs{for_archs} with --course-only (the "
            f"course's three extensions), about {minutes(full)} min for the full build "
            f"(~30 extensions){assumed}; this run: {chosen} [an estimate from builds on "
            f"{c.EST_CPUS}-CPU H200 machines (2026-12-01): {c.EST_COURSE_EXT_CPU_S} and "
            f"{c.EST_FULL_CPU_S} CPU-s per architecture / {par} jobs, at least "
            f"{c.EST_COURSE_EXT_WALL_S} and {c.EST_FULL_WALL_S} s wall per architecture]")
