"""helpers.apexcheck on a CPU: simulated installs, right and wrong fake kernels, ``--verify``."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as ns

import pytest
import torch
import torch.nn.functional as F

from helpers import apexcheck
from helpers.apexcheck import AVAILABLE, COLUMNS, NO_GPU, NOT_INSTALLED, PYTHON_ONLY

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


class FakeLayerNorm(torch.nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.eps, self.weight = eps, torch.nn.Parameter(torch.ones(hidden))
        self.bias = torch.nn.Parameter(torch.zeros(hidden))

    def forward(self, x):
        out = F.layer_norm(x.float(), x.shape[-1:], self.weight.float(), self.bias.float(),
                           self.eps)
        return out.to(self.weight.dtype)


class FakeRMSNorm(FakeLayerNorm):
    def forward(self, x):
        out = F.rms_norm(x.float(), x.shape[-1:], self.weight.float(), self.eps)
        return out.to(self.weight.dtype)


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
                   MixedFusedLayerNorm=FakeLayerNorm, MixedFusedRMSNorm=FakeRMSNorm)
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


def python_only() -> dict:
    return full_install(**{n: missing(n) for n in ("amp_C", "apex_C", "fused_layer_norm_cuda")})


def detect(modules: dict, *, legacy: bool = False, wrong: str | None = None, **kwargs):
    return apexcheck.detect(importer=make_importer(modules), device="cpu",
                            legacy_check=lambda: legacy, wrong_apex=lambda: wrong, **kwargs)


def verdicts(table) -> dict:
    return dict(zip(table["feature"], table["status"], strict=True))


def apex_rows(table):
    return table[table["feature"].isin(APEX_FEATURES)]


# ------------------------------------------------------------------------------ scenarios
@pytest.mark.parametrize(("modules", "status", "imported", "extension", "summary"), [
    ({}, NOT_INSTALLED, None, None, "Apex is not installed"),
    (python_only(), PYTHON_ONLY, True, False, "Apex: 6 PYTHON-ONLY"),
    (full_install(), NO_GPU, True, True, "Apex: 6 with kernels that import but were not run"),
])
def test_install_states_without_a_gpu(modules, status, imported, extension, summary):
    table = detect(modules)
    assert apexcheck.summary(table).startswith(summary)
    assert list(table.columns) == COLUMNS
    assert list(table["feature"]) == APEX_FEATURES + [apexcheck.LEGACY_FEATURE]
    assert verdicts(table)[apexcheck.LEGACY_FEATURE] == NOT_INSTALLED  # legacy=True: AVAILABLE
    rows = apex_rows(table)
    assert (rows["status"] == status).all() and rows["gpu_smoke_run"].isna().all()
    for column, want in (("python_import", imported), ("cuda_extension", extension)):
        assert rows[column].isna().all() if want is None else (rows[column] == want).all()
    warning = apexcheck.python_only_warning(table)
    assert warning is None if status != PYTHON_ONLY else "amp_C, fused_layer_norm_cuda" in warning


def test_python_only_for_one_extension_names_only_it():
    table = detect(full_install(fused_layer_norm_cuda=missing("fused_layer_norm_cuda")))
    got = verdicts(table)
    assert got["FusedAdam"] == NO_GPU and got["multi_tensor_applier"] == NO_GPU
    assert got["FusedLayerNorm"] == PYTHON_ONLY and got["MixedFusedRMSNorm"] == PYTHON_ONLY
    warning = apexcheck.python_only_warning(table)
    assert "fused_layer_norm_cuda" in warning and "amp_C" not in warning and "nvcc" in warning
    assert "PYTHON-ONLY" in warning and "./build_apex.sh --force" in warning


class ApexRoundingLayerNorm(FakeLayerNorm):  # x_hat, w*x_hat and + b each rounded to bf16
    def forward(self, x, eps=None):
        x_hat = F.layer_norm(x.float(), x.shape[-1:], None, None, eps or self.eps)
        return self.weight * x_hat.to(self.weight.dtype) + self.bias


WrongEpsLayerNorm = type("WrongEpsLayerNorm", (ApexRoundingLayerNorm,), {
    "forward": lambda self, x: ApexRoundingLayerNorm.forward(self, x, eps=1.0)})


def test_correct_kernels_pass_the_smoke_runs():
    # Apex's half-precision rounding (off by 1.1e-2 on the H200 where w*x_hat and b cancel).
    modules = full_install(**norms(MixedFusedLayerNorm=ApexRoundingLayerNorm))
    table = detect(modules, run_smoke=True, legacy=True)
    assert set(verdicts(table).values()) == {AVAILABLE}, verdicts(table)
    assert apex_rows(table)["gpu_smoke_run"].all()
    assert apexcheck.summary(table) == ("Apex: 6 of 6 features available (ran and matched "
                                        "torch); legacy apex.amp available.")


WRONG_ADAM = {"apex.optimizers": ns(
    FusedAdam=lambda params, lr, **kw: torch.optim.AdamW(params, lr=lr * 1.05, **kw))}


NoBiasLayerNorm = type("NoBiasLayerNorm", (FakeLayerNorm,), {"forward": lambda self, x: (
    F.layer_norm(x.float(), x.shape[-1:], self.weight.float(), None, self.eps))})
NaNLayerNorm = type("NaNLayerNorm", (FakeLayerNorm,), {"forward": lambda self, x: (
    FakeLayerNorm.forward(self, x).index_fill(0, torch.tensor([3]), float("nan")))})
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
    got = verdicts(table)
    assert got[feature] == "broken: RuntimeError: CUDA error: no kernel image" if not expected \
        else got[feature].startswith("broken: wrong result: ") and expected in got[feature]
    assert table.loc[table["feature"] == feature, "gpu_smoke_run"].item() is False
    assert all(got[f] == AVAILABLE for f in APEX_FEATURES if f != feature), got
    assert f"5 of 6 features available (ran and matched torch); 1 broken ({feature})" in \
        apexcheck.summary(table)


@pytest.mark.parametrize("exc", [
    ImportError("/site-packages/amp_C.cpython-312-x86_64-linux-gnu.so: undefined symbol: "
                "_ZN3c104cuda20CUDACachingAllocator9allocatorE" + "x" * 100),
    missing("torch._C._cuda_missing"),
])
def test_an_extension_that_fails_to_import_is_broken_not_python_only(exc):
    table = detect(full_install(amp_C=exc))
    verdict = verdicts(table)["FusedAdam"]
    assert verdict.startswith(f"broken: {type(exc).__name__}: ")
    assert str(exc)[:40] in verdict and len(verdict) <= len("broken: ") + 140
    assert table.loc[table["feature"] == "FusedAdam", "cuda_extension"].item() is False
    assert apexcheck.python_only_warning(table) is None


PYPI = "apex 0.9.10.dev0 from PyPI"


@pytest.mark.parametrize(("modules", "wrong", "start", "needle"), [
    ({"apex": ns()}, None, "broken: ModuleNotFoundError", "PyPI"),
    ({"apex": missing("pyramid_mailer")}, PYPI, apexcheck.wrong_apex_verdict(PYPI),
     "pip uninstall apex"),
    ({"apex": OSError("libc10_cuda.so: cannot open shared object file")}, None,
     "broken: OSError: libc10_cuda.so", "libc10"),
])
def test_a_wrong_or_crashing_apex_breaks_every_row(modules, wrong, start, needle):
    table = detect(modules, wrong=wrong)
    rows = apex_rows(table)
    assert rows["status"].str.startswith(start).all() and needle in rows["status"].iloc[0]
    assert "pyramid_mailer" not in rows["status"].iloc[0]
    assert apexcheck.python_only_warning(table) is None
    assert ("6 broken" in apexcheck.summary(table)) == (wrong is None)


@pytest.mark.skipif(not (PINNED_SRC / "apex" / "__init__.py").exists(),
                    reason="the pinned Apex source is not in this checkout")
def test_real_apex_source_without_extensions_is_python_only():
    code = ("from helpers import apexcheck; t = apexcheck.detect(device='cpu', "
            "legacy_check=lambda: False); print('|'.join(t['status']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": f"{ROOT}:{PINNED_SRC}", "PATH": ""},
                         timeout=300, check=True)
    assert out.stdout.strip().split("|") == [PYTHON_ONLY] * len(APEX_FEATURES) + [NOT_INSTALLED]


# ------------------------------------------------------------- build_apex.sh's verification
EXTENSIONS, LEGACY = "amp_C,apex_C,fused_layer_norm_cuda", "/nonexistent/legacy-amp"


@pytest.mark.parametrize(("modules", "run", "verified", "error"), [
    (full_install(), True, EXTENSIONS + ",FusedAdam,FusedLayerNorm", None),
    (full_install(apex=ns(__file__=LEGACY + "2/apex/__init__.py")), False, EXTENSIONS, None),
    (python_only(), False, "", "Python-only Apex: amp_C, apex_C, fused_layer_norm_cuda missing"),
    (full_install(**WRONG_ADAM), True,
     EXTENSIONS + ",FusedLayerNorm", "FusedAdam on the GPU (wrong result"),
    (full_install(amp_C=ImportError("amp_C.so: undefined symbol: _Z")), False,
     "apex_C,fused_layer_norm_cuda", "amp_C fails to import (ImportError"),
    (full_install(apex=ns(__file__=LEGACY + "/apex/__init__.py")), True, EXTENSIONS,
     "import apex (ImportError: apex is imported from the legacy folder"),
    ({}, True, "", f"Apex is not installed for {sys.executable} (no module named 'apex')"),
])
def test_verify_as_build_apex_runs_it(modules, run, verified, error):
    lines: list[str] = []
    rc = apexcheck.verify(LEGACY, importer=make_importer(modules), device="cpu",
                          echo=lines.append, run_kernels=run)
    keyed = dict(ln.split("=", 1) for ln in lines if ln.split("=", 1)[0] in
                 ("verified", "error", "warning"))
    assert rc == (1 if error else 0) and keyed["verified"] == verified, lines
    assert keyed.get("error", "").startswith(error or "") and ("error" in keyed) == bool(error)
    assert keyed.get("warning") == (None if run else apexcheck.NO_GPU_WARNING)
    assert any(ln.startswith("FAIL") for ln in lines) == bool(error)
