"""Every preflight check, in the order a real run meets them: python, torch, nvcc, pip and the
build backend, ninja, the arch list, the job budget, the source folders. Each decision is made
here from the probe's ``key=value`` lines; nothing is cloned or built.

A check that fails stops a real run at once with its sentence (exit 3). A dry run records it
instead, runs the remaining checks, and marks the checks that cannot run without it as "not
checked"; the plan then shows each (``plan.print_plan``)."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field

from coursetools.apexbuild import constants as c
from coursetools.apexbuild import probe
from coursetools.apexbuild.console import die, say, warn
from coursetools.apexbuild.estimate import build_estimate
from coursetools.apexbuild.options import Options

NO_PYTHON = "needs a working python, see FAIL python"


def version_ge(a: str, b: str) -> bool:
    """Dotted version ``a >= b``, comparing the digits of major, then minor (missing: 0)."""

    def major_minor(v: str) -> tuple[int, int]:
        major, minor = (v + ".").split(".")[:2]
        return tuple(int(re.sub(r"[^0-9]", "", part) or 0) for part in (major, minor))

    return major_minor(a) >= major_minor(b)


def major_minor(version: str) -> str:
    """``13.0`` of ``13.0.48``; "" when it does not start with two numbers."""
    match = re.match(r"([0-9]+)\.([0-9]+)", version)
    return f"{match.group(1)}.{match.group(2)}" if match else ""


def distinct_caps(caps: str) -> str:
    """``9.0,8.6,9.0`` as ``8.6;9.0``: distinct, in numeric order of major, then minor."""

    def number(text: str) -> int:
        match = re.match(r"[ \t]*(-?[0-9]+)", text)
        return int(match.group(1)) if match else 0

    seen: dict[tuple[int, int], str] = {}
    for cap in caps.split(","):
        major, _, rest = cap.partition(".")
        seen.setdefault((number(major), number(rest.partition(".")[0])), cap)
    return ";".join(seen[key] for key in sorted(seen))


@dataclass
class Preflight:
    """What the checks found (the plan's values) and which of them failed or were not run."""

    opts: Options
    fail_of: dict[str, str] = field(default_factory=dict)
    skip_of: dict[str, str] = field(default_factory=dict)
    fail_count: int = 0
    first_fail_code: int = 0
    first_fail_msg: str = ""
    python_bin: str = ""
    probed: bool = False
    p: dict[str, str] = field(default_factory=dict)
    torch_ok: bool = False
    torch_version: str = ""
    torch_cuda: str = ""
    torch_cuda_mm: str = ""
    nvcc: str = ""
    nvcc_cuda_home: str = ""
    nvcc_version: str = ""
    nvcc_note: str = ""
    plan_cuda_home: str = ""
    pip_version: str = ""
    arch_list: str = ""
    arch_source: str = ""
    jobs_budget: int = 1
    parallel_build: int = 1
    ninja_jobs: int = 1
    jobs_reason: str = ""
    ninja_bin: str = ""
    cpus: str = "1"
    estimate: str = ""
    main_src_kind: str = ""
    legacy_src_kind: str = ""

    def fail(self, label: str, code: int, *words: str) -> None:
        """A check failed: a real run stops here; a dry run records it and goes on."""
        message = " ".join(words)
        if not self.opts.dry_run:
            die(code, message)
        self.fail_of[label] = message
        self.fail_count += 1
        if self.first_fail_code == 0:
            self.first_fail_code, self.first_fail_msg = code, message

    def not_checked(self, label: str, reason: str) -> None:
        self.skip_of[label] = reason

    def failed(self, label: str) -> bool:
        return bool(self.fail_of.get(label))

    def get(self, key: str) -> str:
        """The probe's value for ``key`` ("" when it printed none)."""
        return self.p.get(key, "")


def run(opts: Options) -> Preflight:
    """Run every check for ``opts``; a real run stops (``console.Stop``) at the first failure."""
    pre = Preflight(opts)
    _python(pre)
    if not pre.probed:
        for label in ("torch", "pip", "build backend", "ninja", "jobs", "estimate"):
            pre.not_checked(label, NO_PYTHON)
        if opts.want_main:
            pre.not_checked("nvcc", NO_PYTHON)
            pre.not_checked("CUDA_HOME", NO_PYTHON)
    _torch(pre)
    if opts.want_main:
        _nvcc(pre)
    elif pre.torch_ok:
        # The legacy Python-only install needs no compiler, but use a real toolkit if there is one.
        _find_nvcc(pre)
    _pip(pre)
    if opts.want_main:
        _ninja_and_arch(pre)
        _jobs(pre)
        # Build-time estimate (see the EST_* figures in constants).
        # Without an arch list (no GPU seen): for one architecture, as the sentence says.
        if pre.probed:
            pre.estimate = build_estimate(pre.arch_list, pre.cpus,
                                          pre.parallel_build * pre.ninja_jobs, opts.course_only)
        pre.main_src_kind = resolve_source(pre, "source", "APEX_SRC", opts.apex_ref, opts.apex_src)
    if opts.want_legacy:
        pre.legacy_src_kind = resolve_source(pre, "legacy source", "APEX_LEGACY_SRC",
                                             opts.legacy_ref, opts.legacy_src)
    return pre


def _python(pre: Preflight) -> None:
    """(1) python must exist before it can be probed; then the one probe."""
    opts = pre.opts
    python_bin = probe.command_path(opts.python, opts.env)
    if not python_bin:
        pre.fail("python", 3, f"Python interpreter '{opts.python}' was not found, and Apex is",
                 "built for the Python environment that will run the notebooks; activate that "
                 "environment (e.g. `conda env create -f environment.yml && conda activate "
                 "<env>`) or set PYTHON=/path/to/python.")
        return
    pre.python_bin = python_bin if python_bin.startswith("/") else f"{opts.pwd}/{python_bin}"
    ok, output = probe.run_probe(pre.python_bin, opts.root, opts.env)
    pre.p = probe.parse_probe(output)  # what it printed, shown in the plan even when it failed
    if not ok:
        pre.fail("python", 3, f"'{pre.python_bin}' failed to run the environment probe, so "
                 "nothing about the environment can be trusted; check that "
                 f"`{opts.python} -c 'import sys'` works in this shell.")
        return
    pre.probed = True


def _torch(pre: Preflight) -> None:
    """(2) torch imports; (3) it is a CUDA build. The legacy install compiles nothing, but its
    setup.py needs torch's CUDA_HOME, which a CPU build of torch leaves unset - and apex.amp's
    O1-O3 need a GPU anyway."""
    opts = pre.opts
    if not pre.probed:
        return
    if not pre.get("torch_error") and pre.get("torch_version"):
        pre.torch_ok = True
        pre.torch_version = pre.get("torch_version")
        pre.torch_cuda = "" if pre.get("torch_cuda") == "None" else pre.get("torch_cuda")
        pre.torch_cuda_mm = major_minor(pre.torch_cuda)
    else:
        pre.fail("torch", 3, "PyTorch cannot be imported by",
                 f"{pre.python_bin} ({pre.get('torch_error')}), and Apex is compiled against and "
                 "runs on the installed torch; install torch with CUDA first, e.g. "
                 "`conda env create -f environment.yml`.")
    if pre.torch_ok and not pre.torch_cuda:
        if opts.want_main:
            pre.fail("torch", 3, f"torch {pre.torch_version} is a CPU-only build "
                     "(torch.version.cuda is None), but Apex's CUDA kernels need a CUDA build of "
                     "torch; install one, e.g. `conda env create -f environment.yml` or "
                     f"`{opts.python} -m pip install torch=={opts.torch_pin} --index-url "
                     f"https://download.pytorch.org/whl/cu{c.COURSE_CUDA.replace('.', '')}`.")
        else:
            pre.fail("torch", 3, f"torch {pre.torch_version} is a CPU-only build "
                     "(torch.version.cuda is None): the legacy apex.amp install needs a CUDA "
                     "build of torch (its setup.py reads torch's CUDA_HOME and amp.initialize "
                     "needs a GPU); run it on the GPU machine, e.g. `make apex` there.")


def _find_nvcc(pre: Preflight) -> None:
    """nvcc as the probe found it (helpers.environment.find_nvcc); without a working lookup the
    main build stops (the legacy install goes on)."""
    opts = pre.opts
    if pre.get("nvcc_error"):
        if opts.want_main:
            pre.fail("nvcc", 3, f"the course's nvcc lookup (helpers.environment in {opts.root})",
                     f"failed in {pre.python_bin} ({pre.get('nvcc_error')}), and Apex's CUDA "
                     "extensions are compiled with nvcc; run this script from a full checkout "
                     "of the course, in its environment.")
        else:
            warn(f"could not look for nvcc ({pre.get('nvcc_error')}); the legacy install goes "
                 "on without it")
        return
    pre.nvcc = pre.get("nvcc")
    if not pre.nvcc:
        return
    cuda_home = opts.env.get("CUDA_HOME", "")
    if cuda_home and pre.nvcc != f"{cuda_home}/bin/nvcc":
        warn(f"CUDA_HOME={cuda_home} has no bin/nvcc; using {pre.nvcc} instead")
    # Its toolkit (helpers.environment.nvcc_toolkit: where the CUDA headers are, also for a
    # wrapper script such as /usr/local/bin/nvcc), else the folder above its bin.
    pre.nvcc_cuda_home = pre.get("nvcc_cuda_home") or os.path.normpath(
        os.path.join(opts.pwd, os.path.dirname(pre.nvcc) or ".", ".."))
    pre.nvcc_version = pre.get("nvcc_release")  # "... release 13.0, V13.0.48" -> 13.0


def _nvcc(pre: Preflight) -> None:
    """(4) nvcc is found, (5) its release is torch's CUDA. The plan's CUDA_HOME is the toolkit of
    the nvcc found, exported for the build only once that nvcc has passed its checks; the line
    says why it is not used otherwise. The toolkit hints name torch's CUDA, or for a CPU-only
    torch the CUDA of the torch build suggested for it."""
    opts = pre.opts
    want_cuda = pre.torch_cuda_mm or c.COURSE_CUDA
    if not pre.torch_ok:
        if pre.probed:
            pre.not_checked("nvcc", "the course's nvcc lookup, helpers.environment, imports "
                            "torch, see FAIL torch")
            pre.not_checked("CUDA_HOME", "the toolkit of the nvcc found, and nvcc is not looked "
                            "up, see FAIL torch")
        return
    _find_nvcc(pre)
    # Until nvcc passes: its toolkit, not used because of the FAIL nvcc line.
    pre.plan_cuda_home = (f"{pre.nvcc_cuda_home or 'unknown'} (the toolkit of "
                          f"{pre.nvcc or 'no nvcc found'}, unused until nvcc passes, "
                          "see FAIL nvcc)")
    if pre.failed("nvcc"):
        pre.plan_cuda_home = "unknown (the course's nvcc lookup failed, see FAIL nvcc)"
    elif not pre.nvcc:
        pre.plan_cuda_home = "unknown (no nvcc found, see FAIL nvcc)"
        pre.fail("nvcc", 3, "no nvcc found (looked in $CUDA_HOME/bin, $CONDA_PREFIX/bin and",
                 "PATH), and Apex's CUDA extensions are compiled with nvcc; install the CUDA "
                 f"toolkit matching torch's CUDA {want_cuda}, e.g. `conda install -c conda-forge "
                 f"cuda-nvcc={want_cuda} cuda-toolkit={want_cuda}`, or set CUDA_HOME to an "
                 "installed toolkit.")
    elif not pre.nvcc_version:
        pre.fail("nvcc", 3, f"could not read the CUDA release from `{pre.nvcc} --version`,",
                 f"which Apex's setup.py needs to match torch's CUDA {want_cuda}; check that "
                 f"this nvcc runs, or set CUDA_HOME to a working CUDA {want_cuda} toolkit.")
    elif not pre.torch_cuda_mm:
        pre.nvcc_note = "; not compared with torch, a CPU-only build, see FAIL torch"
        pre.plan_cuda_home = (f"{pre.nvcc_cuda_home} (the toolkit of {pre.nvcc}, unused while "
                              "torch is a CPU-only build, see FAIL torch)")
    elif pre.nvcc_version != pre.torch_cuda_mm:
        mm = pre.torch_cuda_mm
        pre.fail("nvcc", 3, f"nvcc at {pre.nvcc} is CUDA {pre.nvcc_version} but torch",
                 f"{pre.torch_version} was built with CUDA {mm}, and Apex's setup.py refuses "
                 f"mismatched versions; install the matching toolkit (`conda install -c "
                 f"conda-forge cuda-nvcc={mm} cuda-toolkit={mm}`) or set CUDA_HOME to a CUDA "
                 f"{mm} toolkit.")
    else:
        opts.env["CUDA_HOME"] = pre.nvcc_cuda_home  # exported for everything that follows
        pre.plan_cuda_home = pre.nvcc_cuda_home


def _pip(pre: Preflight) -> None:
    """(6) pip, plus the build backend that --no-build-isolation expects to be present already."""
    python = pre.opts.python
    pre.pip_version = pre.get("pip_version")
    if not pre.probed:
        return
    if pre.pip_version in ("", "none"):
        pre.fail("pip", 3, f"pip is not available for {pre.python_bin}, and Apex is installed "
                 f"with pip; install it with `{python} -m ensurepip --upgrade`.")
    elif not version_ge(pre.pip_version, c.MIN_PIP):
        pre.fail("pip", 3, f"pip {pre.pip_version} is older than {c.MIN_PIP}, which Apex's",
                 "build instructions require for --no-build-isolation installs with build "
                 f"settings; upgrade it with `{python} -m pip install --upgrade pip=={c.PIP_PIN}` "
                 f"(any pip >= {c.MIN_PIP} works).")
    if pre.get("build_deps_missing"):
        pre.fail("build backend", 3, "the build backend packages",
                 f"{pre.get('build_deps_missing')} are missing, and --no-build-isolation builds "
                 f"use the installed ones; install them with `{python} -m pip install "
                 f"setuptools=={c.SETUPTOOLS_PIN} packaging=={c.PACKAGING_PIN} "
                 f"wheel=={c.WHEEL_PIN}`.")


def _ninja_and_arch(pre: Preflight) -> None:
    """(7) ninja (without it torch compiles every file serially); (8) a GPU or an arch list."""
    opts = pre.opts
    if pre.probed:
        if pre.get("ninja") != "yes":
            pre.fail("ninja", 3, "ninja was not found (neither `import ninja`",
                     "nor a ninja binary on PATH), and without it torch compiles Apex's "
                     "extensions one file at a time and ignores MAX_JOBS; install it with "
                     f"`{opts.python} -m pip install ninja=={opts.ninja_pin}`.")
        pre.ninja_bin = pre.get("ninja_bin")
    gpu_caps = pre.get("gpu_caps")
    if opts.env.get("TORCH_CUDA_ARCH_LIST"):
        pre.arch_list = opts.env["TORCH_CUDA_ARCH_LIST"]
        pre.arch_source = "from TORCH_CUDA_ARCH_LIST"
    elif not pre.probed:
        pre.not_checked("arch list", NO_PYTHON)
    elif not pre.torch_ok:
        pre.not_checked("arch list", "torch lists the visible GPUs, see FAIL torch")
    elif pre.get("cuda_available") == "True" and gpu_caps:
        pre.arch_list, pre.arch_source = distinct_caps(gpu_caps), "from the visible GPUs"
    else:
        pre.fail("arch list", 3, "torch sees no GPU and TORCH_CUDA_ARCH_LIST is unset, so there "
                 "is no", "way to know which GPU architectures to compile Apex for; run this on "
                 "the GPU machine or set it, e.g. "
                 f"`TORCH_CUDA_ARCH_LIST=\"8.0;9.0\" ./{c.PROG}`.")


def _jobs(pre: Preflight) -> None:
    """Parallelism: budget = min(CPUs, free GiB / GIB_PER_JOB) unless APEX_JOBS overrides it,
    split into extensions at once (at most MAX_PARALLEL_EXT, and no more than --course-only
    builds, so that its three extensions get all the jobs) x ninja jobs each."""
    opts = pre.opts
    cpus, mem = pre.get("cpu_count"), pre.get("mem_free_gib")
    if not re.fullmatch(r"[0-9]+", cpus):
        cpus = "1"
    pre.cpus = cpus
    mem_whole = mem.split(".", 1)[0]
    if opts.apex_jobs:
        pre.jobs_budget, pre.jobs_reason = int(opts.apex_jobs), "from APEX_JOBS"
    elif re.fullmatch(r"[0-9]+", mem_whole):
        pre.jobs_budget = min(int(cpus), int(mem_whole) // c.GIB_PER_JOB)
        pre.jobs_reason = f"min({cpus} CPUs, {mem} GiB free / {c.GIB_PER_JOB} GiB per job)"
    else:
        pre.jobs_budget, pre.jobs_reason = int(cpus), f"{cpus} CPUs, free memory unknown"
    pre.jobs_budget = max(pre.jobs_budget, 1)
    ext_cap = 3 if opts.course_only else c.MAX_PARALLEL_EXT
    pre.parallel_build = min(pre.jobs_budget, ext_cap)
    pre.ninja_jobs = max(pre.jobs_budget // pre.parallel_build, 1)


def resolve_source(pre: Preflight, label: str, name: str, ref: str, src: str) -> str:
    """Check a local source folder against ``ref`` (read-only): ``clone`` without one, ``git``
    for a checkout at ``ref``, ``plain`` for a folder without .git; "" when the check failed
    (in a dry run)."""
    if not src:
        return "clone"
    if not os.path.isfile(f"{src}/setup.py"):
        pre.fail(label, 3, f"{name}={src} has no setup.py, so it is not an Apex source",
                 f"folder; point {name} at an Apex checkout or unset it to clone {c.APEX_URL}.")
        return ""
    if not os.path.exists(f"{src}/.git"):
        say(f"note: {name}={src} has no .git, so its commit cannot be verified; recording {ref} "
            "as given.")
        return "plain"
    git = probe.command_path("git", pre.opts.env)
    if not git:
        pre.fail(label, 3, f"{name}={src} is a git checkout but git is not installed,",
                 f"so its commit cannot be checked; install git or unset {name}.")
        return ""
    try:
        proc = subprocess.run([git, "-C", src, "rev-parse", "HEAD"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=pre.opts.env)
        head = probe.decode(proc.stdout).rstrip("\n")
    except OSError:
        head = ""
    if head != ref:
        pre.fail(label, 3, f"{name}={src} is checked out at {head or '<unknown>'}, but the",
                 f"requested commit is {ref}; run `git -C {src} checkout {ref}` or set the "
                 f"commit to {head}.")
        return ""
    return "git"
