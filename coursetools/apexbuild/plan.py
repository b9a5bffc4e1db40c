"""The plan printed before every build and by ``--dry-run``: one line per check, a failed one
as "FAIL <check>: <its sentence>", one that could not run as "not checked (<why>)"."""

from __future__ import annotations

import os
import re
import sys

from coursetools.apexbuild import constants as c
from coursetools.apexbuild.console import say
from coursetools.apexbuild.preflight import Preflight


def json_get(path: str, key: str) -> str:
    """The string or number value of a top-level ``key`` in a marker this build wrote (its
    ``"key": value`` line, read as text as the markers are written: indent 2)."""
    if not os.path.isfile(path):
        return ""
    quoted = re.compile(rf'  "{re.escape(key)}": "(.*)",?')
    bare = re.compile(rf'  "{re.escape(key)}": ([^",]*),?')
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as fh:
        for line in fh.read().split("\n"):
            match = quoted.fullmatch(line) or bare.fullmatch(line)
            if match:
                return match.group(1)
    return ""


def describe_source(kind: str, src: str, ref: str, clone_dir: str) -> str:
    if kind == "clone":
        return f"clone {c.APEX_URL} into {clone_dir}, checkout {ref}"
    if kind == "git":
        return f"local git checkout {src} (HEAD verified = {ref})"
    if kind == "plain":
        return f"local folder {src} (commit not verifiable; recorded as {ref})"
    return ""


def row(pre: Preflight, label: str, value: str) -> None:
    """One plan line; a failed check's line reads "FAIL LABEL: <its sentence>"."""
    if pre.fail_of.get(label):
        line = f"  FAIL {label}: {pre.fail_of[label]}"
    elif pre.skip_of.get(label):
        line = f"  {label + ':':<17} not checked ({pre.skip_of[label]})"
    else:
        line = f"  {label + ':':<17} {value}"
    print(line, file=sys.stdout)


def print_plan(pre: Preflight) -> None:
    opts = pre.opts
    say("plan (dry run: nothing will be cloned, built or installed)" if opts.dry_run else "plan")
    row(pre, "python", f"{pre.python_bin} (Python {pre.get('python_version')}; "
                       f"{opts.python_source})")
    row(pre, "pip", f"{pre.pip_version} (at least {c.MIN_PIP} needed)")
    row(pre, "build backend", "setuptools and packaging are installed")
    row(pre, "torch", f"{pre.torch_version} (CUDA {pre.torch_cuda or 'none'}; GPUs: "
                      f"{pre.get('gpu_count')} [{pre.get('gpu_caps')}])")
    row(pre, "workdir", opts.workdir)
    if opts.want_main:
        row(pre, "source", describe_source(pre.main_src_kind, opts.apex_src, opts.apex_ref,
                                           f"{opts.workdir}/src/apex"))
        row(pre, "commit", opts.apex_ref)
        row(pre, "CUDA_HOME", pre.plan_cuda_home)
        row(pre, "nvcc", f"{pre.nvcc_version} ({pre.nvcc}{pre.nvcc_note})")
        row(pre, "ninja", pre.ninja_bin or "found")
        row(pre, "arch list", f"TORCH_CUDA_ARCH_LIST={pre.arch_list} ({pre.arch_source})")
        row(pre, "jobs", f"APEX_PARALLEL_BUILD={pre.parallel_build} MAX_JOBS={pre.ninja_jobs} "
                         f"(budget {pre.jobs_budget}: {pre.jobs_reason})")
        row(pre, "estimate", pre.estimate)
        if opts.env.get("NVCC_APPEND_FLAGS"):
            row(pre, "nvcc flags", f"NVCC_APPEND_FLAGS={opts.env['NVCC_APPEND_FLAGS']}")
        only = (f" (--course-only: {c.course_extensions_text()} alone)"
                if opts.course_only else "")
        row(pre, "build", f"APEX_CPP_EXT=1 APEX_CUDA_EXT=1 {opts.python} -m pip install -v "
                          f"--no-build-isolation --no-deps .{only}")
        target = pre.get("site_packages") or "unknown (no working python)"
        row(pre, "install target", f"{target} (replaces any installed 'apex')")
        row(pre, "build log", opts.build_log)
        if os.path.isfile(opts.marker):
            recorded = (f"records {json_get(opts.marker, 'commit')}, "
                        f"torch {json_get(opts.marker, 'torch_version')}")
        else:
            recorded = "none yet"
        row(pre, "marker", f"{opts.marker} ({recorded})")
    if opts.want_legacy:
        if not opts.want_main:
            row(pre, "nvcc", "not needed (Python-only install; "
                             f"{pre.nvcc or 'a version-only stub is used'})")
        row(pre, "legacy source", describe_source(pre.legacy_src_kind, opts.legacy_src,
                                                  opts.legacy_ref,
                                                  f"{opts.workdir}/src/apex-legacy"))
        row(pre, "legacy commit", f"{opts.legacy_ref} (Python-only, last commit with apex.amp)")
        row(pre, "legacy target", f"{opts.legacy_dir} (pip --target; use only via PYTHONPATH)")
        row(pre, "legacy marker", opts.legacy_marker)
