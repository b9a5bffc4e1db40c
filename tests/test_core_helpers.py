"""Unit tests of the measuring core: profile, bench, ceilings, results, environment, machine."""

import json
import os
import time
from unittest.mock import Mock

import pandas as pd
import pytest
import torch

from helpers import bench, ceilings, environment, errors, machine, results, run_profile, settings
from helpers.run_profile import resolve


def test_profile_follows_cuda_then_env_then_the_cell(monkeypatch):
    assert resolve(cuda=True).name == "full" and resolve("auto", cuda=False).device == "cpu"
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    assert resolve(cuda=True).name == "smoke"  # env beats auto
    assert resolve("full", cuda=True).name == "full"  # the parameters cell beats env
    assert resolve("auto", cuda=True).name == "smoke"  # 'auto' in the cell defers to env
    assert resolve("SMOKE", cuda=False).name == "smoke"  # names are case-insensitive


@pytest.mark.parametrize("name, cuda, memory, said", [
    ("bogus", False, "", "unknown profile 'bogus'"),
    ("full", False, "", "needs a CUDA GPU"),
    ("smoke", True, "fifteen", "is not a positive number of GiB"),
    ("smoke", True, "0", "is not a positive number of GiB")])
def test_a_profile_that_cannot_run_stops_a_notebook_in_one_sentence(monkeypatch, name, cuda,
                                                                    memory, said):
    monkeypatch.setenv(settings.MEMORY_VAR, memory)
    with pytest.raises(errors.CourseError, match=said):  # a notebook shows its sentence alone
        resolve(name, cuda=cuda)


def test_benchmark_times_after_an_untimed_setup_and_timings_and_roofline_add_up():
    setups = []
    t = bench.benchmark(lambda: time.sleep(0.01), warmup=1, repeats=9, device="cpu",
                        setup=lambda: setups.append(1))
    assert 9.5 <= t.median_ms <= 60.0, t  # a busy CPU (another test worker) adds, never takes
    assert t.q1_ms <= t.median_ms <= t.q3_ms and not t.flushed_l2 and len(setups) == 10
    slow, fast = bench.Timing("slow", [4.0] * 3, "cpu"), bench.Timing("x", [5.0, 1, 3, 2, 4], "cpu")
    assert fast.median_ms == 3.0 and fast.q1_ms == 2.0 and fast.q3_ms == 4.0 and fast.iqr_ms == 2
    assert fast.min_ms == 1.0 and fast.as_row()["repeats"] == 5
    df = bench.table([slow, fast], baseline="slow")
    assert df.set_index("label").loc["x", "speedup_vs_slow"] == pytest.approx(4 / 3)
    with pytest.raises(KeyError, match="baseline 'nope'"):
        bench.table([slow], baseline="nope")
    assert (ceilings.bandwidth_gbps(2e9, 1e3), ceilings.tflops(3e12, 1e3), ceilings.pct_of(50, 200),
            ceilings.mfu(6e9, 1e3, 12.0)) == pytest.approx((2.0, 3.0, 25.0, 0.5))
    assert ceilings.matmul_flops(2, 3, 4) == 48
    assert ceilings.floor_ms(1e9, 1e12, 1e3, 1e2) == pytest.approx(10.0)
    assert ceilings.floor_ms(1e10, 1e9, 1e3, 1e2) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        ceilings.pct_of(1.0, 0.0)


@pytest.mark.parametrize("text, problem", [
    ('{"device": "cpu", "copy_gbps": 0, "matmul_tflops": {"fp32": 1.0}}', "zero or negative"),
    ('{"device": "NVIDIA H200", "copy_gbps": 4000, "matmul_tflops": {"bf16": 5000}}',
     "above the datasheet"),
    ('{"device": "cpu", "copy_gbps": 1, "matmul_tflops": {"fp32": 1}, "repeats": 1}', "fewer than"),
    ('{"device": "cpu", "matmul_tflops": {"fp32": 1.0}}', "incomplete")])
def test_a_bad_ceilings_cache_is_named(text, problem, tmp_path):
    (tmp_path / "c.json").write_text(text)
    data, why = ceilings.read_cache(tmp_path / "c.json")
    assert data is None and problem in why


