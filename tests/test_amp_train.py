"""Tests for notebook 04's helpers (amp_train, amp_checks, amp_migration, legacy_amp_run).

Everything here runs on the CPU at smoke sizes. The legacy apex.amp itself needs a CUDA GPU;
what can be checked without one is checked: the child process's argument parsing, its JSON,
its one-line failures, and (when a legacy Apex source is at hand) its import and reset.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import amp_checks, amp_migration, amp_train, gpu, legacy_amp_run
from helpers.amp_train import RunResult, TrainConfig

REPO = Path(__file__).resolve().parents[1]
CFG = TrainConfig.smoke()
REQUIRED_COLUMNS = {"run", "api", "opt_level_or_recipe", "step_ms", "final_loss", "param_dtype",
                    "activation_dtype", "peak_mem_mib", "loss_scale_final", "finite"}


@pytest.fixture(scope="module")
def batches():
    return amp_train.make_batches(CFG, "cpu")


@pytest.fixture(scope="module")
def runs(batches):
    return {name: amp_train.run_recipe(name, CFG, batches) for name in amp_train.RECIPES}


def test_config_round_trips_through_json():
    assert TrainConfig.from_json(CFG.to_json()) == CFG


def test_data_and_model_are_seeded(batches):
    again = amp_train.make_batches(CFG, "cpu")
    for (x1, y1), (x2, y2) in zip(batches, again, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert len(batches) == CFG.pool and int(batches[0][1].max()) < CFG.classes
    a, b = amp_train.make_model(CFG), amp_train.make_model(CFG)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_every_recipe_trains_and_stays_near_fp32(runs):
    base = runs["fp32"]
    for name, r in runs.items():
        assert r.ok, r.error
        assert len(r.losses) == CFG.steps and len(r.step_ms) == CFG.steps
        assert r.finite and r.decreasing, (name, r.losses)
        assert abs(r.final_loss - base.final_loss) / base.final_loss < 0.05, name


def test_recipes_report_their_dtypes_and_scales(runs):
    expect = {  # recipe: (param, master, activation, has a loss scale)
        "fp32": ("float32", "float32", "float32", False),
        "autocast_fp16": ("float32", "float32", "float16", True),
        "autocast_bf16": ("float32", "float32", "bfloat16", False),
        "fp16_master_weights": ("float16", "float32", "float16", True),
    }
    for name, (param, master, act, scaled) in expect.items():
        r = runs[name]
        assert (r.param_dtype, r.master_dtype, r.activation_dtype) == (param, master, act), name
        assert bool(r.loss_scales) == scaled, name
        assert r.peak_mem_mib is None  # CPU: no GPU memory counter


def test_unknown_recipe_is_refused():
    with pytest.raises(KeyError, match="unknown recipe"):
        amp_train.build_recipe("O2", CFG, "cpu")


def test_runs_table_and_curves(runs):
    table = amp_train.runs_table(list(runs.values()))
    assert REQUIRED_COLUMNS <= set(table.columns)
    assert len(table) == len(runs) and table["finite"].all()
    curves = amp_train.loss_curves(list(runs.values()))
    assert len(curves) == len(runs) * CFG.steps
    assert list(curves.columns) == ["run", "step", "loss"]
    traces = amp_train.scale_traces(list(runs.values()))
    assert set(traces["run"]) == {runs["autocast_fp16"].run, runs["fp16_master_weights"].run}


def test_scale_traces_find_halvings_and_growth():
    r = RunResult("r", "api", "O1", "cuda", loss_scales=[4.0, 4.0, 2.0, 2.0, 4.0])
    (row,) = amp_train.scale_traces([r]).to_dict(orient="records")
    assert row["halved_at_steps"] == [2] and row["grown_at_steps"] == [4]
    assert (row["scale_first_step"], row["scale_final"], row["scale_min"]) == (4.0, 4.0, 2.0)


def test_step_times_give_the_quartiles_the_verdicts_read():
    r = RunResult("r", "api", "x", "cpu", losses=[1.0] * 9, warmup_steps=1,
                  step_ms=[100.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    (row,) = amp_train.step_times([r, RunResult("empty", "api", "x", "cpu")]).to_dict("records")
    assert row == {"run": "r", "median_ms": 4.5, "q1_ms": 2.75, "q3_ms": 6.25}  # warm-up left out
    full = r.row()
    assert (full["step_q1_ms"], full["step_q3_ms"], full["step_iqr_ms"]) == (2.75, 6.25, 3.5)


def test_child_helpers_first_sentence_and_unavailable(monkeypatch):
    text = ("UserWarning: The torch.cuda.*DtypeTensor constructors are no longer recommended. "
            "It's best to use methods such as torch.tensor(data)")
    assert legacy_amp_run.first_sentence(text) == (
        "UserWarning: The torch.cuda.*DtypeTensor constructors are no longer recommended.")
    assert legacy_amp_run.first_sentence("no full stop") == "no full stop"
    assert legacy_amp_run.unavailable(device_is_cuda=False) == "a CUDA GPU"
    monkeypatch.setattr(gpu, "legacy_amp_available", lambda: False)
    assert "--legacy-only" in legacy_amp_run.unavailable(device_is_cuda=True)
    monkeypatch.setattr(gpu, "legacy_amp_available", lambda: True)
    assert legacy_amp_run.unavailable(device_is_cuda=True) == ""


def test_child_reports_dtypes_by_name():
    options = {"cast_model_type": torch.float16, "loss_scale": "dynamic", "master_weights": None}
    assert json.loads(json.dumps(legacy_amp_run._jsonable_options(options))) == {
        "cast_model_type": "float16", "loss_scale": "dynamic", "master_weights": None}


def test_run_result_statistics_and_round_trip():
    r = RunResult("r", "api", "x", "cpu", losses=[4.0] * 10 + [1.0] * 10, step_ms=[1.0] * 20,
                  warmup_steps=5)
    assert r.initial_loss == 4.0 and r.final_loss == 1.0 and r.decreasing and r.finite
    assert r.timing.median_ms == 1.0 and len(r.timing.samples_ms) == 15
    assert RunResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    bad = RunResult("o3", "api", "O3", "cuda", losses=[3.0, 2.0, float("nan"), float("nan")])
    assert not bad.finite and not bad.decreasing and bad.first_nonfinite_step == 2
    assert math.isnan(bad.final_loss)
    # jumps up on its first updates, then falls back to about where it started: below the first
    # tenth's mean and even a little below the loss before any update, yet it did not learn
    for end, learned in ((4.4, False), (4.1, False), (3.8, True)):
        jump = RunResult("j", "api", "O3 eps=0.0001", "cuda",
                         losses=[4.3, 10.7, 6.6] + [end] * 17)
        assert jump.final_loss < jump.initial_loss and jump.decreasing is learned
    failed = RunResult("f", "api", "O1", "cuda", error="RuntimeError: boom")
    assert not failed.ok and failed.status() == "FAILED: RuntimeError: boom"
    assert math.isnan(failed.row()["step_ms"])


@pytest.mark.parametrize("name", ["autocast_fp16", "fp16_master_weights"])
def test_forced_overflow_skips_the_step_and_halves_the_scale(name, batches):
    out = amp_checks.overflow_probe(amp_train.build_recipe(name, CFG, "cpu"), batches)
    assert out["inf_injected"] and out["params_unchanged"] and out["next_step_updates"]
    assert out["scale_halved"] and out["loss_scale_after"] == out["loss_scale_before"] / 2


def test_overflow_probe_needs_a_scaler(batches):
    with pytest.raises(ValueError, match="loss scaler"):
        amp_checks.overflow_probe(amp_train.build_recipe("fp32", CFG, "cpu"), batches)


def test_gradient_representability(batches):
    rows = amp_checks.gradient_representability(CFG, batches[0], "cpu")
    assert [(r["format"], r["loss_scale"]) for r in rows] == [
        ("float16", 1.0), ("float16", 2.0**16), ("bfloat16", 1.0)]
    for r in rows:
        assert 0.0 <= r["underflow_pct"] <= 100.0 and 0.0 <= r["overflow_pct"] <= 100.0
    # a huge loss scale overflows fp16 (max 65504), and not bf16, which is cast unscaled
    huge = amp_checks.gradient_representability(CFG, batches[0], "cpu", scales=(2.0**40,))
    assert huge[0]["overflow_pct"] > 50 and huge[1]["overflow_pct"] == 0


def test_gradient_representability_sees_underflow_and_what_scaling_fixes(batches, monkeypatch):
    class Tiny(torch.nn.Module):  # scales the logits down, and with them every gradient
        def forward(self, x):
            return x * 1e-6

    real = amp_checks.make_model
    monkeypatch.setattr(amp_checks, "make_model",
                        lambda cfg: torch.nn.Sequential(real(cfg), Tiny()))
    fp16, scaled, bf16 = amp_checks.gradient_representability(CFG, batches[0], "cpu")
    assert fp16["grad_abs_median"] < 3e-8  # below half of fp16's smallest subnormal
    assert fp16["underflow_pct"] > 50 and scaled["underflow_pct"] < fp16["underflow_pct"] / 10
    assert bf16["underflow_pct"] == 0 and scaled["overflow_pct"] == 0


def test_op_output_dtypes_under_cpu_autocast():
    plain = amp_checks.op_output_dtypes("cpu", torch.float32)
    assert set(plain.values()) == {"float32"}
    auto = amp_checks.op_output_dtypes(
        "cpu", torch.bfloat16, lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert auto["linear"] == "bfloat16" and auto["cross_entropy"] == "float32"


def test_migration_map_covers_every_opt_level():
    table = amp_migration.migration_table()
    assert list(table["opt_level"]) == list(legacy_amp_run.OPT_LEVELS)
    assert {"what_it_cast", "master_weights", "loss_scaling", "torch_amp_today"} <= set(table)
    assert table.notna().all().all()


# What the legacy Apex itself sets per opt level (the O0-O3 classes in apex/amp/frontend.py of
# the last commit with apex.amp), written out independently of the course's map.
LEGACY_FRONTEND_OPTIONS = {
    "O0": {"cast_model_type": "float32", "patch_torch_functions": False,
           "keep_batchnorm_fp32": None, "master_weights": False, "loss_scale": 1.0},
    "O1": {"cast_model_type": None, "patch_torch_functions": True,
           "keep_batchnorm_fp32": None, "master_weights": None, "loss_scale": "dynamic"},
    "O2": {"cast_model_type": "float16", "patch_torch_functions": False,
           "keep_batchnorm_fp32": True, "master_weights": True, "loss_scale": "dynamic"},
    "O3": {"cast_model_type": "float16", "patch_torch_functions": False,
           "keep_batchnorm_fp32": False, "master_weights": False, "loss_scale": 1.0},
}


def test_options_check_flags_a_mismatch():
    reported = {level: dict(options) for level, options in LEGACY_FRONTEND_OPTIONS.items()}
    rows = amp_migration.options_check(reported)
    assert len(rows) == 20 and all(r["matches"] for r in rows), [r for r in rows
                                                                 if not r["matches"]]
    reported["O2"]["master_weights"] = False
    bad = [r for r in amp_migration.options_check(reported) if not r["matches"]]
    assert bad == [{"opt_level": "O2", "option": "master_weights", "map_says": True,
                    "apex_set": False, "matches": False}]


@pytest.mark.parametrize(("capability", "native"), [((7, 5), False), ((9, 0), True)])
def test_bf16_table_reads_this_machines_capability(monkeypatch, capability, native):
    assert not amp_migration.bf16_native((7, 5)) and amp_migration.bf16_native((8, 0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU")
    here = amp_migration.bf16_table().iloc[-1]
    assert (here["generation"], here["examples"]) == ("this machine", "Test GPU")
    assert here["compute_capability"] == f"{capability[0]}.{capability[1]}"
    assert bool(here["bf16_native"]) is native


def test_bf16_table_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    here = amp_migration.bf16_table().iloc[-1]
    assert here["compute_capability"] == "-" and not bool(here["bf16_native"])


def test_apex_amp_import_is_one_line():
    text = amp_migration.apex_amp_import()
    assert "\n" not in text and (text.startswith("ok") or "Error" in text)


def test_child_dry_run_writes_the_plan(tmp_path):
    out = tmp_path / "plan.json"
    assert legacy_amp_run.main(["--out", str(out), "--config", CFG.to_json(), "--levels",
                                "O0,O1,O2,O3", "--overflow-levels", "O1", "--dry-run"]) == 0
    payload = json.loads(out.read_text())
    assert payload["meta"]["dry_run"] and payload["meta"]["levels"] == ["O0", "O1", "O2", "O3"]
    assert payload["meta"]["config"] == json.loads(CFG.to_json()) and payload["runs"] == []


def test_child_plans_o3_eps_runs(tmp_path):
    out = tmp_path / "plan.json"
    assert legacy_amp_run.main(["--out", str(out), "--config", CFG.to_json(),
                                "--o3-eps", "1e-4,0.001", "--dry-run"]) == 0
    assert json.loads(out.read_text())["meta"]["o3_eps"] == [1e-4, 1e-3]
    assert legacy_amp_run.o3_label(1e-3) == "O3 eps=0.001"
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert amp_train.make_optimizer(params, CFG).defaults["eps"] == 1e-8
    eps_cfg = amp_train.TrainConfig.from_json(CFG.to_json().replace('"adam_eps": 1e-08',
                                                                    '"adam_eps": 0.001'))
    assert amp_train.make_optimizer(params, eps_cfg).defaults["eps"] == 1e-3
    for bad in ("0", "2", "x"):
        with pytest.raises(SystemExit) as exc:
            legacy_amp_run.main(["--out", str(out), "--o3-eps", bad, "--dry-run"])
        assert exc.value.code == 2


def test_child_refuses_unknown_levels(tmp_path):
    with pytest.raises(SystemExit) as exc:
        legacy_amp_run.main(["--out", str(tmp_path / "x.json"), "--levels", "O4"])
    assert exc.value.code == 2


def test_child_reports_legacy_levels_as_failed_without_a_gpu(tmp_path):
    out = tmp_path / "cpu.json"
    legacy_amp_run.main(["--out", str(out), "--config", CFG.to_json(), "--device", "cpu",
                         "--levels", "O1,O3", "--overflow-levels", "O2"])
    payload = json.loads(out.read_text())
    runs = legacy_amp_run.runs_of(payload)
    assert [r.opt_level_or_recipe for r in runs] == ["O1", "O3"]
    assert all(not r.ok and "CUDA" in r.error and "\n" not in r.error for r in runs)
    assert payload["overflow"][0]["error"] == payload["import_error"]


def test_child_process_reproduces_the_in_process_fp32_run(tmp_path, runs):
    payload = legacy_amp_run.launch(CFG, tmp_path / "child.json", torch_recipes=("fp32",),
                                    timeout=300)
    assert payload["error"] == "" and payload["returncode"] == 0, payload
    (child,) = legacy_amp_run.runs_of(payload)
    torch.testing.assert_close(torch.tensor(child.losses), torch.tensor(runs["fp32"].losses),
                               rtol=1e-3, atol=1e-4)


def test_launch_turns_a_crash_into_one_line(tmp_path):
    payload = legacy_amp_run.launch(CFG, tmp_path / "x.json", levels=("O9",), timeout=300)
    assert payload["returncode"] == 2 and "O9" in payload["error"] and payload["runs"] == []


def _legacy_source() -> Path | None:
    for path in (gpu.legacy_amp_dir(), REPO / ".apex_src" / "legacy" / "apex"):
        if (path / "apex" / "amp" / "frontend.py").is_file():
            return path
    return None


@pytest.mark.skipif(_legacy_source() is None, reason="no legacy apex.amp source or install here")
def test_legacy_import_hides_compiled_kernels_and_reset_is_clean():
    legacy = _legacy_source()
    code = ("import json; from helpers import legacy_amp_run as l; "
            "info = l.import_legacy_amp(); info['restored'] = l.reset_amp(); "
            "print(json.dumps(info))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(legacy), str(REPO)]),
               **{legacy_amp_run.LEGACY_DIR_VAR: str(legacy)})
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["apex_path"].startswith(str(legacy.resolve()))
    assert info["fused_kernels"] is False and info["restored"] is True


# A stand-in for the legacy package with the same names the child touches (``amp.initialize``,
# ``amp.scale_loss``, ``amp.master_params``, ``amp._amp_state`` with its options, loss scalers
# and O1 handle, ``apex.amp.amp._DECORATOR_HANDLE``, ``multi_tensor_applier``). It runs on the
# CPU, so the child's own code (run_level, overflow_level, reset_amp) is exercised here.
FAKE_AMP = '''
import contextlib
import torch
import torch.nn.functional as F
import sys
from . import amp as _amp_module
_self = sys.modules[__name__]

SKIP_ON_OVERFLOW = True  # False: a broken amp that steps on inf gradients (the probe must see it)

OPTIONS = {"O0": (torch.float32, False, 1.0), "O1": (None, True, "dynamic"),
           "O2": (torch.float16, False, "dynamic"), "O3": (torch.float16, False, 1.0)}

class _State:
    pass

_amp_state = _State()

class _Scaler:
    def __init__(self, scale):
        self.dynamic = scale == "dynamic"
        self._loss_scale = 2.0 ** 16 if self.dynamic else scale
    def loss_scale(self):
        return self._loss_scale

class _Props:
    def __init__(self, options):
        self.options = options

class _Handle:
    def __init__(self):
        self._all_wrappers = []

INITIALIZED_EPS = []  # Adam's eps of every optimizer passed to initialize, in order

def initialize(model, optimizer, opt_level="O1", verbosity=1):
    INITIALIZED_EPS.append(optimizer.param_groups[0]["eps"])
    cast, patch, scale = OPTIONS[opt_level]
    _amp_state.opt_properties = _Props({"cast_model_type": cast, "patch_torch_functions": patch,
                                        "master_weights": opt_level == "O2", "loss_scale": scale})
    _amp_state.loss_scalers = [_Scaler(scale)]
    if patch:
        handle = _Handle()
        original = F.linear
        def linear(x, w, b=None):
            return original(x.half(), w.half(), None if b is None else b.half())
        handle._all_wrappers.append((F, "linear", original))
        F.linear = linear
        _amp_state.handle = handle
        _amp_module._DECORATOR_HANDLE = handle
    return model, optimizer

def master_params(optimizer):
    for group in optimizer.param_groups:
        yield from group["params"]

@contextlib.contextmanager
def scale_loss(loss, optimizer):
    scaler = _amp_state.loss_scalers[0]
    scale = scaler.loss_scale()
    yield loss.float() * scale
    grads = [p.grad for p in master_params(optimizer) if p.grad is not None]
    overflow = not all(bool(torch.isfinite(g).all()) for g in grads)
    if scaler.dynamic and overflow and _self.SKIP_ON_OVERFLOW:
        scaler._loss_scale = scale / 2
        step = optimizer.step
        def skip(closure=None):
            optimizer.step = step
        optimizer.step = skip
    else:
        for g in grads:
            g.div_(scale)
'''


@pytest.fixture()
def fake_apex(tmp_path):
    pkg = tmp_path / "apex"
    (pkg / "amp").mkdir(parents=True)
    (pkg / "multi_tensor_apply").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "amp" / "__init__.py").write_text(FAKE_AMP)
    (pkg / "amp" / "amp.py").write_text("_DECORATOR_HANDLE = None\n")
    (pkg / "multi_tensor_apply" / "__init__.py").write_text(
        "class _A:\n    available = False\nmulti_tensor_applier = _A()\n")
    return tmp_path


def test_child_runs_levels_and_overflow_with_a_stand_in_amp(fake_apex, tmp_path):
    code = f"""
