"""The Apex build (``build_apex.sh`` over ``coursetools.apexbuild``) with no GPU, nvcc or network:
``main`` in-process, the probe a dict; a python stand-in plays pip and the checks, git clones."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from coursetools import apexbuild
from coursetools.apexbuild import preflight

REPO = Path(__file__).resolve().parents[1]
GOOD = dict(python_version="3.11.9", cpus=16, mem_free_gib=100.0, disk_free_gib=50.0,
            ninja_bin="/env/bin/ninja", site_packages="/env/site-packages", pip_version="24.2",
            build_deps_missing="", torch_version="2.11.0+cu130", torch_cuda="13.0",
            gpu_caps=["9.0", "9.0"], nvcc="/cuda/bin/nvcc", nvcc_release="13.0",
            nvcc_cuda_home="/cuda")
CPU = dict(torch_version="2.11.0+cpu", torch_cuda="", gpu_caps=[])
PYTHON = """#!/bin/bash
echo "python $* | PYTHONPATH=${PYTHONPATH-} CUDA_HOME=${CUDA_HOME-} APEX_CPP_EXT=${APEX_CPP_EXT-}\
 ARCH=${TORCH_CUDA_ARCH_LIST-} JOBS=${APEX_PARALLEL_BUILD-}x${MAX_JOBS-} PATH=${PATH%%:*}\
 PWD=$PWD" >>"$FAKE_CALLS"
case "$1 $2" in
  "-m helpers.apexcheck") printf '%s\\n' "$FAKE_VERIFY"; exit "${FAKE_VERIFY_RC:-0}" ;;
  "-m pip") [ "$3" = install ] || exit 0
    [ "$6" = --target ] && mkdir -p "$7/apex" && echo > "$7/apex/amp.py"
    for i in {1..40}; do echo "pip line $i"; done; exit "${FAKE_PIP_RC:-0}" ;;
  "-c from apex import amp") [ -f "${PYTHONPATH%%:*}/apex/amp.py" ]; exit ;;
esac
exit 97
"""
GIT = """#!/bin/bash
echo "git $*" >>"$FAKE_CALLS"
case "$1 $3" in
  clone*) mkdir -p "${@: -1}/.git"; printf 'ext_modules = []\\nsetup()\\n' >"${@: -1}/setup.py" ;;
  "-C checkout") echo "${@: -1}" >"$2/.git/head" ;;
  "-C rev-parse") cat "$2/.git/head" ;;
esac
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


