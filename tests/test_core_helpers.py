"""Unit tests of the foundation modules: profile, bench, roofline, results, envinfo, gpu."""

from __future__ import annotations

import json
import os
import time

import pandas as pd
import pytest
import torch

from helpers import bench, envinfo, gpu, progress, results, roofline
from helpers.profile import Profile, ProfileError, resolve

# ---------------------------------------------------------------- profile


def test_auto_profile_follows_cuda():
    assert resolve(cuda=True).name == "full"
    assert resolve(cuda=False).name == "smoke"
    assert resolve("auto", cuda=False).device == "cpu"


def test_env_var_and_explicit_parameter(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    assert resolve(cuda=True).name == "smoke"  # env beats auto
    assert resolve("full", cuda=True).name == "full"  # the parameters cell beats env
    assert resolve("auto", cuda=True).name == "smoke"  # 'auto' in the cell defers to env


def test_profile_errors_are_clear():
    with pytest.raises(ProfileError, match="unknown profile 'huge'"):
        resolve("huge", cuda=True)
    with pytest.raises(ProfileError, match="needs a CUDA GPU"):
        resolve("full", cuda=False)


def test_pick_and_progress_flags(monkeypatch):
    full = Profile("full", "cuda")
    smoke = Profile("smoke", "cpu")
    assert full.pick(smoke=1, full=2) == 2 and smoke.pick(smoke=1, full=2) == 1
    assert full.show_progress and not smoke.show_progress
    monkeypatch.setenv("COURSE_HEADLESS", "1")
    assert not resolve("full", cuda=True).show_progress
    assert progress.progress(range(3), profile=smoke).disable


# ---------------------------------------------------------------- bench


def test_timer_median_on_known_sleep():
    t = bench.benchmark(lambda: time.sleep(0.01), warmup=1, repeats=9, device="cpu")
    assert 9.5 <= t.median_ms <= 30.0, t
    assert t.q1_ms <= t.median_ms <= t.q3_ms
    assert t.device == "cpu" and not t.flushed_l2


def test_quantiles_on_known_samples():
    t = bench.Timing("x", [5.0, 1.0, 3.0, 2.0, 4.0], "cpu")
    assert t.median_ms == 3.0 and t.q1_ms == 2.0 and t.q3_ms == 4.0 and t.iqr_ms == 2.0
    assert t.min_ms == 1.0
    assert t.as_row()["repeats"] == 5


def test_setup_runs_untimed_before_every_call():
    calls = {"setup": 0, "fn": 0}
    bench.benchmark(lambda: calls.__setitem__("fn", calls["fn"] + 1), warmup=2, repeats=3,
                    device="cpu", setup=lambda: calls.__setitem__("setup", calls["setup"] + 1))
    assert calls == {"setup": 5, "fn": 5}


def test_benchmark_rejects_bad_arguments():
    with pytest.raises(ValueError):
        bench.benchmark(lambda: None, repeats=0, device="cpu")


def test_table_speedup_against_baseline():
    slow = bench.Timing("slow", [4.0, 4.0, 4.0], "cpu")
    fast = bench.Timing("fast", [1.0, 1.0, 1.0], "cpu")
    df = bench.table([slow, fast], baseline="slow")
    assert df.set_index("label").loc["fast", "speedup_vs_slow"] == pytest.approx(4.0)
    with pytest.raises(KeyError, match="baseline 'nope'"):
        bench.table([slow], baseline="nope")


# ---------------------------------------------------------------- roofline


def test_roofline_arithmetic():
    assert roofline.bandwidth_gbps(2e9, 1000.0) == pytest.approx(2.0)
    assert roofline.tflops(3e12, 1000.0) == pytest.approx(3.0)
    assert roofline.pct_of(50.0, 200.0) == pytest.approx(25.0)
    assert roofline.matmul_flops(2, 3, 4) == 48
    # 1 GB at 1000 GB/s = 1 ms; 1 TFLOP at 100 TFLOP/s = 10 ms: compute-bound, floor is 10 ms.
    assert roofline.floor_ms(1e9, 1e12, 1000.0, 100.0) == pytest.approx(10.0)
    assert roofline.floor_ms(1e10, 1e9, 1000.0, 100.0) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        roofline.bandwidth_gbps(1.0, 0.0)
    with pytest.raises(ValueError):
        roofline.pct_of(1.0, 0.0)


def test_tf32_context_restores_flag():
    before = torch.backends.cuda.matmul.allow_tf32
    with roofline.tf32(not before):
        assert torch.backends.cuda.matmul.allow_tf32 is (not before)
    assert torch.backends.cuda.matmul.allow_tf32 is before


def test_ceilings_measured_then_cached(monkeypatch):
    first = roofline.measure_ceilings("cpu")
    assert first["device"] == "cpu" and first["copy_gbps"] > 0
    assert first["matmul_tflops"]["fp32"] > 0
    assert roofline.cache_path(torch.device("cpu")).exists()

    def boom(*args, **kwargs):
        raise AssertionError("a cached ceiling must not be measured again")

    monkeypatch.setattr(roofline, "_measure_copy", boom)
    assert roofline.measure_ceilings("cpu") == first
    with pytest.raises(AssertionError):
        roofline.measure_ceilings("cpu", force=True)


# ---------------------------------------------------------------- results


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "table.csv"
    results.atomic_write_text(target, "old\n")

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        results.atomic_write_text(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["table.csv"]  # no temporary left behind


def test_atomic_write_gives_the_umask_mode_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        path = results.atomic_write_text(tmp_path / "a.json", "{}\n")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_save_table_writes_csv_and_json_with_env():
    df = pd.DataFrame({"candidate": ["a", "b"], "median_ms": [1.5, float("nan")]})
    path = results.save_table(df, "02_demo", env={"gpu_name": "X"})
    assert path.name == "02_demo.csv" and path.parent == results.results_dir()
    payload = json.loads(path.with_suffix(".json").read_text())
    assert payload["environment"] == {"gpu_name": "X"}
    assert payload["rows"][1]["median_ms"] is None  # NaN becomes null, valid JSON
    assert list(pd.read_csv(path)["candidate"]) == ["a", "b"]


def test_append_rows_accumulates():
    results.append_rows([{"k": 1}], "runs")
    df = results.append_rows([{"k": 2}, {"k": 3}], "runs")
    assert list(df["k"]) == [1, 2, 3]
    assert list(pd.read_csv(results.results_dir() / "runs.csv")["k"]) == [1, 2, 3]


def test_slug():
    assert results.slug("NVIDIA H200") == "nvidia-h200"
    assert results.slug("Tesla T4 (PCIe)") == "tesla-t4-pcie"


# ---------------------------------------------------------------- envinfo and gpu


def test_environment_report_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    report = envinfo.environment_report()
    assert report["cuda_available"] is False and report["gpu_name"] is None
    assert report["torch"] == torch.__version__
    assert report["bench_method"].startswith("v")
    text = envinfo.format_report(report)
    assert "CPU only" in text
    json.dumps(report)  # saved with every result, so it must serialize


def test_report_formats_a_python_only_apex():
    report = envinfo.environment_report()
    report.update(cuda_available=True, gpu_name="NVIDIA H200", gpu_capability="9.0",
                  gpu_memory_gib=139.8, gpu_sm_count=132, gpu_l2_mib=60.0, driver="580",
                  apex_importable=True, apex_commit=None,
                  apex_extensions={name: False for name in gpu.APEX_EXTENSIONS})
    text = envinfo.format_report(report)
    assert "sm_90" in text and "NONE (Python-only install)" in text


def test_needs_prints_one_line_and_returns_false(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.needs(cuda=True, apex=("amp_C",)) is False
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("Skipped:") and "CUDA GPU" in out


def test_needs_bf16_on_a_gpu_without_native_bf16(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    assert gpu.bf16_supported() is False
    assert gpu.needs(bf16=True) is False
    assert capsys.readouterr().out == (
        "Skipped: this cell needs a GPU with bf16 (compute capability 8.0+).\n")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert gpu.needs(bf16=True) is True
    assert capsys.readouterr().out == ""


def test_legacy_amp_on_cpu_asks_only_for_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.needs(legacy_amp=True) is False
    assert capsys.readouterr().out == "Skipped: this cell needs a CUDA GPU.\n"


def test_needs_names_missing_apex_extension(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu, "apex_extension_status", lambda: {"amp_C": False})
    monkeypatch.setattr(gpu, "apex_importable", lambda: True)
    assert gpu.needs(cuda=True, apex=("amp_C",)) is False
    out = capsys.readouterr().out
    assert "amp_C" in out and "build_apex.sh" in out


def test_legacy_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("APEX_WORKDIR", str(tmp_path))
    assert gpu.legacy_amp_dir() == tmp_path / "legacy-amp"
    assert gpu.apex_build_info() is None
    (tmp_path / "installed.json").write_text(json.dumps({"commit": "abc"}))
    assert gpu.apex_build_info() == {"commit": "abc"}


def test_step_timer_records_each_step_on_cpu():
    timer = bench.StepTimer(torch.device("cpu"))
    for delay in (0.0, 0.02):
        with timer.step():
            time.sleep(delay)
    first, second = timer.samples_ms()
    assert first < 5.0 and 19.0 <= second <= 60.0
