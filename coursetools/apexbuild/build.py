"""The main build, once every check has passed: stage a clean tree of the commit (a blobless
clone, or a private copy of a local folder), trim it for ``--course-only``, ``pip install`` it
with the extensions on, verify it with ``helpers.apexcheck --verify``, and write the marker
that lets the next run skip a build that is current and still verified.

Everything that runs python runs the python Apex is built for, with the caller's PYTHONPATH
less the legacy folder (``options.clean_pythonpath``)."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time

from coursetools.apexbuild import constants as c
from coursetools.apexbuild.console import die, exit_status, run_logged, say, tail, warn
from coursetools.apexbuild.options import env_in
from coursetools.apexbuild.plan import json_get
from coursetools.apexbuild.preflight import Preflight
from coursetools.apexbuild.probe import command_path, decode


def flush() -> None:
    """Everything printed so far goes out before a child writes to the same streams."""
    sys.stdout.flush()
    sys.stderr.flush()


def _git(env: dict[str, str], *args: str, quiet: bool = False,
         capture: bool = False) -> subprocess.CompletedProcess:
    """``git ARGS``: its stdout captured when ``capture``, its stderr dropped when ``quiet``,
    else both the build's; a git that cannot be run exits 127."""
    flush()
    git = command_path("git", env) or "git"
    try:
        return subprocess.run([git, *args], env=env,
                              stdout=subprocess.PIPE if capture else None,
                              stderr=subprocess.DEVNULL if quiet else None)
    except OSError:
        return subprocess.CompletedProcess([git, *args], 127, b"")


