"""The legacy ``apex.amp``: the last commit that has it, installed Python-only with
``pip --target`` into ``$APEX_WORKDIR/legacy-amp``, a folder that is only ever used through
the PYTHONPATH of a child process, and checked that way (``target_legacy_check.py``)."""

from __future__ import annotations

import os
import subprocess

from coursetools.apexbuild import constants as c
from coursetools.apexbuild.build import flush, remove, stage_source, utc_now, write_marker
from coursetools.apexbuild.console import die, run_logged, say, tail
from coursetools.apexbuild.options import env_in
from coursetools.apexbuild.plan import json_get
from coursetools.apexbuild.preflight import Preflight

CHECK_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                             "target_legacy_check.py")


def verify(pre: Preflight) -> bool:
    """``from apex import amp`` with only the legacy folder (and the caller's PYTHONPATH less
    it) in front, run from the work folder; its output goes to verify.log."""
    opts = pre.opts
    path = f"{opts.legacy_dir}:{opts.clean_pythonpath}" if opts.clean_pythonpath \
        else opts.legacy_dir
    with open(CHECK_PROGRAM, "rb") as fh:
        program = fh.read()
    env = env_in(opts.env, opts.workdir, PYTHONPATH=path)
    flush()
    with open(opts.verify_log, "ab") as log:
        try:
            proc = subprocess.run([pre.python_bin, "-", opts.legacy_dir], input=program,
                                  cwd=opts.workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
        except OSError:
            return False
    return proc.returncode == 0


def is_current(pre: Preflight) -> bool:
    opts = pre.opts
    if json_get(opts.legacy_marker, "commit") != opts.legacy_ref or \
            not os.path.isdir(f"{opts.legacy_dir}/apex"):
        return False
    if verify(pre):
        say(f"legacy apex.amp {opts.legacy_ref} is already installed in {opts.legacy_dir}; use "
            "--force to reinstall.")
        return True
    say(f"{opts.legacy_marker} matches, but `from apex import amp` fails there; reinstalling.")
    return False


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def install(pre: Preflight) -> None:
    opts = pre.opts
    src = f"{opts.workdir}/src/apex-legacy"
    cuda_home = pre.nvcc_cuda_home
    stage_source(pre, pre.legacy_src_kind, opts.legacy_src, opts.legacy_ref, src)
    if not os.path.isdir(opts.legacy_marker):
        remove(opts.legacy_marker)
    remove(opts.legacy_dir)
    os.makedirs(opts.legacy_dir, exist_ok=True)
    # The legacy setup.py runs `$CUDA_HOME/bin/nvcc -V` even when no extension is built. Without
    # a toolkit, give it a stub that only reports a version; nothing is compiled in this install.
    if not cuda_home:
        cuda_home = f"{opts.workdir}/stub-cuda"
        stub = f"{cuda_home}/bin/nvcc"
        os.makedirs(f"{cuda_home}/bin", exist_ok=True)
        release = pre.torch_cuda or "12.8"
        with open(stub, "w") as fh:
            fh.write(f'#!/bin/sh\necho "Cuda compilation tools, release {release}, '
                     f'V{release}.0"\n')
        os.chmod(stub, os.stat(stub).st_mode | (0o111 & ~_umask()))  # chmod +x
        say(f"no nvcc found; using a version-only stub ({stub}) for the Python-only legacy "
            "install")
    say(f"installing legacy apex.amp {opts.legacy_ref} into {opts.legacy_dir} (log: "
        f"{opts.legacy_log})")
    env = env_in({k: v for k, v in opts.env.items() if k not in ("APEX_CPP_EXT", "APEX_CUDA_EXT")},
                 src, CUDA_HOME=cuda_home, PYTHONPATH=opts.clean_pythonpath)
    cmd = [pre.python_bin, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
           "--target", opts.legacy_dir, "."]
    flush()
    with open(opts.legacy_log, "wb") as log:
        rc = run_logged(cmd, src, env, log)
    if rc != 0:
        tail(opts.legacy_log)
        die(4, f"pip install of the legacy Apex failed (exit {rc}); the last 30 lines are above, "
            f"the full log is {opts.legacy_log}.")
    if not verify(pre):
        die(5, "legacy verification failed: `from apex import amp` with",
            f"PYTHONPATH={opts.legacy_dir} does not work - reinstall with ./{c.PROG} "
            f"--legacy-only --force (details in {opts.verify_log}).")
    write_marker(opts.legacy_marker, f"commit={opts.legacy_ref}", f"path={opts.legacy_dir}",
                 f"date={utc_now()}")
    say(f"legacy apex.amp ready: PYTHONPATH={opts.legacy_dir} {opts.python} -c "
        "'from apex import amp'")
