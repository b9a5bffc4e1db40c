"""helpers.apexcheck on a CPU: simulated installs, right and wrong fake kernels, ``--verify``."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as ns

import pytest
import torch
import torch.nn.functional as F

from helpers import apexcheck
from helpers.apexcheck import COLUMNS, NO_GPU, NOT_INSTALLED, PYTHON_ONLY

APEX_FEATURES = [f.name for f in apexcheck.FEATURES]
ROOT = Path(__file__).resolve().parent.parent
PINNED_SRC = ROOT / ".apex_src" / "pinned" / "apex"


def missing(name: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(f"No module named '{name}'", name=name)


def make_importer(modules: dict):
    def importer(name: str):
        value = modules.get(name, missing(name))
        if isinstance(value, BaseException):
            raise value
        return value
    return importer


class FakeLayerNorm(torch.nn.LayerNorm):  # right: in float32, out in the parameters' dtype
    def forward(self, x):
        y = F.layer_norm(x.float(), x.shape[-1:], self.weight.float(), self.bias.float(), self.eps)
        return y.to(self.weight.dtype)


FakeRMSNorm = type("FakeRMSNorm", (FakeLayerNorm,), {"forward": lambda self, x: F.rms_norm(
    x.float(), x.shape[-1:], self.weight.float(), self.eps).to(self.weight.dtype)})


class ApexRoundingLayerNorm(FakeLayerNorm):  # x_hat, w*x_hat and + b each rounded to bf16
    def forward(self, x, eps=None):
        x_hat = F.layer_norm(x.float(), x.shape[-1:], None, None, eps or self.eps)
        return self.weight * x_hat.to(self.weight.dtype) + self.bias


def fake_scale(chunk, flag, tensor_lists, scale):
    for src, dst in zip(*tensor_lists, strict=True):
        dst.copy_(src * scale)
        if not torch.isfinite(src).all():
            flag.fill_(1)


def fake_l2norm(chunk, flag, tensor_lists, per_tensor):
    total = torch.linalg.vector_norm(torch.cat([t.flatten() for t in tensor_lists[0]]))
    return total.reshape(1), torch.empty(0)


def norms(**classes) -> dict:
    default = dict(FusedLayerNorm=FakeLayerNorm, FusedRMSNorm=FakeRMSNorm,
                   MixedFusedLayerNorm=ApexRoundingLayerNorm, MixedFusedRMSNorm=FakeRMSNorm)
    return {"apex.normalization": ns(**(default | classes))}


def full_install(**overrides) -> dict:
    """Fake modules of a full Apex install (every kernel right), with ``overrides``."""
    return {
        "apex": ns(),
        "apex.optimizers": ns(FusedAdam=torch.optim.AdamW),
        **norms(),
        "apex.multi_tensor_apply": ns(multi_tensor_applier=lambda op, *args: op(65536, *args)),
        "amp_C": ns(multi_tensor_scale=fake_scale, multi_tensor_l2norm=fake_l2norm),
        "apex_C": ns(),
        "fused_layer_norm_cuda": ns(),
    } | overrides


EXTENSIONS = ("amp_C", "apex_C", "fused_layer_norm_cuda")
NO_KERNELS = full_install(**{name: missing(name) for name in EXTENSIONS})


def detect(modules: dict, *, legacy: bool = False, wrong: str | None = None, **kwargs):
    """The table, whose last row is the legacy apex.amp's (``table[:-1]``: Apex's features)."""
    return apexcheck.detect(importer=make_importer(modules), device="cpu",
                            legacy_check=lambda: legacy, wrong_apex=lambda: wrong, **kwargs)


@pytest.mark.parametrize(("modules", "row", "summary"), [  # row: import, extension, run, status
    ({}, (None, None, None, NOT_INSTALLED), "Apex is not installed"),
    (NO_KERNELS, (True, False, None, PYTHON_ONLY), "Apex: 6 PYTHON-ONLY"),
    (full_install(), (True, True, None, NO_GPU),
     "Apex: 6 with kernels that import but were not run"),
])
def test_install_states_without_a_gpu(modules, row, summary):
    table = detect(modules)
    assert list(table.columns) == COLUMNS and apexcheck.summary(table).startswith(summary)
    assert list(table["feature"]) == APEX_FEATURES + [apexcheck.LEGACY_FEATURE]
    assert set(table[:-1][COLUMNS[1:]].itertuples(index=False, name=None)) == {row}
    assert table["status"].iloc[-1] == NOT_INSTALLED  # legacy=True: AVAILABLE
    warning = apexcheck.python_only_warning(table)
    assert warning is None if row[-1] != PYTHON_ONLY else "amp_C, fused_layer_norm_cuda" in warning


def test_python_only_for_one_extension_names_only_it():
    table = detect(full_install(fused_layer_norm_cuda=missing("fused_layer_norm_cuda")))
    assert list(table["status"][:-1]) == [NO_GPU] + [PYTHON_ONLY] * 4 + [NO_GPU]
    warning = apexcheck.python_only_warning(table)
    assert "fused_layer_norm_cuda" in warning and "amp_C" not in warning and "nvcc" in warning
    assert "PYTHON-ONLY" in warning and "./build_apex.sh --force" in warning


def test_correct_kernels_pass_the_smoke_runs():  # Apex's rounding too: 1.1e-2 off on the H200
    table = detect(full_install(), run_smoke=True, legacy=True)
    assert table["gpu_smoke_run"][:-1].all(), table
    assert apexcheck.summary(table) == ("Apex: 6 of 6 features available (ran and matched "
                                        "torch); legacy apex.amp available.")


WRONG_ADAM = {"apex.optimizers": ns(
    FusedAdam=lambda params, lr, **kw: torch.optim.AdamW(params, lr=lr * 1.05, **kw))}
NoBiasLayerNorm = type("NoBiasLayerNorm", (FakeLayerNorm,), {"forward": lambda self, x: (
    F.layer_norm(x.float(), x.shape[-1:], self.weight.float(), None, self.eps))})
NaNLayerNorm = type("NaNLayerNorm", (FakeLayerNorm,), {"forward": lambda self, x: (
    FakeLayerNorm.forward(self, x).index_fill(0, torch.tensor([3]), float("nan")))})
WrongEpsLayerNorm = type("WrongEpsLayerNorm", (ApexRoundingLayerNorm,), {
    "forward": lambda self, x: ApexRoundingLayerNorm.forward(self, x, eps=1.0)})
InputDtypeRMSNorm = type("InputDtypeRMSNorm", (FakeRMSNorm,), {"forward": lambda self, x: (
    FakeRMSNorm.forward(self, x).to(x.dtype))})  # float32 where a Mixed norm returns bf16


def crash(*args, **kwargs):
    raise RuntimeError("CUDA error: no kernel image\nCompile with `TORCH_USE_CUDA_DSA`")


@pytest.mark.parametrize(("feature", "override", "expected"), [
    ("FusedAdam", WRONG_ADAM, "FusedAdam parameter"),
    ("FusedLayerNorm", norms(FusedLayerNorm=NoBiasLayerNorm), "NoBiasLayerNorm forward differs"),
    ("FusedLayerNorm", norms(FusedLayerNorm=NaNLayerNorm), "NaNLayerNorm forward differs"),
    ("MixedFusedLayerNorm", norms(MixedFusedLayerNorm=WrongEpsLayerNorm), "forward differs"),
    ("MixedFusedRMSNorm", norms(MixedFusedRMSNorm=InputDtypeRMSNorm),
     "InputDtypeRMSNorm returned torch.float32, expected torch.bfloat16"),
    ("multi_tensor_applier", {"amp_C": ns(multi_tensor_scale=lambda c, f, lists, s: [
        d.copy_(x * s) for x, d in zip(*lists, strict=True)], multi_tensor_l2norm=fake_l2norm)},
     "did not flag an inf"),
    ("multi_tensor_applier", {"amp_C": ns(
        multi_tensor_scale=fake_scale, multi_tensor_l2norm=lambda c, f, lists, p: (
            torch.linalg.vector_norm(lists[0][0]).reshape(1), torch.empty(0)))},
     "multi_tensor_l2norm differs"),
    ("multi_tensor_applier", {"apex.multi_tensor_apply": ns(multi_tensor_applier=crash)}, None),
])
def test_wrong_answers_and_crashes_are_broken_in_one_line(feature, override, expected):
    table = detect(full_install(**override), run_smoke=True)
    row = table.set_index("feature").loc[feature]
    assert row["status"] == "broken: RuntimeError: CUDA error: no kernel image" if not expected \
        else row["status"].startswith("broken: wrong result: ") and expected in row["status"]
    assert row["gpu_smoke_run"] is False
    assert apexcheck.summary(table) == ("Apex: 5 of 6 features available (ran and matched torch)"
                                        f"; 1 broken ({feature}); legacy apex.amp not installed.")


@pytest.mark.parametrize("exc", [
    ImportError("/site-packages/amp_C.cpython-312-x86_64-linux-gnu.so: undefined symbol: "
                "_ZN3c104cuda20CUDACachingAllocator9allocatorE" + "x" * 100),
    missing("torch._C._cuda_missing"),
])
def test_an_extension_that_fails_to_import_is_broken_not_python_only(exc):
    table = detect(full_install(amp_C=exc))
    adam = table.set_index("feature").loc["FusedAdam"]
    assert adam["status"].startswith(f"broken: {type(exc).__name__}: ")
    assert str(exc)[:40] in adam["status"] and len(adam["status"]) <= len("broken: ") + 140
    assert adam["cuda_extension"] is False
    assert apexcheck.python_only_warning(table) is None


@pytest.mark.parametrize(("modules", "wrong", "start", "needle"), [
    ({"apex": ns()}, None, "broken: ModuleNotFoundError", "PyPI"),
    ({"apex": missing("pyramid_mailer")}, "apex 0.9.10.dev0 from PyPI",
     apexcheck.wrong_apex_verdict("apex 0.9.10.dev0 from PyPI"), "pip uninstall apex"),
    ({"apex": OSError("libc10_cuda.so: cannot open shared object file")}, None,
     "broken: OSError: libc10_cuda.so", "libc10"),
])
def test_a_wrong_or_crashing_apex_breaks_every_row(modules, wrong, start, needle):
    table = detect(modules, wrong=wrong)
    status = table["status"][:-1]
    assert status.str.startswith(start).all() and needle in status[0]
    assert "pyramid_mailer" not in status[0] and apexcheck.python_only_warning(table) is None
    assert ("6 broken" in apexcheck.summary(table)) == (wrong is None)


@pytest.mark.skipif(not (PINNED_SRC / "apex" / "__init__.py").exists(),
                    reason="the pinned Apex source is not in this checkout")
def test_real_apex_source_without_extensions_is_python_only():
    code = ("from helpers import apexcheck; t = apexcheck.detect(device='cpu', "
            "legacy_check=lambda: False); print('|'.join(t['status']))")
    out = subprocess.check_output([sys.executable, "-c", code], text=True, cwd=ROOT, timeout=300,
                                  env={"PYTHONPATH": f"{ROOT}:{PINNED_SRC}", "PATH": ""})
    assert out.strip().split("|") == [PYTHON_ONLY] * len(APEX_FEATURES) + [NOT_INSTALLED]


ALL, LEGACY = ",".join(EXTENSIONS), "/nonexistent/legacy-amp"  # build_apex.sh's verification


@pytest.mark.parametrize(("modules", "run", "verified", "error"), [
    (full_install(), True, ALL + ",FusedAdam,FusedLayerNorm", None),
    (full_install(apex=ns(__file__=LEGACY + "2/apex/__init__.py")), False, ALL, None),
    (NO_KERNELS, False, "", "Python-only Apex: amp_C, apex_C, fused_layer_norm_cuda missing"),
    (full_install(**WRONG_ADAM), True, ALL + ",FusedLayerNorm",
     "FusedAdam on the GPU (wrong result"),
    (full_install(amp_C=ImportError("amp_C.so: undefined symbol: _Z")), False,
     "apex_C,fused_layer_norm_cuda", "amp_C fails to import (ImportError"),
    (full_install(apex=ns(__file__=LEGACY + "/apex/__init__.py")), True, ALL,
     "import apex (ImportError: apex is imported from the legacy folder"),
    ({}, True, "", f"Apex is not installed for {sys.executable} (no module named 'apex')"),
])
def test_verify_as_build_apex_runs_it(modules, run, verified, error):
    lines: list[str] = []
    rc = apexcheck.verify(LEGACY, importer=make_importer(modules), device="cpu",
                          echo=lines.append, run_kernels=run)
    said = dict(s.split("=", 1) for s in lines if s.startswith(("verified=", "error=", "warning=")))
    assert rc == (1 if error else 0) and said["verified"] == verified, lines
    assert said.get("error", "").startswith(error or "") and ("error" in said) == bool(error)
    assert said.get("warning") == (None if run else apexcheck.NO_GPU_WARNING)
    assert any(ln.startswith("FAIL") for ln in lines) == bool(error)