class Box:
    """A machine for the build: ``probe`` is what the probe answers, ``run`` is the script."""

    def __init__(self, root: Path, capfd, monkeypatch) -> None:
        self.root, self.capfd, self.mp, self.probe = root, capfd, monkeypatch, dict(GOOD)
        self.python, self.work = _write(root / "bin" / "python", PYTHON), root / "work"
        self.git = _write(root / "bin" / "git", GIT)
        for tool in ("mkdir", "cat"):  # all the stand-ins need, and no real python or git
            (root / "bin" / tool).symlink_to(shutil.which(tool))
        (root / "calls").touch()
        for name in ("PYTHON", "APEX_REF", "APEX_LEGACY_REF", "APEX_SRC", "APEX_LEGACY_SRC",
                     "APEX_JOBS", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME", "FAKE_PIP_RC"):
            monkeypatch.delenv(name, raising=False)
        self.env(PATH=str(root / "bin"), APEX_WORKDIR=str(self.work),
                 FAKE_CALLS=str(root / "calls"), PYTHONPATH=f"{self.work}/legacy-amp:/elsewhere",
                 FAKE_VERIFY="ok   import amp_C\nok   FusedAdam on cuda matches torch in float64"
                 "\nverified=amp_C,apex_C,fused_layer_norm_cuda,FusedAdam,FusedLayerNorm")
        monkeypatch.setattr(preflight, "probe", lambda opts: dict(self.probe))

    def env(self, **values: str) -> None:
        for name, value in values.items():
            self.mp.setenv(name, value)

    def run(self, *args: str) -> SimpleNamespace:
        self.capfd.readouterr()
        rc = apexbuild.main(list(args), root=str(REPO), python=str(self.python))
        out, err = self.capfd.readouterr()
        return SimpleNamespace(rc=rc, out=out, err=err, plan=plan_of(out))

    def calls(self) -> list[str]:
        return (self.root / "calls").read_text().splitlines()


@pytest.fixture
def box(tmp_path, capfd, monkeypatch) -> Box:
    return Box(tmp_path, capfd, monkeypatch)


def plan_of(out: str) -> dict[str, str]:
    """The plan's rows, {label: value}; a failed check as {"FAIL label": sentence}."""
    rows = [line.strip().partition(": ") for line in out.splitlines() if line.startswith("  ")]
    return {label.rstrip(":"): value.strip() for label, _, value in rows}


def error_of(result) -> str:
    """The one error sentence (and that there is exactly one)."""
    errors = [ln for ln in result.err.splitlines() if ln.startswith("build_apex.sh: error: ")]
    assert len(errors) == 1, result.err
    return errors[0].removeprefix("build_apex.sh: error: ")


def test_help_and_usage_errors(box: Box) -> None:
    helped = box.run("--help")
    assert helped.rc == 0
    for word in ("--dry-run", "--force", "--course-only", "--legacy-amp", "--legacy-only",
                 "APEX_SRC", "APEX_LEGACY_SRC", "APEX_REF", "TORCH_CUDA_ARCH_LIST", "APEX_JOBS",
                 "APEX_WORKDIR", "CUDA_HOME", apexbuild.PINNED_REF, "exit codes"):
        assert word in helped.out, word
    assert box.run("--frobnicate").rc == 2
    for name, value in (("APEX_REF", "master"), ("APEX_LEGACY_REF", "abc"), ("APEX_JOBS", "0")):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(name, value)
            wrong = box.run("--dry-run")
        assert wrong.rc == 2 and f"{name} must be" in wrong.err and f"'{value}'" in wrong.err
    assert box.calls() == []


def _no_torch(box: Box) -> None:
    for key in [k for k in box.probe if k.startswith(("torch", "gpu", "nvcc"))]:
        del box.probe[key]
    box.probe["torch_error"] = "ModuleNotFoundError: No module named 'torch'"


def _folder(box: Box, git_head: str | None = None) -> Path:
    """A local Apex source folder (a git checkout at ``git_head`` when given) as APEX_SRC."""
    src = box.root / "apex-src"
    (src / "apex").mkdir(parents=True)
    (src / "setup.py").write_text("ext_modules = []\nsetup(\n)\n")
    if git_head is not None:
        _write(src / ".git" / "head", git_head + "\n")
    box.env(APEX_SRC=str(src))
    return src


PREFLIGHT = [  # every preflight sentence: what breaks, the arguments, its plan row, its words
    (_no_torch, (), "torch", ["PyTorch cannot be imported", "environment.yml"]),
    (CPU, (), "torch", ["is a CPU-only build", "torch==2.13.0 --index-url"]),
    (CPU, ("--legacy-only",), "torch", ["legacy apex.amp install"]),
    ({"nvcc_error": "ImportError: x"}, (), "nvcc", ["nvcc lookup"]),
    ({"nvcc": ""}, (), "nvcc", ["no nvcc found", "cuda-nvcc=13.0 cuda-toolkit=13.0", "CUDA_HOME"]),
    ({"nvcc_release": ""}, (), "nvcc", ["could not read the CUDA release"]),
    ({"nvcc_release": "12.4"}, (), "nvcc", ["is CUDA 12.4 but torch", "built with CUDA 13.0",
                                            "cuda-nvcc=13.0"]),
    ({"nvcc_release": "13.1"}, (), "nvcc", ["is CUDA 13.1 but torch",  # Apex's rule
                                            "refuses mismatched versions"]),
    ({"pip_version": ""}, (), "pip", ["pip is not available", "ensurepip"]),
    ({"pip_version": "22.3.1"}, (), "pip", ["pip 22.3.1 is older than 23.1", "--upgrade pip=="]),
    ({"build_deps_missing": "setuptools"}, (), "build backend", ["setuptools are missing",
                                                                 "setuptools=="]),
    ({"ninja_bin": ""}, (), "ninja", ["ninja was not found", "ninja==1.13.0"]),
    ({"gpu_caps": []}, (), "arch list", ["torch sees no GPU", 'TORCH_CUDA_ARCH_LIST="8.0;9.0"']),
    ({"mem_free_gib": 2.5}, (), "jobs", ["only 2.5 GiB of memory is free",
                                         "4 GiB for each compile job", "APEX_JOBS=1"]),
    ({"disk_free_gib": 1.2}, (), "disk", ["only 1.2 GiB of disk is free", "APEX_WORKDIR="]),
    ({"apex_where": "/src/apex/apex", "apex_pip": False}, (), "installed apex", [
        "/src/apex/apex, a folder that pip does not manage", "PYTHONPATH"]),
    (lambda b: (_folder(b) / "setup.py").unlink(), (), "source", ["has no setup.py"]),
    (lambda b: _folder(b, git_head="0" * 40), (), "source", [f"checked out at {'0' * 40}"]),
    (lambda b: (_folder(b, git_head=""), b.git.unlink()), (), "source", [
        "is a git checkout but git is not installed"]),
    (lambda b: b.git.unlink(), (), "source", [
        "git is not installed, and the build clones Apex with it"]),
]


@pytest.mark.parametrize(("breaks", "args", "label", "said"), PREFLIGHT,
                         ids=[" ".join((label, *args, said[0])) for _, args, label, said in
                              PREFLIGHT])
def test_a_preflight_failure_is_one_sentence_and_a_plan_row(box, breaks, args, label, said) -> None:
    breaks(box) if callable(breaks) else box.probe.update(breaks)
    if label != "arch list":
        box.env(TORCH_CUDA_ARCH_LIST="9.0")  # a CPU torch sees no GPU either
    real, dry = box.run(*args), box.run("--dry-run", *args)
    assert (real.rc, dry.rc) == (3, 3)
    assert real.plan == {} and error_of(real) == error_of(dry) == dry.plan[f"FAIL {label}"]
    assert [words for words in said if words not in error_of(real)] == [], error_of(real)
    assert "1 preflight check(s) failed" in dry.out and len(dry.plan) >= 5  # the whole plan
    assert not box.work.exists() and all("rev-parse" in c for c in box.calls())  # a HEAD at most


def test_the_dry_run_runs_every_check_and_stops_with_the_first(box: Box) -> None:
    box.probe.update(nvcc="", pip_version="22.3.1", ninja_bin="", gpu_caps=[], disk_free_gib=0.5)
    dry = box.run("--dry-run")
    fails = [label for label in dry.plan if label.startswith("FAIL ")]
    assert fails == ["FAIL nvcc", "FAIL pip", "FAIL ninja", "FAIL arch list", "FAIL disk"]
    assert "5 preflight check(s) failed" in dry.out and error_of(dry).startswith("no nvcc found")
    assert dry.plan["torch"].startswith("2.11.0+cu130")  # the checks that pass keep their value


@pytest.mark.parametrize(("wrong", "warning"), [
    ("apex 0.9.10 from PyPI", "the unrelated apex 0.9.10 from PyPI, not NVIDIA Apex, and has none "
     "of its kernels; the build uninstalls it first (`pip uninstall -y apex`)."),
    ("", "Apex at /env/apex is Python-only: `import apex` works, but amp_C, apex_C are missing, "
     "so its fused kernels are absent; the build replaces it."),
])
def test_an_apex_the_build_replaces_is_named(box: Box, wrong: str, warning: str) -> None:
    box.probe.update(apex_where="/env/apex", apex_pip=True, apex_wrong=wrong,
                     apex_missing="amp_C, apex_C")
    dry = box.run("--dry-run")
    assert dry.rc == 0 and warning in dry.err and dry.plan["installed apex"] == "/env/apex"


def test_the_plan(box: Box) -> None:
    box.probe["gpu_caps"] = ["9.0", "8.6", "9.0", "12.0"]
    box.env(APEX_REF=apexbuild.PINNED_REF.upper())
    dry = box.run("--dry-run")
    assert dry.rc == 0 and dry.err == "" and dry.out.endswith("nothing was cloned, built or "
                                                              "installed.\n")
    assert dry.plan["arch list"] == "TORCH_CUDA_ARCH_LIST=8.6;9.0;12.0 (from the visible GPUs)"
    assert dry.plan["commit"] == apexbuild.PINNED_REF  # a commit in capitals is the same one
    assert dry.plan["nvcc"] == "13.0 (/cuda/bin/nvcc; CUDA_HOME=/cuda)"
    assert dry.plan["install target"].startswith("/env/site-packages")
    assert dry.plan["source"].startswith(f"clone https://github.com/NVIDIA/apex into {box.work}")
    assert dry.plan["installed apex"] == "none" and dry.plan["marker"].endswith("(none yet)")
    assert dry.plan["estimate"] == preflight.estimate("8.6;9.0;12.0", 16, 16, False)
    box.probe.update(CPU)
    box.env(TORCH_CUDA_ARCH_LIST="8.0;9.0")  # no GPU needed with a list; nvcc not compared
    dry = box.run("--dry-run", "--course-only")
    assert dry.plan["arch list"] == "TORCH_CUDA_ARCH_LIST=8.0;9.0 (from TORCH_CUDA_ARCH_LIST)"
    assert dry.plan["nvcc"].endswith("; not compared: torch is a CPU-only build)")


@pytest.mark.parametrize(("cpus", "mem", "jobs", "args", "row"), [
    (64, 20.7, "", (), "APEX_PARALLEL_BUILD=5 MAX_JOBS=1 (budget 5: min(64 CPUs, 20.7 GiB"),
    (4, 500.0, "", (), "APEX_PARALLEL_BUILD=4 MAX_JOBS=1 (budget 4: min(4 CPUs"),
    (2, 8.0, "20", (), "APEX_PARALLEL_BUILD=8 MAX_JOBS=2 (budget 20: from APEX_JOBS)"),
    (2, 1.0, "1", (), "APEX_PARALLEL_BUILD=1 MAX_JOBS=1 (budget 1: from APEX_JOBS)"),
    (16, 100.0, "", ("--course-only",), "APEX_PARALLEL_BUILD=3 MAX_JOBS=5 (budget 16"),
    (3, None, "", (), "APEX_PARALLEL_BUILD=3 MAX_JOBS=1 (budget 3: 3 CPUs, free memory"),
])
def test_jobs(box: Box, cpus, mem, jobs, args, row) -> None:
    box.probe.update(cpus=cpus, mem_free_gib=mem)
    box.env(APEX_JOBS=jobs)  # "" is unset; a number also takes the risk of too little memory
    dry = box.run("--dry-run", *args)
    assert dry.rc == 0 and dry.plan["jobs"].startswith(row), dry.plan["jobs"]


def test_the_estimate_is_the_docs_and_doubles_with_two_architectures() -> None:
    one, two, none = (preflight.estimate(archs, 2, 2, False) for archs in ("9.0", "8.0;9.0", ""))
    assert [re.findall(r"about (\d+) min", t) for t in (one, two)] == [["4", "13"], ["9", "25"]]
    section = (REPO / "docs" / "setup.md").read_text().split("## Building Apex")[1]
    assert "about 4 min" in section and "about 13 min" in section  # 538, 1520 CPU-s over 2 jobs
    assert none.startswith("about 4 min on 2 CPUs") and "no GPU is seen here" in none


def test_a_build_clones_installs_verifies_marks_and_then_is_current(box: Box) -> None:
    built = box.run("--course-only")
    assert built.rc == 0, built.err
    src, calls = box.work / "src" / "apex", box.calls()
    assert calls[:2] == [f"git clone --quiet --no-checkout --filter=blob:none "
                         f"https://github.com/NVIDIA/apex {src}",
                         f"git -C {src} checkout --quiet {apexbuild.PINNED_REF}"]
    assert calls[2].startswith("python -m pip uninstall -y apex | PYTHONPATH=/elsewhere "
                               "CUDA_HOME= APEX_CPP_EXT= ARCH= JOBS=x")
    assert calls[3].startswith("python -m pip install -v --no-build-isolation --no-deps . | "
                               "PYTHONPATH=/elsewhere CUDA_HOME=/cuda APEX_CPP_EXT=1 ARCH=9.0 "
                               f"JOBS=3x5 PATH=/cuda/bin PWD={src}"), calls[3]
    assert calls[4].startswith(f"python -m helpers.apexcheck --verify --legacy-dir "
                               f"{box.work}/legacy-amp | PYTHONPATH={REPO}:/elsewhere")
    trimmed = (src / "setup.py").read_text()
    assert "e.name in ['amp_C', 'apex_C', 'fused_layer_norm_cuda']" in trimmed
    marker = json.loads((box.work / "installed.json").read_text())
    assert marker["commit"] == apexbuild.PINNED_REF and marker["extensions"] == "course-only"
    assert marker["verified_extensions"][-1] == "FusedLayerNorm" and marker["arch_list"] == "9.0"
    assert (box.work / "build.log").read_text().splitlines()[-1] == "pip line 40"
    (box.root / "calls").write_text("")
    again = box.run("--course-only")
    assert again.rc == 0 and "is already built for torch 2.11.0+cu130 and verified" in again.out
    assert [c.split(" |")[0] for c in box.calls()] == [calls[4].split(" |")[0]]
    assert box.run().rc == 0 and "git clone" in box.calls()[-5]  # the full set: built again


def test_a_failed_build_or_check_is_one_sentence_and_a_warning_is_passed_on(box: Box) -> None:
    box.env(FAKE_PIP_RC="1")
    bad = box.run()
    assert bad.rc == 4 and bad.err.splitlines()[:30] == [f"pip line {i}" for i in range(11, 41)]
    assert re.fullmatch(r"pip install of Apex failed \(exit 1\) after \d+s; its last 30 lines are "
                        rf"above, the full log is {box.work}/build\.log\.", error_of(bad))
    box.env(FAKE_PIP_RC="0", FAKE_VERIFY_RC="1", FAKE_VERIFY="FAIL import amp_C\nverified=apex_C"
            "\nerror=Python-only Apex: amp_C missing")
    bad = box.run()
    assert bad.rc == 5 and "  FAIL import amp_C" in bad.out
    assert error_of(bad).startswith("the installed Apex failed its check (Python-only Apex: "
                                    "amp_C missing), so the notebooks cannot use its fused")
    assert not (box.work / "installed.json").exists()
    box.env(FAKE_VERIFY="Traceback (most recent call last):")  # no sentence: its exit status
    assert "helpers.apexcheck --verify exited with 1" in error_of(box.run())
    box.env(FAKE_VERIFY_RC="0", FAKE_VERIFY="ok   import amp_C\nwarning=no GPU visible: kernels "
            "not exercised\nverified=amp_C")
    done = box.run()
    assert (done.rc, done.err) == (0, "build_apex.sh: warning: no GPU visible: kernels not "
                                      "exercised\n")


def test_a_local_folder_is_copied_and_the_course_only_trim_can_fail(box: Box) -> None:
    src = _folder(box)
    (src / "build").mkdir()
    os.chmod(src / "apex", 0o555)  # a read-only source: its copy is writable
    built = box.run()
    assert built.rc == 0, built.err
    copy = box.work / "src" / "apex"
    assert sorted(os.listdir(copy)) == ["apex", "setup.py"] and os.access(copy / "apex", os.W_OK)
    assert sorted(os.listdir(src)) == ["apex", "build", "setup.py"]  # untouched
    assert json.loads((box.work / "installed.json").read_text())["commit_verified"] is False
    (src / "setup.py").write_text("print('no extension list')\n")
    trimmed = box.run("--course-only", "--force")
    assert trimmed.rc == 4 and "cannot be trimmed; build without --course-only" in error_of(trimmed)


def test_the_legacy_install_without_nvcc(box: Box) -> None:
    box.probe.update(nvcc="", nvcc_release="", torch_cuda="12.6")
    done = box.run("--legacy-only")
    assert done.rc == 0, done.err
    legacy, stub = box.work / "legacy-amp", box.work / "stub-cuda" / "bin" / "nvcc"
    assert done.out.endswith(f"legacy apex.amp ready: PYTHONPATH={legacy} {box.python} -c "
                             "'from apex import amp'\n")
    said = subprocess.run([stub], capture_output=True, text=True).stdout
    assert said == "Cuda compilation tools, release 12.6, V12.6.0\n"
    assert any(c.startswith(f"python -m pip install --no-deps --no-build-isolation --target "
                            f"{legacy} . | PYTHONPATH=/elsewhere CUDA_HOME={stub.parent.parent}")
               for c in box.calls())
    assert json.loads((box.work / "legacy-installed.json").read_text())["path"] == str(legacy)
    assert "is already installed" in box.run("--legacy-only").out
    (legacy / "apex" / "amp.py").unlink()  # the marker matches, the folder does not work
    assert box.run("--legacy-only").rc == 0 and (legacy / "apex" / "amp.py").exists()


def test_the_real_probe(tmp_path: Path, monkeypatch) -> None:
    """In this python; nvcc by the course's lookup; an apex pip does not manage, then PyPI's."""
    _write(tmp_path / "cuda" / "bin" / "nvcc", "#!/bin/sh\necho 'Cuda compilation tools, "
           "release 12.8, V12.8.1'\n")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    _write(tmp_path / "site" / "apex" / "__init__.py", "")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    p = preflight.probe(SimpleNamespace(workdir=str(tmp_path / "no" / "such" / "folder")))
    assert p["torch_version"] == sys.modules["torch"].__version__ and p["pip_version"]
    assert p["cpus"] >= 1 and p["disk_free_gib"] > 0 and (p["mem_free_gib"] or 1) > 0
    assert (p["nvcc"], p["nvcc_release"]) == (str(tmp_path / "cuda" / "bin" / "nvcc"), "12.8")
    assert p["apex_where"] == str(tmp_path / "site" / "apex") and p["apex_pip"] is False
    info = tmp_path / "site" / "apex-0.9.10.dist-info"
    _write(info / "METADATA", "Metadata-Version: 2.1\nName: apex\nVersion: 0.9.10\n")
    _write(info / "top_level.txt", "apex\n")
    p = preflight.probe(SimpleNamespace(workdir=str(tmp_path)))
    assert p["apex_pip"] is True and p["apex_wrong"] == "apex 0.9.10 from PyPI"
    assert p["apex_missing"] == "amp_C, apex_C, fused_layer_norm_cuda"


def test_the_script(tmp_path: Path) -> None:
    """./build_apex.sh runs the build in the python it builds for; without one, one sentence."""
    env = dict(os.environ, PYTHON=sys.executable, APEX_WORKDIR=str(tmp_path))
    helped = subprocess.run([REPO / "build_apex.sh", "--help"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: build_apex.sh")
    env["PYTHON"] = str(tmp_path / "nothing")
    none = subprocess.run([REPO / "build_apex.sh", "--dry-run"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert none.returncode == 3 and none.stdout == "" and none.stderr.count("\n") == 1
    assert none.stderr.startswith(f"build_apex.sh: error: no Python 3.11 or newer at "
                                  f"'{tmp_path}/nothing'") and "set PYTHON=" in none.stderr
