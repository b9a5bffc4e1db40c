"""Tests for notebook 04's chapter module (helpers.chapters.legacy_amp) and its legacy script cell.

Everything here runs on the CPU at smoke sizes. The legacy apex.amp itself needs a CUDA GPU;
what can be checked without one is checked: the child's plan and its refusals, its JSON, its
one-line failures, and the notebook's own script cell, run in a child process against a
stand-in ``apex.amp`` (and against the real legacy source when one is at hand).
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F

from helpers import bench, errors, launch, machine, verdicts
from helpers.chapters import legacy_amp
from helpers.chapters.legacy_amp import TrainConfig

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "04_legacy_apex_amp_vs_torch_amp.ipynb"
CFG = TrainConfig.smoke()


@pytest.fixture(scope="module")
def batches():
    return legacy_amp.make_batches(CFG, "cpu")


@pytest.fixture()
def script(tmp_path) -> Path:
    """The notebook's ``%%writefile`` cell, written where the notebook would write it."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (cell,) = [c for c in nb.cells if c.cell_type == "code"
               and c.source.startswith("%%writefile")]
    path = tmp_path / "04_legacy_amp.py"
    path.write_text(cell.source.split("\n", 1)[1] + "\n")
    return path


# ------------------------------------------------------------------ model, data, records
def test_config_round_trips_through_json():
    assert TrainConfig.from_json(CFG.to_json()) == CFG