def remove(path: str) -> None:
    """``rm -rf PATH``."""
    if os.path.islink(path) or os.path.isfile(path):
        os.remove(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def _remove_build_products(dest: str) -> None:
    """Stale objects from another torch/arch must not be reused."""
    for path in [f"{dest}/build", *sorted(glob.glob(glob.escape(dest) + "/*.egg-info"))]:
        remove(path)


def _make_user_writable(root: str) -> None:
    """``chmod -R u+w ROOT``."""
    for folder, dirs, files in os.walk(root):
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            if not os.path.islink(name):
                os.chmod(name, os.stat(name).st_mode | stat.S_IWUSR)


def stage_source(pre: Preflight, kind: str, src: str, ref: str, dest: str) -> None:
    """Make ``dest`` a clean, writable tree of ``ref`` to build from."""
    env = pre.opts.env
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    if kind == "clone":
        if not os.path.isdir(f"{dest}/.git"):
            remove(dest)
            say(f"cloning {c.APEX_URL} into {dest}")
            if _git(env, "clone", "--quiet", "--filter=blob:none", c.APEX_URL, dest).returncode:
                die(4, f"git clone of {c.APEX_URL} failed; check network access or set APEX_SRC "
                    "to a local checkout.")
        elif _git(env, "-C", dest, "cat-file", "-e", f"{ref}^{{commit}}", quiet=True).returncode:
            if _git(env, "-C", dest, "fetch", "--quiet", "origin").returncode:
                die(4, f"git fetch in {dest} failed; check network access.")
        checkout = ("-C", dest, "-c", "advice.detachedHead=false", "checkout", "--quiet",
                    "--force", ref)
        if _git(env, *checkout).returncode:
            die(4, f"commit {ref} does not exist in {c.APEX_URL}; check APEX_REF / "
                "APEX_LEGACY_REF.")
        head = decode(_git(env, "-C", dest, "rev-parse", "HEAD", capture=True).stdout or b"")
        head = head.rstrip("\n")
        if head != ref:
            die(4, f"{dest} is at {head} after checkout, expected {ref}.")
        _remove_build_products(dest)
    else:
        # Build from a private copy: the user's folder stays clean and may be read-only.
        remove(dest)
        shutil.copytree(src, dest, symlinks=True, copy_function=shutil.copy)
        _make_user_writable(dest)
        remove(f"{dest}/.git")
        _remove_build_products(dest)


def keep_course_extensions(setup_py: str) -> None:
    """In the staged copy, keep only COURSE_EXTENSIONS in the ext_modules list Apex's setup.py
    hands to setup(); one sentence if that list is not found."""
    keep = c.COURSE_EXTENSIONS.split(",")
    try:
        with open(setup_py, encoding="latin-1") as fh:
            text = fh.read()
        calls = [m.start() for m in re.finditer(r"^setup\(", text, re.M)]
        trimmable = "ext_modules" in text and len(calls) == 1
        if trimmable:
            trim = ("# added by the course's build_apex.sh --course-only: only the extensions "
                    "it uses\n"
                    f"ext_modules = [e for e in ext_modules if e.name in {keep!r}]\n"
                    "print('[apex] --course-only:', [e.name for e in ext_modules])\n\n")
            with open(setup_py, "w", encoding="latin-1") as fh:
                fh.write(text[:calls[0]] + trim + text[calls[0]:])
    except OSError:
        trimmable = False
    if not trimmable:
        die(4, f"--course-only: {setup_py} has no top-level 'setup(' call after an 'ext_modules' "
            "list, so this Apex commit cannot be trimmed; build without --course-only.")


def write_marker(path: str, *items: str) -> None:
    """A JSON marker of ``key=value`` items: lists comma separated, numbers and bools typed."""
    data: dict[str, object] = {}
    for item in items:
        key, value = item.split("=", 1)
        if key in ("verified_extensions",):
            data[key] = [v for v in value.split(",") if v]
        elif key == "build_seconds":
            data[key] = int(value)
        elif value in ("true", "false"):
            data[key] = value == "true"
        else:
            data[key] = value
    with open(path + ".tmp", "w", encoding="utf-8", errors="surrogateescape") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    os.replace(path + ".tmp", path)


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _values(lines: list[str], prefix: str) -> str:
    """The rest of every line that starts with ``prefix``, one a line (``sed -n s/^P//p``)."""
    return "\n".join(ln[len(prefix):] for ln in lines if ln.startswith(prefix)).rstrip("\n")


def _with_path(first: str, rest: str) -> str:
    """``FIRST${REST:+:$REST}``."""
    return f"{first}:{rest}" if rest else first


class MainBuild:
    """The main Apex: current (marker matches and it verifies), or built, verified, marked."""

    def __init__(self, pre: Preflight) -> None:
        self.pre, self.opts = pre, pre.opts
        self.verified, self.verify_msg = "", ""

    def verify(self) -> bool:
        """``helpers.apexcheck --verify`` imports the extensions and, on a GPU, runs a FusedAdam
        step and a FusedLayerNorm forward against torch in float64 (the course's one kernel
        check). Its lines are shown, its ``verified=``/``error=``/``warning=`` lines read."""
        opts = self.opts
        os.makedirs(opts.workdir, exist_ok=True)
        env = env_in(opts.env, opts.workdir,
                     PYTHONPATH=_with_path(opts.root, opts.clean_pythonpath))
        cmd = [self.pre.python_bin, "-m", "helpers.apexcheck", "--verify", "--legacy-dir",
               opts.legacy_dir]
        flush()
        with open(opts.verify_log, "ab") as log:
            try:
                proc = subprocess.run(cmd, cwd=opts.workdir, env=env, stdout=subprocess.PIPE,
                                      stderr=log)
                out, rc = decode(proc.stdout).rstrip("\n"), exit_status(proc.returncode)
            except OSError:
                out, rc = "", 126
        with open(opts.verify_log, "a", encoding="utf-8", errors="surrogateescape") as log:
            log.write(out + "\n")
        lines = out.split("\n")
        for line in lines:
            if not re.match(r"(verified|error|warning)=", line):
                print(f"  {line}", file=sys.stdout)
        self.verified = _values(lines, "verified=")
        self.verify_msg = _values(lines, "error=")
        if any(line.startswith("warning=") for line in lines):
            warn(_values(lines, "warning="))
        if not self.verify_msg and rc != 0:
            self.verify_msg = f"python -m helpers.apexcheck --verify exited with status {rc}"
        return not self.verify_msg

    def is_current(self) -> bool:
        opts, pre = self.opts, self.pre
        commit = json_get(opts.marker, "commit")
        torch = json_get(opts.marker, "torch_version")
        built = json_get(opts.marker, "extensions")
        if commit != opts.apex_ref or torch != pre.torch_version:
            return False
        if built == "course-only" and not opts.course_only:
            say("the installed Apex has only the course's extensions (--course-only); building "
                "the full set.")
            return False
        if self.verify():
            say(f"Apex {opts.apex_ref} is already built for torch {pre.torch_version} and "
                f"verified ({opts.marker}); use --force to rebuild.")
            return True
        say(f"{opts.marker} matches, but verification fails ({self.verify_msg}); rebuilding.")
        return False

    def build(self) -> None:
        opts, pre = self.opts, self.pre
        src = f"{opts.workdir}/src/apex"
        say(f"estimate: {pre.estimate}")
        stage_source(pre, pre.main_src_kind, opts.apex_src, opts.apex_ref, src)
        if opts.course_only:
            keep_course_extensions(f"{src}/setup.py")
        if not os.path.isdir(opts.marker):
            remove(opts.marker)
        say("removing any previously installed 'apex'")
        flush()
        try:
            uninstall = subprocess.run(
                [pre.python_bin, "-m", "pip", "uninstall", "-y", "apex"],
                env=dict(opts.env, PYTHONPATH=opts.clean_pythonpath),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        except OSError:
            uninstall = 126
        if uninstall:
            warn("pip uninstall apex failed; continuing (the install below replaces it)")
        # nvcc's toolkit first; the ninja binary found by the probe (may live in the env's bin).
        cuda_home = opts.env.get("CUDA_HOME", "")
        extra_path = f"{cuda_home}/bin"
        if pre.ninja_bin:
            extra_path += f":{os.path.dirname(pre.ninja_bin)}"
        say(f"building Apex {opts.apex_ref} for TORCH_CUDA_ARCH_LIST={pre.arch_list} with "
            f"APEX_PARALLEL_BUILD={pre.parallel_build} MAX_JOBS={pre.ninja_jobs}")
        say(f"build log: {opts.build_log}")
        start = int(time.time())
        env = env_in(opts.env, src, APEX_CPP_EXT="1", APEX_CUDA_EXT="1",
                   TORCH_CUDA_ARCH_LIST=pre.arch_list, APEX_PARALLEL_BUILD=str(pre.parallel_build),
                   MAX_JOBS=str(pre.ninja_jobs),
                   PATH=f"{extra_path}:{opts.env.get('PATH', '')}",
                   PYTHONPATH=opts.clean_pythonpath)
        with open(opts.build_log, "wb") as log:
            log.write((f"# {c.PROG}: commit {opts.apex_ref}, CUDA_HOME={cuda_home}, "
                       f"TORCH_CUDA_ARCH_LIST={pre.arch_list}, APEX_PARALLEL_BUILD="
                       f"{pre.parallel_build}, MAX_JOBS={pre.ninja_jobs}, NVCC_APPEND_FLAGS="
                       f"{opts.env.get('NVCC_APPEND_FLAGS', '')}\n").encode("utf-8",
                                                                            "surrogateescape"))
            log.flush()
            cmd = [pre.python_bin, "-m", "pip", "install", "-v", "--no-build-isolation",
                   "--no-deps", "."]
            rc = run_logged(cmd, src, env, log)
        seconds = int(time.time()) - start
        if rc != 0:
            tail(opts.build_log)
            die(4, f"pip install of Apex failed (exit {rc}) after {seconds}s; the last 30 lines "
                f"are above, the full log is {opts.build_log}.")
        say(f"build finished in {seconds}s")
        if not self.verify():
            die(5, f"verification failed: {self.verify_msg} - rebuild with ./{c.PROG} --force "
                f"(details in {opts.verify_log}).")
        write_marker(
            opts.marker, f"commit={opts.apex_ref}",
            f"commit_verified={'false' if pre.main_src_kind == 'plain' else 'true'}",
            f"source={opts.apex_src or c.APEX_URL}", f"torch_version={pre.torch_version}",
            f"torch_cuda={pre.torch_cuda}", f"nvcc_version={pre.nvcc_version}",
            f"cuda_home={cuda_home}", f"arch_list={pre.arch_list}", f"build_seconds={seconds}",
            f"date={utc_now()}", f"verified_extensions={self.verified}",
            f"extensions={'course-only' if opts.course_only else 'full'}")
        say(f"Apex {opts.apex_ref} installed and verified ({self.verified}); marker: "
            f"{opts.marker}")
