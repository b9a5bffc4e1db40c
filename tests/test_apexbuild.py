"""helpers.environment's build side (notebook 01): the nvcc lookup (the one build_apex.sh's
probe calls), the readiness table, and running the script with its output streamed."""

from __future__ import annotations

import json
import re
import stat
import sys
from pathlib import Path

from coursetools import apexbuild
from helpers import environment

ROOT = Path(__file__).resolve().parents[1]


def fake_nvcc(folder: Path, release: str) -> Path:
    """An executable ``folder/bin/nvcc`` that reports ``release``."""
    path = folder / "bin" / "nvcc"
    path.parent.mkdir(parents=True)
    path.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_nvcc_lookup_order(tmp_path, monkeypatch):
    cuda = fake_nvcc(tmp_path / "cuda", "12.8")
    conda = fake_nvcc(tmp_path / "conda", "13.0")
    on_path = fake_nvcc(tmp_path / "path", "12.6")
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("CONDA_PREFIX", str(tmp_path / "conda"))
    assert environment.find_nvcc() == cuda
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nothing-here"))
    assert environment.find_nvcc() == conda
    monkeypatch.delenv("CONDA_PREFIX")
    assert environment.find_nvcc() == on_path
    assert environment.nvcc_release(on_path) == "12.6"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert environment.find_nvcc() is None
    assert environment.nvcc_release(None) is None


def test_nvcc_toolkit_is_where_the_headers_are(tmp_path):
    """CUDA_HOME for an nvcc: above its bin, or the toolkit a symlink or wrapper script leads to."""
    real = tmp_path / "cuda-13.0"
    (real / "include").mkdir(parents=True)
    (real / "include" / "cuda_runtime.h").write_text("")
    # a real nvcc prints its _HERE_ in a dry run
    fake_nvcc(real, "13.0").write_text(f"#!/bin/sh\necho '#$ _HERE_={real / 'bin'}' >&2\n")
    assert environment.nvcc_toolkit(real / "bin" / "nvcc") == real
    (tmp_path / "link" / "bin").mkdir(parents=True)
    (tmp_path / "link" / "bin" / "nvcc").symlink_to(real / "bin" / "nvcc")
    assert environment.nvcc_toolkit(tmp_path / "link" / "bin" / "nvcc") == real
    wrapper = fake_nvcc(tmp_path / "local", "13.0")  # a /usr/local/bin/nvcc that execs the real one
    wrapper.write_text(f'#!/bin/sh\nexec {real / "bin" / "nvcc"} "$@"\n')
    assert environment.nvcc_toolkit(wrapper) == real
    bare = fake_nvcc(tmp_path / "bare", "13.0")  # no headers anywhere: torch's rule
    assert environment.nvcc_toolkit(bare) == tmp_path / "bare"
    assert environment.nvcc_toolkit(None) is None


def test_toolchain_compares_nvcc_with_torch(tmp_path, monkeypatch):
    fake_nvcc(tmp_path / "cuda", "13.0")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setattr(environment.torch.version, "cuda", "13.0")
    assert environment.toolchain()["nvcc_matches_torch"] is True
    monkeypatch.setattr(environment.torch.version, "cuda", "12.8")
    info = environment.toolchain()
    assert info["nvcc_release"] == "13.0" and info["nvcc_matches_torch"] is False
    monkeypatch.setattr(environment.torch.version, "cuda", None)
    assert environment.toolchain()["nvcc_matches_torch"] is False


def test_run_build_script_streams_its_output_and_returns_the_exit_status(tmp_path):
    assert environment.build_script() == ROOT / "build_apex.sh"  # tests/test_build_apex.py runs it
    script, lines = tmp_path / "build_apex.sh", []
    script.write_text('echo "python is $PYTHON"\necho "args: $*"\necho "oops" >&2\nexit 3\n')
    assert environment.run_build_script(["--dry-run"], script=script, echo=lines.append) == 3
    assert lines == [f"python is {sys.executable}", "args: --dry-run", "oops"]
    script.write_text("echo start\nsleep 30\necho never\n")
    lines.clear()
    assert environment.run_build_script(script=script, timeout=0.5, echo=lines.append) == 124
    assert lines[0] == "start" and "never" not in lines and "stopped after" in lines[-1]
    lines.clear()
    assert environment.run_build_script(script=tmp_path / "nope.sh", echo=lines.append) == 127
    assert "missing" in lines[0]


def test_notebook_01_option_table_shows_the_script_defaults():
    nb = json.loads((ROOT / "notebooks" / "01_environment_and_apex_build.ipynb").read_text())
    text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    for variable, default in (("APEX_REF", apexbuild.PINNED_REF),
                              ("APEX_LEGACY_REF", apexbuild.LEGACY_PINNED_REF)):
        rows = re.findall(rf"^\| `{variable}` \|.*\|$", text, re.M)
        assert len(rows) == 1, f"notebook 01 has {len(rows)} option-table rows for {variable}"
        shown = re.findall(r"\b[0-9a-f]{40}\b", rows[0])
        assert shown == [default], (variable, rows[0])


def test_exit_codes_and_readiness_table():
    assert "preflight" in environment.explain_exit(3)
    assert environment.explain_exit(42).startswith("exit 42")
    tools = {"torch_cuda": "13.0", "nvcc": "/usr/bin/nvcc", "nvcc_release": "12.8",
             "nvcc_matches_torch": False, "ninja": True, "gpu": True}
    env = {"gpu_name": "NVIDIA H200", "gpu_capability": "9.0", "bf16_supported": True,
           "driver": "580.1"}
    table = environment.readiness_table(env, tools)
    assert list(table.columns) == ["check", "here", "why_it_matters"]
    here = dict(zip(table["check"], table["here"], strict=True))
    assert here["nvcc (toolkit)"] == "CUDA 12.8 at /usr/bin/nvcc"
    # a machine with nothing: every row still says something, and bf16 is a plain bool
    bare = environment.readiness_table(
        {}, dict(tools, torch_cuda=None, nvcc=None, nvcc_release=None, gpu=False))
    here = dict(zip(bare["check"], bare["here"], strict=True))
    assert (here["torch's CUDA"], here["GPU"], here["nvcc (toolkit)"]) == (
        "none (CPU build of torch)", "none visible to torch", "not found")
    assert here["compute capability"] == here["driver"] == "-" and here["bf16 native"] is False