def test_data_and_model_are_seeded(batches):
    again = legacy_amp.make_batches(CFG, "cpu")
    for (x1, y1), (x2, y2) in zip(batches, again, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert len(batches) == CFG.pool and int(batches[0][1].max()) < CFG.classes
    a, b = legacy_amp.make_model(CFG), legacy_amp.make_model(CFG)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def _step_fp32(model, optimizer, x, y):  # the notebook's fp32 recipe
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def _fp32_run(batches) -> bench.Run:
    with bench.peak_memory("cpu") as peak:
        model = legacy_amp.make_model(CFG)
        optimizer = torch.optim.Adam(model.parameters(), lr=CFG.lr, eps=CFG.adam_eps)
        rec = legacy_amp.Recorder(model)
        run = bench.train(lambda i: _step_fp32(model, optimizer, *batches[i % CFG.pool]),
                          CFG.steps, device="cpu", warmup=CFG.warmup_steps, label="fp32",
                          after_step=rec.after_step)
    return rec.finish(run, peak, optimizer, api="torch.amp", recipe="fp32")


def test_recorder_reports_dtypes_scales_and_memory(batches):
    run = _fp32_run(batches)
    assert run.learned and len(run.losses) == CFG.steps
    extra = run.extra
    assert (extra["param_dtype"], extra["master_dtype"], extra["activation_dtype"]) == (
        "float32", "float32", "float32")
    assert extra["loss_scales"] == [] and math.isnan(extra["loss_scale_final"])
    assert math.isnan(run.peak_mem_gib)  # CPU: no GPU memory counter
    row = run.row()  # the columns the notebook's tables and verdicts read
    assert {"run", "api", "opt_level_or_recipe", "median_ms", "q1_ms", "q3_ms", "final_loss",
            "activation_dtype", "loss_scale_final", "learned"} <= set(row)
    assert "loss_scales" not in row

    model = legacy_amp.make_model(CFG).half()
    masters = [p.detach().float() for p in model.parameters()]
    optimizer = torch.optim.Adam(masters)
    rec = legacy_amp.Recorder(model, lambda: 4.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model.float()(batches[0][0])
    rec.after_step(0, torch.tensor(1.0))
    model.half()
    done = rec.finish(bench.Run("x", "cpu", losses=[1.0]), bench.Peak(), optimizer,
                      api="a", recipe="r")
    assert done.extra["activation_dtype"] == "bfloat16"  # the first forward's output dtype
    assert done.extra["param_dtype"] == "float16" and done.extra["master_dtype"] == "float32"
    assert done.extra["loss_scales"] == [4.0] and done.extra["loss_scale_final"] == 4.0


def test_scale_traces_find_halvings_and_growth():
    r = bench.Run("r", "cuda", extra={"loss_scales": [4.0, 4.0, 2.0, 2.0, 4.0]})
    (row,) = legacy_amp.scale_traces([r, bench.Run("none", "cpu")]).to_dict(orient="records")
    assert row["halved_at_steps"] == [2] and row["grown_at_steps"] == [4]
    assert (row["scale_first_step"], row["scale_final"], row["scale_min"]) == (4.0, 4.0, 2.0)



def test_o3_table_reads_each_pure_fp16_run():
    def run(label, losses):
        return bench.Run(label, "cuda", losses=losses, step_ms=[1.0] * len(losses), warmup=0)

    base = run("fp32", [4.0] * 10 + [1.0] * 10)
    runs = [run("O3", [4.0, float("nan")] + [float("nan")] * 18),
            run("O3 eps=0.0001", [4.0] * 5 + [8.0] * 5 + [4.0] * 10),  # never fell: not learned
            run("O3 eps=0.001", [4.0] * 10 + [1.5] * 10),  # learned, +50%
            run("O3 eps=0.003", [4.0] * 10 + [1.01] * 10)]  # learned, +1%
    eps = {"O3": 1e-8, "O3 eps=0.0001": 1e-4, "O3 eps=0.001": 1e-3, "O3 eps=0.003": 3e-3}
    table = legacy_amp.o3_table(runs, base, 0.02, eps)
    assert list(table.columns) == legacy_amp.O3_COLUMNS
    by = table.set_index("run")
    assert by["outcome"].tolist() == ["non-finite", "did not learn", "outside tolerance",
                                      "within tolerance"]
    assert by.loc["O3", "first_nonfinite_step"] == 1 and math.isnan(by.loc["O3", "final_loss"])
    assert by.loc["O3", "eps_in_fp16"] == 0.0  # 1e-8 rounds to 0 in fp16
    assert by.loc["O3 eps=0.0001", "highest_loss"] == 8.0
    assert by.loc["O3 eps=0.001", "vs_fp32_pct"] == pytest.approx(50.0)
    assert by.loc["O3 eps=0.001", "adam_eps"] == 1e-3
    wider = legacy_amp.o3_table(runs, base, 0.6, eps).set_index("run")  # the verdict flips
    assert wider.loc["O3 eps=0.001", "outcome"] == "within tolerance"


# ------------------------------------------------------------------ checks
def _fp16_recipe(skip_on_inf: bool = True):
    model = legacy_amp.make_model(CFG)
    optimizer = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    scaler = torch.amp.GradScaler("cpu")

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        if skip_on_inf:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:  # a broken scaler: steps on inf gradients and never halves
            (loss * scaler.get_scale()).backward()
            optimizer.step()
        return loss

    return step, model, optimizer, scaler.get_scale


def test_forced_overflow_skips_the_step_and_halves_the_scale(batches):
    step, model, optimizer, scale = _fp16_recipe()
    out = legacy_amp.overflow_probe(step, model, optimizer, scale, batches)
    assert out["inf_injected"] and out["params_unchanged"] and out["next_step_updates"]
    assert out["scale_halved"] and out["loss_scale_after"] == out["loss_scale_before"] / 2


def test_overflow_probe_sees_a_scaler_that_does_not_skip(batches):
    step, model, optimizer, scale = _fp16_recipe(skip_on_inf=False)
    out = legacy_amp.overflow_probe(step, model, optimizer, scale, batches)
    assert out["inf_injected"] and not out["params_unchanged"] and not out["scale_halved"]


def test_overflow_probe_needs_a_scaler(batches):
    step, model, optimizer, _ = _fp16_recipe()
    with pytest.raises(ValueError, match="loss scaler"):
        legacy_amp.overflow_probe(step, model, optimizer, None, batches)


def test_inf_grad_once_fires_once():
    hook = legacy_amp.InfGradOnce()
    g = torch.ones(3)
    assert hook(g) is None and not hook.fired
    hook.armed = True
    out = hook(g)
    assert torch.isinf(out[0]) and torch.equal(g, torch.ones(3))  # a copy, not in place
    assert hook.fired and hook(g) is None


def test_gradient_representability(batches):
    rows = legacy_amp.gradient_representability(CFG, batches[0], "cpu")
    assert [(r["format"], r["loss_scale"]) for r in rows] == [
        ("float16", 1.0), ("float16", 2.0**16), ("bfloat16", 1.0)]
    for r in rows:
        assert 0.0 <= r["underflow_pct"] <= 100.0 and 0.0 <= r["overflow_pct"] <= 100.0
    # a huge loss scale overflows fp16 (max 65504), and not bf16, which is cast unscaled
    huge = legacy_amp.gradient_representability(CFG, batches[0], "cpu", scales=(2.0**40,))
    assert huge[0]["overflow_pct"] > 50 and huge[1]["overflow_pct"] == 0


def test_gradient_representability_sees_underflow_and_what_scaling_fixes(batches, monkeypatch):
    class Tiny(torch.nn.Module):  # scales the logits down, and with them every gradient
        def forward(self, x):
            return x * 1e-6

    real = legacy_amp.make_model
    monkeypatch.setattr(legacy_amp, "make_model",
                        lambda cfg: torch.nn.Sequential(real(cfg), Tiny()))
    fp16, scaled, bf16 = legacy_amp.gradient_representability(CFG, batches[0], "cpu")
    assert fp16["grad_abs_median"] < 3e-8  # below half of fp16's smallest subnormal
    assert fp16["underflow_pct"] > 50 and scaled["underflow_pct"] < fp16["underflow_pct"] / 10
    assert bf16["underflow_pct"] == 0 and scaled["overflow_pct"] == 0


def test_op_output_dtypes_under_cpu_autocast():
    plain = legacy_amp.op_output_dtypes("cpu", torch.float32)
    assert set(plain.values()) == {"float32"}
    auto = legacy_amp.op_output_dtypes(
        "cpu", torch.bfloat16, lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert auto["linear"] == "bfloat16" and auto["cross_entropy"] == "float32"


# ------------------------------------------------------------------ the migration map
def test_migration_map_covers_every_opt_level():
    table = legacy_amp.migration_table()
    assert list(table["opt_level"]) == list(legacy_amp.OPT_LEVELS)
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
    rows = legacy_amp.options_check(reported)
    assert len(rows) == 20 and all(r["matches"] for r in rows), [r for r in rows
                                                                 if not r["matches"]]
    reported["O2"]["master_weights"] = False
    bad = [r for r in legacy_amp.options_check(reported) if not r["matches"]]
    assert bad == [{"opt_level": "O2", "option": "master_weights", "map_says": True,
                    "apex_set": False, "matches": False}]


def test_child_reports_dtypes_by_name():
    options = {"cast_model_type": torch.float16, "loss_scale": "dynamic", "master_weights": None}
    assert json.loads(json.dumps(legacy_amp.jsonable_options(options))) == {
        "cast_model_type": "float16", "loss_scale": "dynamic", "master_weights": None}


@pytest.mark.parametrize(("capability", "native"), [((7, 5), False), ((9, 0), True)])
def test_bf16_table_reads_this_machines_capability(monkeypatch, capability, native):
    assert not legacy_amp.bf16_native((7, 5)) and legacy_amp.bf16_native((8, 0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU")
    here = legacy_amp.bf16_table().iloc[-1]
    assert (here["generation"], here["examples"]) == ("this machine", "Test GPU")
    assert here["compute_capability"] == f"{capability[0]}.{capability[1]}"
    assert bool(here["bf16_native"]) is native


def test_bf16_table_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    here = legacy_amp.bf16_table().iloc[-1]
    assert here["compute_capability"] == "-" and not bool(here["bf16_native"])


def test_apex_amp_import_is_one_line():
    text = legacy_amp.apex_amp_import()
    assert "\n" not in text and (text.startswith("ok") or "Error" in text)


def test_warnings_table_keeps_each_distinct_first_sentence():
    long = ("UserWarning: The torch.cuda.*DtypeTensor constructors are no longer recommended. "
            "It's best to use methods such as torch.tensor(data)")
    levels = {"O1": {"warnings": [long, "no full stop"]}, "O2": {"warnings": [long]}, "O3": {}}
    assert legacy_amp.warnings_table(levels)["warning"].tolist() == [
        "UserWarning: The torch.cuda.*DtypeTensor constructors are no longer recommended.",
        "no full stop"]
    assert legacy_amp.warnings_table({}).empty


# ------------------------------------------------------------------ the plan
def test_o3_eps_accepts_one_float_and_refuses_bad_values():
    assert legacy_amp.check_eps(1e-3) == (1e-3,)
    assert legacy_amp.check_eps([1e-4, "0.001"]) == (1e-4, 1e-3)
    assert legacy_amp.check_eps(()) == ()
    for bad in (0, 2.0, (1e-3, -1.0), "x", None):
        with pytest.raises(errors.CourseError) as exc:
            legacy_amp.check_eps(bad)
        assert "o3_eps" in str(exc.value) and "\n" not in str(exc.value)
    assert legacy_amp.o3_label(1e-3) == "O3 eps=0.001"


def test_child_refuses_unknown_levels_and_bad_eps(tmp_path):
    plan = {"config": json.loads(CFG.to_json())}
    for extra in ({"levels": ["O4"]}, {"overflow_levels": ["00"]}, {"o3_eps": [2.0]},
                  {"fused_levels": ["O5"]}):
        with pytest.raises(SystemExit) as exc:
            legacy_amp.Child.from_argv(["--plan", json.dumps({**plan, **extra}),
                                        "--out", str(tmp_path / "x.json")])
        assert exc.value.code == 2
    child = legacy_amp.Child.from_argv(["--plan", json.dumps({**plan, "o3_eps": [1e-3]}),
                                        "--out", str(tmp_path / "x.json")])
    assert child.cfg == CFG and child.wants_legacy
    assert list(child.legacy_runs()) == [("O3 eps=0.001", "O3", 1e-3, False)]


# ------------------------------------------------------------------ the script cell
def test_script_cell_reproduces_the_fp32_run_and_fails_legacy_levels_in_one_line(script, tmp_path,
                                                                                batches):
    """One child (each costs a torch import): its fp32 run matches the in-process one, and the
    legacy levels it was asked for fail in one line each, the legacy install being missing."""
    payload = legacy_amp.launch(script, CFG, tmp_path / "cpu.json", levels=("O1", "O3"),
                                overflow_levels=("O2",), legacy_dir=tmp_path / "missing",
                                device="cpu", timeout=300)
    assert payload["error"] == "" and payload["returncode"] == 0, payload
    runs = legacy_amp.runs_of(payload)
    assert [r.label for r in runs] == ["torch.amp fp32 (child)", "apex.amp O1", "apex.amp O3"]
    child = runs[0]
    assert child.ok and child.extra["api"] == "torch.amp"
    assert child.extra["activation_dtype"] == "float32"
    torch.testing.assert_close(torch.tensor(child.losses),
                               torch.tensor(_fp32_run(batches).losses), rtol=1e-3, atol=1e-4)
    assert all(not r.ok and "\n" not in r.error for r in runs[1:])
    assert payload["import_error"] and runs[1].error == payload["import_error"]
    assert payload["levels"] == {} and len(payload["overflow"]) == 1
    assert payload["overflow"][0]["error"] == payload["import_error"]


def test_launch_turns_a_crash_into_one_line(script, tmp_path):
    payload = legacy_amp.launch(script, CFG, tmp_path / "x.json", levels=("O9",), timeout=300)
    assert payload["returncode"] == 2 and payload["runs"] == []
    assert payload["error"].startswith("the child process exited with 2; its last error: ")
    assert payload["error"].endswith("error: unknown opt level O9: use O0, O1, O2, O3")
    assert payload["stderr_tail"][-1] in payload["error"] and "\n" not in payload["error"]


def _legacy_source() -> Path | None:
    for path in (machine.legacy_amp_dir(), REPO / ".apex_src" / "legacy" / "apex"):
        if (path / "apex" / "amp" / "frontend.py").is_file():
            return path
    return None


@pytest.mark.skipif(_legacy_source() is None, reason="no legacy apex.amp source or install here")
def test_legacy_import_hides_compiled_kernels_and_reset_is_clean(tmp_path):
    legacy = _legacy_source()
    code = ("import json; from helpers.chapters import legacy_amp as l; "
            f"c = l.Child({{'config': {CFG.to_json()}}}, None); "
            "assert c.import_legacy_amp() is not None, c.import_error; "
            "info = dict(c.payload['meta']); info['restored'] = l.reset_amp(); "
            "print(json.dumps(info))")
    env = launch.child_env(legacy, **{legacy_amp.LEGACY_DIR_VAR: str(legacy)})
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["apex_path"].startswith(str(legacy.resolve()))
    assert info["fused_kernels"] is False and info["restored"] is True


# A stand-in for the legacy package with the same names the script and the child touch
# (``amp.initialize``, ``amp.scale_loss``, ``amp.master_params``, ``amp._amp_state`` with its
# options, loss scalers and O1 handle, ``apex.amp.amp._DECORATOR_HANDLE``,
# ``multi_tensor_applier``). It runs on the CPU, so the notebook's script cell is exercised.
FAKE_AMP = '''
import contextlib
import os
import torch
import torch.nn.functional as F
from . import amp as _amp_module

SKIP_ON_OVERFLOW = not os.environ.get("FAKE_AMP_BROKEN")  # broken: steps on inf gradients

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

def initialize(model, optimizer, opt_level="O1", verbosity=1):
    with open(os.environ["FAKE_AMP_LOG"], "a") as log:  # the eps each optimizer came with
        log.write(f"{opt_level} {optimizer.param_groups[0]['eps']!r}\\n")
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
    if scaler.dynamic and overflow and SKIP_ON_OVERFLOW:
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
    root = tmp_path / "legacy"
    pkg = root / "apex"
    (pkg / "amp").mkdir(parents=True)
    (pkg / "multi_tensor_apply").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "amp" / "__init__.py").write_text(FAKE_AMP)
    (pkg / "amp" / "amp.py").write_text("_DECORATOR_HANDLE = None\n")
    (pkg / "multi_tensor_apply" / "__init__.py").write_text(
        "class _A:\n    available = False\nmulti_tensor_applier = _A()\n")
    return root


@pytest.mark.slow
def test_script_cell_runs_levels_and_overflow_with_a_stand_in_amp(script, fake_apex, tmp_path,
                                                                   monkeypatch):
    log = tmp_path / "initialized.txt"
    monkeypatch.setenv("FAKE_AMP_LOG", str(log))
    payload = legacy_amp.launch(script, CFG, tmp_path / "fake.json", levels=("O0", "O1", "O3"),
                                o3_eps=(1e-3,), overflow_levels=("O1",), fused_levels=("O1",),
                                timed_levels=("O1",), legacy_dir=fake_apex, device="cpu",
                                timeout=300)
    assert payload["error"] == "" and payload["import_error"] == "", payload
    assert payload["meta"]["fused_kernels"] is False
    # no fused kernels on the CPU: the check says why in one line, and no 'O1 fused' run
    assert payload["meta"]["fused_check"]["ok"] is False and payload["meta"]["fused_check"]["why"]
    assert payload["rounds"] == {"apex.amp O1": payload["rounds"]["apex.amp O1"]}
    assert len(payload["rounds"]["apex.amp O1"]) == CFG.rounds and not payload["round_errors"]
    assert payload["meta"]["apex_path"].startswith(str(fake_apex.resolve()))
    runs = {r.label: r for r in legacy_amp.runs_of(payload)}
    assert list(runs) == ["torch.amp fp32 (child)", "apex.amp O0", "apex.amp O1", "apex.amp O3",
                          "apex.amp O3 eps=0.001"]
    assert all(r.ok and len(r.losses) == CFG.steps for r in runs.values()), runs
    assert not any(r.extra.get("fused_kernels") for r in runs.values())
    # recorded while O1's patch was active; the op probe ran before the reset
    assert runs["apex.amp O1"].extra["activation_dtype"] == "float16"
    assert runs["apex.amp O0"].extra["activation_dtype"] == "float32"  # O1's patch was undone
    levels = payload["levels"]
    assert levels["O1"]["op_dtypes"]["linear"] == "float16" and levels["O1"]["restored"] is True
    assert levels["O1"]["patched_functions"] == 1
    assert levels["O1"]["options"]["patch_torch_functions"] is True
    assert levels["O0"]["options"]["cast_model_type"] == "float32"
    eps_run = levels["O3 eps=0.001"]
    assert eps_run["opt_level"] == "O3" and eps_run["adam_eps"] == 1e-3
    assert runs["apex.amp O3 eps=0.001"].extra["opt_level_or_recipe"] == "O3 eps=0.001"
    scales = runs["apex.amp O1"].extra["loss_scales"]  # read from amp after every step
    assert len(scales) == CFG.steps and set(scales) <= {2.0**16, 2.0**15, 2.0**14}
    # the optimizer amp.initialize really received: the default eps, then 1e-3; then the probe;
    # then the rounds, a first one thrown away
    assert log.read_text().split("\n")[:-1] == ["O0 1e-08", "O1 1e-08", "O3 1e-08", "O3 0.001",
                                                "O1 1e-08"] + ["O1 1e-08"] * (1 + CFG.rounds)
    (honest,) = payload["overflow"]
    assert honest["inf_injected"] and honest["scale_halved"] and honest["params_unchanged"]
    assert honest["next_step_updates"] and "error" not in honest

    monkeypatch.setenv("FAKE_AMP_BROKEN", "1")  # an amp that does not skip: the probe sees it
    payload = legacy_amp.launch(script, CFG, tmp_path / "broken.json", overflow_levels=("O1",),
                                legacy_dir=fake_apex, device="cpu", timeout=300)
    (broken,) = payload["overflow"]
    assert broken["inf_injected"] and not broken["scale_halved"]
    assert not broken["params_unchanged"]


def test_child_refuses_an_apex_from_elsewhere(script, fake_apex, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_AMP_LOG", str(tmp_path / "log.txt"))
    monkeypatch.setenv("PYTHONPATH", str(fake_apex))  # apex importable, but not the legacy dir
    payload = legacy_amp.launch(script, CFG, tmp_path / "x.json", levels=("O1",),
                                legacy_dir=tmp_path / "elsewhere", device="cpu", timeout=300)
    assert "not from the legacy install" in payload["import_error"], payload
    assert not legacy_amp.runs_of(payload)[-1].ok


def test_runs_table_reads_each_run_against_fp32():
    def run(label, losses, ms=1.0, recipe="", scales=None):
        extra = {"opt_level_or_recipe": recipe or label, "param_dtype": "float16"}
        if scales:
            extra["loss_scales"] = scales
        return bench.Run(label, "cpu", losses=losses, step_ms=[ms] * len(losses), warmup=0,
                         extra=extra)

    base = run("fp32", [4.0] * 10 + [1.0] * 10, ms=10.0)
    close = run("bf16", [4.0] * 10 + [1.015] * 10, ms=5.0,  # +1.5%: within 2%
                scales=[8.0, 4.0, 4.0, 8.0, 4.0])  # halved twice, grown once
    far = run("O3", [4.0] * 10 + [1.05] * 10)  # +5%: outside
    broken = run("O3 eps", [4.0] + [float("nan")] * 19, recipe="O3 eps=0.001")
    failed = legacy_amp.failed_run("O1", "apex.amp (legacy)", "O1", "boom", "cpu")
    table = legacy_amp.runs_table([base, close, far, broken, failed], base, 0.02, ("O3",))
    assert list(table.columns) == legacy_amp.RUNS_COLUMNS
    assert list(table["run"]) == ["fp32", "bf16", "O3", "O3 eps"]  # the failed run is left out
    by = table.set_index("run")
    assert by.loc["bf16", "step_ms"] == 5.0 and by.loc["bf16", "param_dtype"] == "float16"
    assert by.loc["bf16", "vs_fp32_pct"] == pytest.approx(1.5)
    assert by["scale_halvings"].tolist() == [0, 2, 0, 0]
    assert by["within_tolerance"].tolist() == [True, True, False, False]
    assert by["learned"].tolist() == [True, True, True, False]
    assert by["asserted"].tolist() == [True, True, False, False]
    assert legacy_amp.runs_table([base, far], base, 0.06)["within_tolerance"].all()


def test_levels_table_sums_up_each_opt_level():
    import pandas as pd

    runs = pd.DataFrame({"run": ["apex.amp O1", "apex.amp O2", "apex.amp O3", "torch.amp fp32",
                                 "torch.amp autocast_fp16"],
                         "learned": [True, True, False, True, True],
                         "within_tolerance": [True, False, False, True, True]})
    speed = pd.DataFrame({"candidate": ["torch.amp autocast_fp16"], "vs": ["apex.amp O1"],
                          "label": ["faster 1.27x"]})
    overflow = pd.DataFrame([
        {"run": "apex.amp O1", "params_unchanged": True, "scale_halved": True,
         "next_step_updates": True},
        {"run": "apex.amp O2", "params_unchanged": False, "scale_halved": True,
         "next_step_updates": True}])
    options = {e["opt_level"]: dict(e["options"]) for e in legacy_amp.MIGRATION}
    options["O2"]["master_weights"] = False  # a mismatch
    levels = {lvl: {"options": o, "restored": lvl != "O3"} for lvl, o in options.items()}
    levels.pop("O0")  # O0 did not report
    replaced = {"O0": "torch.amp fp32", "O1": "torch.amp autocast_fp16",
                "O2": "torch.amp autocast_fp16"}
    table = legacy_amp.levels_table(runs, speed, overflow, levels, replaced)
    assert list(table.columns) == legacy_amp.LEVELS_COLUMNS
    by = table.set_index("opt_level")
    assert by["apex_options_match"].tolist() == [None, True, False, True]
    assert by["torch_restored"].tolist() == [None, True, True, False]
    assert by["legacy_trained"].tolist() == [None, True, False, False]
    assert by["recipe_trained"].tolist() == [True, True, True, None]
    assert by["recipe_vs_legacy"].isna().tolist() == [True, False, True, True]
    assert by.loc["O1", "recipe_vs_legacy"] == "faster 1.27x"
    assert by["overflow_skipped"].tolist() == [None, True, False, None]
    empty = legacy_amp.levels_table(runs.iloc[:0], speed.iloc[:0], pd.DataFrame(), {}, {})
    assert empty["opt_level"].tolist() == list(legacy_amp.OPT_LEVELS)


# ------------------------------------------------------------------ step times in rounds
def test_speed_table_opens_with_the_fastest_by_rounds_and_reads_fused_in_the_child():
    kernel = {"torch.amp fp32": [10.0, 10.2, 9.9], "torch.amp autocast_fp16": [3.4, 3.3, 3.5],
              "torch.amp autocast_bf16": [3.3, 3.6, 3.4]}
    child = {"apex.amp O1": [4.2, 4.4, 4.3], "apex.amp O1 fused": [3.8, 3.9, 3.85]}
    table = legacy_amp.speed_table(kernel, child, "torch.amp fp32",
                                   [("apex.amp O1 fused", "apex.amp O1"),
                                    ("torch.amp autocast_fp16", "apex.amp O1 fused")])
    best, _tied = verdicts.fastest_by_rounds({k: v for k, v in kernel.items()
                                              if k != "torch.amp fp32"})
    first = table.iloc[0]
    assert (first["candidate"], first["vs"]) == (best, "torch.amp fp32")  # the summary's pick
    fused = table.set_index("candidate").loc["apex.amp O1 fused"]
    assert fused["process"] == "child" and fused["label"].startswith("faster")
    across = table.iloc[-1]
    assert across["process"] == "across" and across["verdict"] == "faster"


def test_rounds_of_rotates_rebuilds_and_drops_a_failing_candidate():
    entered: list[str] = []

    def candidate(name, fail=False):
        @contextlib.contextmanager
        def fresh():
            entered.append(name)
            if fail:
                raise RuntimeError("no GPU for this one. More text.")
            yield lambda: None
        return fresh

    rounds, failed = legacy_amp.rounds_of({"a": candidate("a"), "b": candidate("b"),
                                           "c": candidate("c", fail=True)},
                                          rounds=3, repeats=2, device="cpu", warmup=0)
    assert set(rounds) == {"a", "b"} and all(len(v) == 3 for v in rounds.values())
    assert list(failed) == ["c"] and entered[:3] == ["a", "b", "c"]
    assert entered[3:5] == ["b", "a"]  # round 2 starts one place later; c is not rebuilt


def test_fused_kernel_check_reads_the_legacy_source_and_names_what_is_missing(tmp_path,
                                                                              monkeypatch):
    amp = tmp_path / "apex" / "amp"
    amp.mkdir(parents=True)
    (amp / "scaler.py").write_text("import amp_C\nA = amp_C.multi_tensor_scale\n"
                                   "B = amp_C.multi_tensor_axpby\nC = other.multi_tensor_x\n")
    assert legacy_amp.legacy_kernel_calls(tmp_path / "apex") == ["multi_tensor_axpby",
                                                                 "multi_tensor_scale"]
    monkeypatch.setitem(sys.modules, "amp_C", types.SimpleNamespace(multi_tensor_scale=None))
    check = legacy_amp.fused_kernel_check(tmp_path / "apex", "cpu")
    assert not check["ok"] and check["missing"] == ["multi_tensor_axpby"]
    monkeypatch.setitem(sys.modules, "amp_C", types.SimpleNamespace(
        multi_tensor_scale=None, multi_tensor_axpby=None))
    check = legacy_amp.fused_kernel_check(tmp_path / "apex", "cpu")
    assert not check["ok"] and not check["missing"] and "CUDA" in check["why"]


class _FakeAmpC:
    """The scaler kernels in PyTorch, with amp_C's calling convention (for the CPU)."""

    def __init__(self, skip_last: bool = False):
        self.skip_last = skip_last

    def multi_tensor_scale(self, _chunk, noop, lists, scale):
        for src, dst in zip(*lists, strict=True):
            if not torch.isfinite(src).all():
                noop.fill_(1)
            n = len(dst) - (1 if self.skip_last else 0)
            dst[:n] = src.float()[:n] * scale

    def multi_tensor_axpby(self, _chunk, noop, lists, a, b, _arg):
        for x, y, out in zip(*lists, strict=True):
            out.copy_(x.float() * a + y.float() * b)

    def multi_tensor_l2norm(self, _chunk, noop, lists, _per_tensor):
        return (torch.linalg.vector_norm(torch.cat(lists[0])),)


def test_the_kernel_check_passes_right_kernels_and_catches_an_unwritten_element():
    calls = ["multi_tensor_scale", "multi_tensor_axpby", "multi_tensor_l2norm"]
    good = legacy_amp._kernel_errors(_FakeAmpC(), torch.device("cpu"), calls)
    assert max(good.values()) <= 1e-6, good
    bad = legacy_amp._kernel_errors(_FakeAmpC(skip_last=True), torch.device("cpu"), calls)
    assert bad["multi_tensor_scale"] == float("inf")