import dataclasses, json, sys, torch
from helpers import legacy_amp_run as l
from helpers.amp_train import TrainConfig, make_batches
assert "apex" not in sys.modules, "importing the runner must not import apex"
cfg = TrainConfig.from_json({CFG.to_json()!r})
info = l.import_legacy_amp()
batches = make_batches(cfg, "cpu")
out = {{"import": info, "levels": {{}}, "overflow": []}}
for level in ("O0", "O1", "O3"):
    result, meta = l.run_level(level, cfg, batches)
    out["levels"][level] = {{"row": result.row(), "meta": meta}}
eps_cfg = dataclasses.replace(cfg, adam_eps=1e-3)
result, meta = l.run_level("O3", eps_cfg, batches, l.o3_label(1e-3))
out["levels"]["O3 eps"] = {{"row": result.row(), "meta": meta}}
import apex.amp
out["initialized_eps"] = list(apex.amp.INITIALIZED_EPS)
out["overflow"].append(l.overflow_level("O1", cfg, batches))
import apex.amp
apex.amp.SKIP_ON_OVERFLOW = False  # an amp that does not skip: the probe must report it
out["overflow"].append(l.overflow_level("O1", cfg, batches))
out["restored"] = l.reset_amp()
out["linear_is_original"] = torch.nn.functional.linear is l.ORIGINALS["F.linear"]
print(json.dumps(out))
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake_apex), str(REPO)]),
               **{legacy_amp_run.LEGACY_DIR_VAR: str(fake_apex)})
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # the course's side: the import check, the training loop under amp, what the child reads
    # back while a level is active, and that reset_amp really undoes O1's patch
    assert out["import"]["fused_kernels"] is False
    assert out["restored"] is True and out["linear_is_original"] is True
    o0, o1 = out["levels"]["O0"], out["levels"]["O1"]
    assert o0["row"]["finite"] and o0["row"]["steps"] == CFG.steps
    assert o1["row"]["activation_dtype"] == "float16"  # recorded while O1's patch was active
    assert o1["meta"]["op_dtypes"]["linear"] == "float16"  # probed before the reset
    assert o1["meta"]["restored"] is True
    assert out["levels"]["O3"]["row"]["error"] == ""
    o3_eps = out["levels"]["O3 eps"]
    assert o3_eps["row"]["run"] == "apex.amp O3 eps=0.001" and o3_eps["row"]["error"] == ""
    assert o3_eps["meta"]["opt_level"] == "O3" and o3_eps["meta"]["adam_eps"] == 1e-3
    # the optimizer amp.initialize really received: the default eps for O0, O1, O3, then 1e-3
    assert out["initialized_eps"] == [1e-8, 1e-8, 1e-8, 1e-3]
    # the overflow probe reports what the amp did, whichever way it went
    honest, broken = out["overflow"]
    assert honest["inf_injected"] and broken["inf_injected"]
    assert honest["scale_halved"] and honest["params_unchanged"], honest
    assert honest["next_step_updates"]
    assert not broken["scale_halved"] and not broken["params_unchanged"], broken


def test_child_refuses_an_apex_from_elsewhere(fake_apex, tmp_path):
    code = "from helpers import legacy_amp_run as l; l.import_legacy_amp()"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake_apex), str(REPO)]),
               **{legacy_amp_run.LEGACY_DIR_VAR: str(tmp_path / "elsewhere")})
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "not from the legacy install" in proc.stderr