def test_ceilings_bad_cache_measured_again_then_cached(monkeypatch, capsys):
    path = ceilings.cache_path(torch.device("cpu"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    first = ceilings.measure_ceilings("cpu")
    assert first["copy_gbps"] > 0 and first["matmul_tflops"]["fp32"] > 0
    assert f"{path}: unreadable" in capsys.readouterr().out
    assert ceilings.read_cache(path)[0] is not None
    monkeypatch.setattr(ceilings, "_measure_copy", Mock(side_effect=AssertionError("measured")))
    assert ceilings.measure_ceilings("cpu") == first
    with pytest.raises(AssertionError):
        ceilings.measure_ceilings("cpu", force=True)


def test_results_are_written_with_the_umask_mode_as_csv_and_json_and_rows_accumulate(tmp_path):
    old = os.umask(0o022)
    path = results.atomic_write_text(tmp_path / "a.json", "{}\n")
    assert os.umask(old) == 0o022 and path.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    df = pd.DataFrame({"candidate": ["a", "b"], "median_ms": [1.5, float("nan")]})
    path = results.save_table(df, "02_demo", env={"gpu_name": "X"})
    assert path.name == "02_demo.csv" and path.parent == results.results_dir()
    payload = json.loads(path.with_suffix(".json").read_text())
    assert payload["environment"] == {"gpu_name": "X"} and payload["rows"][1]["median_ms"] is None
    assert list(pd.read_csv(path)["candidate"]) == ["a", "b"]
    results.append_rows([{"k": 1}], "runs")
    assert list(results.append_rows([{"k": 2}, {"k": 3}], "runs")["k"]) == [1, 2, 3]
    assert list(pd.read_csv(results.results_dir() / "runs.csv")["k"]) == [1, 2, 3]


@pytest.mark.parametrize("cuda, capability, need, lacks", [
    (False, None, {"cuda": True, "apex": ("amp_C",)}, "a CUDA GPU"),
    (False, None, {"legacy_amp": True}, "a CUDA GPU"),
    (True, (7, 5), {"bf16": True}, "a GPU with bf16 (compute capability 8.0+)"),
    (True, (8, 0), {"bf16": True}, "")])
def test_needs_says_in_one_line_what_a_cell_lacks(monkeypatch, capsys, cuda, capability, need,
                                                  lacks):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    assert machine.needs(**need) is (not lacks)
    assert capsys.readouterr().out == (f"Skipped: this cell needs {lacks}.\n" if lacks else "")


def test_train_records_every_step_drops_the_warmup_and_round_trips_through_json():
    losses = [4.0, 3.0, 2.0, 1.5, 1.0, 0.8, 0.6, 0.5, 0.4, 0.3]
    seen = []

    def step(i):
        time.sleep(0.1 if i == 5 else 0.0)
        return torch.tensor(losses[i])

    run = bench.train(step, len(losses), device="cpu", warmup=3, label="toy",
                      after_step=lambda i, loss: seen.append(i))
    assert run.losses == pytest.approx(losses) and seen == list(range(10))
    assert len(run.step_ms) == 10 and len(run.timing.samples_ms) == 7
    assert run.step_ms[5] >= 99.0 and run.step_ms[6] < run.step_ms[5] - 50  # each step its own
    assert (run.initial_loss, run.final_loss) == pytest.approx((4.0, 0.3))
    assert run.learned and run.finite and run.ok and 0 <= run.first_step_s <= run.wall_s
    run.peak_mem_gib, run.extra = 0.25, {"loss_scales": [1.0], "param_dtype": "float16"}
    back = bench.Run.from_dict(json.loads(json.dumps(run.to_dict())))  # as saved and read back
    assert back == run and back.row()["param_dtype"] == "float16"
    with pytest.raises(ValueError, match="must exceed warmup"):
        bench.train(lambda i: torch.tensor(1.0), 3, device="cpu", warmup=3)


@pytest.mark.parametrize("losses, learned", [
    ([4.3, 8.4, 6.0, 5.0, 4.12], False),   # jumped and fell back: not 10% below step 0
    ([4.0, 4.0, float("nan"), 1.0, 0.5], False),  # not finite
    ([4.0, 4.1, 4.2, 4.3, 4.4], False)])  # rising
def test_learned_needs_a_real_drop(losses, learned):
    assert bench.Run("r", "cpu", losses=losses, step_ms=[1.0] * 5, warmup=1).learned is learned


def test_amp_dtype_and_bf16_line_follow_the_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU's mixed dtype: bf16
    report = environment.environment_report()
    text = environment.format_report(report)
    assert report["gpu_name"] is None and "CPU only" in text
    json.dumps(report)  # saved with every result, so it must serialize
    assert report["amp_dtype"] == "bfloat16" == str(machine.amp_dtype("auto")).split(".")[-1]
    header = {k.strip(): v for k, v in (line.split(" : ", 1) for line in text.splitlines())}
    assert "bf16: False" not in header["torch"] and header["bf16"].endswith(": bfloat16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    assert machine.amp_dtype("auto", "cuda") is torch.float16
    assert environment.bf16_here() == "not native on this GPU"
    with pytest.raises(errors.CourseError, match="compute capability 8.0"):
        machine.amp_dtype("bf16", "cuda")
    assert "GradScaler" in machine.amp_dtype_line(torch.float16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert machine.amp_dtype("auto", "cuda") is torch.bfloat16
    assert environment.bf16_here() == "native on this GPU"
    assert machine.amp_dtype("FP16", "cuda") is torch.float16
    assert "forced" in machine.amp_dtype_line(torch.float16, "fp16")
    with pytest.raises(errors.CourseError, match="not one of auto, bf16, fp16"):
        machine.amp_dtype("float8")
    assert machine.amp_dtype("auto", "cpu") is torch.bfloat16


def test_one_line_reads_the_innermost_cause_and_check_parameters_refuses_in_one_sentence():
    wrapped = RuntimeError("backend='inductor' raised:\nwrapped")
    wrapped.__cause__ = ValueError("the real problem\nwith details")
    assert errors.one_line(wrapped) == "ValueError: the real problem"
    assert errors.one_line(RuntimeError("x" * 300)).endswith("...")
    assert errors.one_line(RuntimeError("")) == "RuntimeError"
    errors.check_parameters({"steps": 10, "lr": 1, "batch": None, "eps": (1e-3,)}, {
        "steps": int, "lr": float, "batch": (int, type(None)), "eps": (tuple, float)})
    with pytest.raises(errors.CourseError) as info:
        errors.check_parameters({"o3_eps": "1e-3"}, {"o3_eps": (tuple, list, float)})
    assert "\n" not in str(info.value)
    assert "o3_eps = '1e-3' must be tuple or list or float" in str(info.value)
    with pytest.raises(errors.CourseError, match="steps = True must be int"):
        errors.check_parameters({"steps": True}, {"steps": int})  # a bool is not a count
    with pytest.raises(errors.CourseError, match="missing = None must be int"):
        errors.check_parameters({}, {"missing": int})


@pytest.mark.parametrize("error, expected", [
    ("CUDA error: no kernel image is available for execution on the device", "no kernels for"),
    ("CUDA driver initialization failed, you might not have a CUDA gpu.", "nvidia-smi"),
    ("CUDA error: an illegal memory access was encountered", "CUDA error (RuntimeError")])
def test_cuda_failures_become_one_sentence_with_the_fix(error, expected):
    sentence = errors.cuda_failure(RuntimeError(error))
    assert expected in sentence and "\n" not in sentence


def test_gpu_memory_cap_sets_the_fraction_the_usable_gib_and_the_profile_line(monkeypatch):
    set_to = {}
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda _d: Mock(total_memory=140 * 2**30))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda f, d=None: set_to.update(fraction=f))
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction",
                        lambda *_: set_to["fraction"], raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setenv(settings.MEMORY_VAR, "15")
    chosen = run_profile.resolve("smoke", cuda=True)
    assert set_to["fraction"] == pytest.approx(15 / 140)
    assert machine.usable_gpu_gib() == pytest.approx(15.0)  # what the full batch is sized for
    assert "GPU memory capped at 15.0 GiB of this GPU's 140.0 GiB" in chosen.describe()
    monkeypatch.setenv(settings.MEMORY_VAR, "500")  # more than the card: the whole card
    run_profile.cap_gpu_memory()
    assert set_to["fraction"] == 1.0
    monkeypatch.delenv(settings.MEMORY_VAR)
    assert run_profile.resolve("smoke", cuda=True).memory_cap == ""
