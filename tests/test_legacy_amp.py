"""Notebook 04's chapter module and its legacy script cell, on the CPU (stand-in apex.amp)."""

import contextlib
import dataclasses
import sys
import types
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F

from helpers import errors
from helpers.chapters import legacy_amp

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "04_legacy_apex_amp_vs_torch_amp.ipynb"
CFG = legacy_amp.TrainConfig.smoke()


@pytest.fixture(scope="module")
def batches():
    return legacy_amp.make_batches(CFG, "cpu")


device = torch.device("cpu")  # the recipes the launch hands the script read `device`


def build_plain(cfg):
    model = legacy_amp.make_model(cfg, device)
    return model, torch.optim.Adam(model.parameters(), lr=cfg.lr), None


def build_scaled(cfg):
    return *build_plain(cfg)[:2], torch.amp.GradScaler("cpu")


def step_plain(model, optimizer, scaler, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    if scaler:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    return loss


@pytest.fixture()
def launch(tmp_path):
    """Notebook 04's script cell, run in a child on a plan with these legacy keys."""
    (cell,) = [c for c in nbformat.read(NOTEBOOK, as_version=4).cells
               if c.cell_type == "code" and c.source.startswith("%%writefile")]
    script = tmp_path / "04_legacy_amp.py"
    script.write_text(cell.source.split("\n", 1)[1] + "\n")
    recipes = legacy_amp.write_recipes(tmp_path / "04_recipes.py", {
        "fp32": (build_plain, step_plain), "scaled": (build_scaled, step_plain)})
    plan = {"config": dataclasses.asdict(CFG), "recipes": str(recipes), "check_recipe": "scaled",
            "timed_recipes": ["fp32", "scaled"], "device": "cpu"}
    return lambda legacy_dir=None, **legacy: legacy_amp.launch(
        script, plan | legacy, tmp_path / "out.json", legacy_dir=legacy_dir, timeout=300)


def test_seeds_draw_weights_and_inputs_of_one_task(batches):
    legacy_amp._BUILT.clear()
    first = legacy_amp.make_model(CFG)
    with torch.no_grad():
        first[0].weight.add_(1.0)  # training a copy must not change the next build
    assert not torch.equal(legacy_amp.make_model(CFG)[0].weight, first[0].weight)
    teacher = torch.randn(CFG.d_in, CFG.classes,
                          generator=torch.Generator().manual_seed(legacy_amp.TEACHER_SEED))
    other = legacy_amp.make_batches(dataclasses.replace(CFG, seed=1), "cpu")
    assert not torch.equal(other[0][0], batches[0][0])  # other inputs, the same teacher
    assert all(torch.equal(y, (x @ teacher).argmax(dim=1)) for x, y in [*batches, *other])


def test_rounds_of_rotates_rebuilds_and_drops_a_failing_candidate():
    entered: list[str] = []

    @contextlib.contextmanager
    def fresh(name):
        entered.append(name)
        if name == "c":
            raise RuntimeError("no GPU for this one. More text.")
        yield lambda: None

    rounds, failed = legacy_amp.rounds_of({n: lambda n=n: fresh(n) for n in "abc"}, rounds=3,
                                          repeats=2, device="cpu", warmup=0)
    assert set(rounds) == {"a", "b"} and all(len(v) == 3 for v in rounds.values())
    assert list(failed) == ["c"] and entered[:5] == ["a", "b", "c", "b", "a"]  # c not rebuilt


@pytest.mark.parametrize("honest", [True, False])
def test_forced_overflow_is_skipped_only_by_a_scaler_that_skips(batches, honest):
    model, optimizer, scaler = build_scaled(CFG)
    used = scaler if honest else None  # broken: steps on inf gradients and never halves
    out = legacy_amp.overflow_probe(lambda x, y: step_plain(model, optimizer, used, x, y),
                                    model, optimizer, scaler.get_scale, batches)
    assert out["inf_injected"] and out["next_step_updates"]
    assert out["params_unchanged"] is honest and out["scale_halved"] is honest
    with pytest.raises(ValueError, match="loss scaler"):
        legacy_amp.overflow_probe(step_plain, model, optimizer, None, batches)


def test_gradient_formats_see_underflow_and_what_scaling_fixes(batches, monkeypatch):
    huge = legacy_amp.gradient_representability(CFG, batches[0], "cpu", scales=(2.0**40,))
    assert huge[0]["overflow_pct"] > 50 and huge[1]["overflow_pct"] == 0  # fp16 max 65504

    class Tiny(torch.nn.Module):  # scales the logits down, and with them every gradient
        def forward(self, x):
            return x * 1e-6

    real = legacy_amp.make_model
    monkeypatch.setattr(legacy_amp, "make_model",
                        lambda cfg, device: torch.nn.Sequential(real(cfg, device), Tiny()))
    fp16, scaled, bf16, fp32 = legacy_amp.gradient_representability(CFG, batches[0], "cpu")
    assert (fp16["format"], scaled["loss_scale"]) == ("float16", 2.0**16)
    assert fp16["underflow_pct"] > 50 and scaled["underflow_pct"] < fp16["underflow_pct"] / 10
    assert bf16["underflow_pct"] == fp32["underflow_pct"] == 0


def test_the_notebooks_map_matches_the_legacy_frontend():  # a mismatch: test_reading_04
    # what the legacy Apex sets per opt level (apex/amp/frontend.py, last commit with apex.amp)
    keys = ("cast_model_type", "patch_torch_functions", "keep_batchnorm_fp32", "master_weights",
            "loss_scale")
    legacy = {level: dict(zip(keys, values, strict=True)) for level, values in {
        "O0": ("float32", False, None, False, 1.0), "O1": (None, True, None, None, "dynamic"),
        "O2": ("float16", False, True, True, "dynamic"),
        "O3": ("float16", False, False, False, 1.0)}.items()}
    namespace: dict = {}
    exec(next(c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells
              if c.id == "22eb5177"), namespace)
    rows = legacy_amp.options_check(legacy, namespace["level_options"])
    assert len(rows) == 20 and all(r["matches"] for r in rows), rows


def test_fused_kernel_check_names_what_is_missing(tmp_path, monkeypatch):
    amp = tmp_path / "apex" / "amp"
    amp.mkdir(parents=True)
    (amp / "scaler.py").write_text("import amp_C\nA = amp_C.multi_tensor_scale\n"
                                   "B = amp_C.multi_tensor_axpby\nC = other.multi_tensor_x\n")
    calls = ["multi_tensor_axpby", "multi_tensor_scale"]
    assert legacy_amp.legacy_kernel_calls(tmp_path / "apex") == calls
    monkeypatch.setitem(sys.modules, "amp_C", types.SimpleNamespace(multi_tensor_scale=None))
    check = legacy_amp.fused_kernel_check(tmp_path / "apex", "cpu")
    assert not check["ok"] and check["missing"] == ["multi_tensor_axpby"]
    monkeypatch.setitem(sys.modules, "amp_C", types.SimpleNamespace(**dict.fromkeys(calls)))
    check = legacy_amp.fused_kernel_check(tmp_path / "apex", "cpu")
    assert not check["ok"] and not check["missing"] and "CUDA" in check["why"]


def test_o3_eps_the_plan_and_recipes_without_source_are_refused_in_one_sentence(tmp_path):
    assert legacy_amp.check_eps([1e-4, "0.001"]) == (1e-4, 1e-3)
    for bad in (0, 2.0, (1e-3, -1.0), "x", None):
        with pytest.raises(errors.CourseError) as exc:
            legacy_amp.check_eps(bad)
        assert "o3_eps" in str(exc.value) and "\n" not in str(exc.value)
    for plan in ({"levels": ["O4"]}, {"overflow_levels": ["00"]}, {"fused_levels": ["O5"]},
                 {"o3_eps": [2.0]}):
        assert legacy_amp.plan_problem(plan)
    assert legacy_amp.plan_problem({"levels": ["O1"], "o3_eps": [1e-3]}) == ""
    build = eval("lambda cfg: None")  # no source to read back
    with pytest.raises(errors.CourseError, match="re-run section 4"):
        legacy_amp.write_recipes(tmp_path / "x.py", {"x": (build, step_plain)})


def test_launch_turns_a_crash_into_one_line(launch):
    payload = launch(levels=["O9"])
    assert payload["returncode"] == 2 and payload["runs"] == [] and "\n" not in payload["error"]
    assert payload["error"].startswith("the child process exited with 2; its last error: ")
    assert payload["error"].endswith("error: unknown opt level O9: use O0, O1, O2, O3")


# A CPU stand-in for the legacy package with the names the script touches.
FAKE_AMP = '''
import contextlib, os, types, torch
import torch.nn.functional as F
from . import amp as _amp_module

OPTIONS = {"O0": (torch.float32, False, 1.0), "O1": (None, True, "dynamic"),
           "O2": (torch.float16, False, "dynamic"), "O3": (torch.float16, False, 1.0)}
_amp_state = types.SimpleNamespace()

def initialize(model, optimizer, opt_level="O1", verbosity=1):
    with open(os.environ["FAKE_AMP_LOG"], "a") as log:  # the eps each optimizer came with
        log.write(f"{opt_level} {optimizer.param_groups[0]['eps']!r}\\n")
    cast, patch, scale = OPTIONS[opt_level]
    _amp_state.opt_properties = types.SimpleNamespace(options={
        "cast_model_type": cast, "patch_torch_functions": patch,
        "master_weights": opt_level == "O2", "loss_scale": scale})
    scaler = types.SimpleNamespace(dynamic=scale == "dynamic",
                                   value=2.0 ** 16 if scale == "dynamic" else scale)
    scaler.loss_scale = lambda: scaler.value
    _amp_state.loss_scalers = [scaler]
    if patch:
        original = F.linear
        F.linear = lambda x, w, b=None: original(x.half(), w.half(),
                                                 None if b is None else b.half())
        handle = types.SimpleNamespace(_all_wrappers=[(F, "linear", original)])
        _amp_state.handle = _amp_module._DECORATOR_HANDLE = handle
    return model, optimizer

@contextlib.contextmanager
def scale_loss(loss, optimizer):
    scaler = _amp_state.loss_scalers[0]
    yield loss.float() * scaler.value
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if scaler.dynamic and not all(bool(torch.isfinite(g).all()) for g in grads):
        scaler.value, step = scaler.value / 2, optimizer.step
        optimizer.step = lambda closure=None: setattr(optimizer, "step", step)  # skips one step
    else:
        for g in grads:
            g.div_(scaler.value)
'''


@pytest.fixture()
def fake_apex(tmp_path, monkeypatch):
    root = tmp_path / "legacy"
    for name, text in {"__init__.py": "", "amp/__init__.py": FAKE_AMP,
                       "amp/amp.py": "_DECORATOR_HANDLE = None\n",
                       "multi_tensor_apply/__init__.py": "multi_tensor_applier = "
                       "type('A', (), {'available': False})()\n"}.items():
        (root / "apex" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "apex" / name).write_text(text)
    monkeypatch.setenv("FAKE_AMP_LOG", str(tmp_path / "initialized.txt"))
    return root


@pytest.mark.slow
def test_script_cell_runs_levels_overflow_and_both_apis_in_the_same_rounds(
        launch, fake_apex, tmp_path, batches):
    payload = launch(fake_apex, levels=["O0", "O1", "O3"], o3_eps=[1e-3], overflow_levels=["O1"],
                     fused_levels=["O1"], timed_levels=["O1"])
    assert payload["error"] == "" and payload["import_error"] == "", payload
    runs = {r.label: r for r in legacy_amp.runs_of(payload)}
    assert list(runs) == ["torch.amp scaled (child)", "apex.amp O0", "apex.amp O1",
                          "apex.amp O3", "apex.amp O3 eps=0.001"]
    assert all(r.ok and len(r.losses) == CFG.steps for r in runs.values()), runs
    model, optimizer, scaler = build_scaled(CFG)  # the check recipe again, in this process
    here = [step_plain(model, optimizer, scaler, *batches[i % CFG.pool]).item()
            for i in range(CFG.steps)]
    torch.testing.assert_close(torch.tensor(runs["torch.amp scaled (child)"].losses),
                               torch.tensor(here), rtol=1e-3, atol=1e-4)
    assert runs["apex.amp O1"].extra["activation_dtype"] == "float16"  # O1's patch was active
    assert runs["apex.amp O0"].extra["activation_dtype"] == "float32"  # ... and undone after
    assert payload["levels"]["O1"]["restored"] is True
    assert set(payload["rounds"]) == {"torch.amp fp32", "torch.amp scaled", "apex.amp O1"}
    # the eps amp.initialize received: the default, then 1e-3; the probe; one per round + 1
    log = (tmp_path / "initialized.txt").read_text().split("\n")[:-1]
    assert log == ["O0 1e-08", "O1 1e-08", "O3 1e-08", "O3 0.001"] + ["O1 1e-08"] * (2 + CFG.rounds)
    (honest,) = payload["overflow"]
    assert honest["inf_injected"] and honest["scale_halved"] and honest["params_unchanged"]


def test_child_refuses_an_apex_from_elsewhere(launch, fake_apex, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(fake_apex))  # apex importable, but not the legacy dir
    payload = launch(tmp_path / "elsewhere", levels=["O1"], overflow_levels=["O2"],
                     timed_levels=["O1"])
    assert "not from the legacy install" in payload["import_error"], payload
    assert payload["error"] == "" and payload["overflow"][0]["error"] == payload["import_error"]
    assert legacy_amp.runs_of(payload)[-1].error == payload["import_error"]
    assert set(payload["rounds"]) == {"torch.amp fp32", "torch.amp scaled"}  # no apex.amp
