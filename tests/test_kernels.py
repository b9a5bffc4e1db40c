"""Kernel counting and timing helpers shared by notebooks 02 and 03."""

import pytest
import torch

from helpers import bench, errors, kernels


def test_count_kernels_on_cpu_counts_outermost_ops():
    a = torch.randn(64)
    counts = kernels.count_kernels(lambda: (a + 1).mul_(2), "cpu", calls=2)
    assert counts["what"] == "aten ops (CPU)"
    assert counts["per_call"] == 2
    assert "matching_per_call" not in counts
    matched = kernels.count_kernels(lambda: a + 1, "cpu", match=("add",))
    assert matched["matching_per_call"] == 1


def test_short_name_drops_templates():
    assert kernels.short_name("void kernel<float, 4>(int)") == "kernel"
    assert kernels.short_name("void at::native::(anonymous namespace)::k<1>(int)") == (
        "at::native::k")
    assert len(kernels.short_name("x" * 100, width=10)) == 10


def test_gpu_time_on_the_cpu_is_one_timing_used_twice():
    calls = []
    timing, call_ms = bench.gpu_time(lambda: calls.append(1), "cpu", warmup=1, repeats=3)
    assert len(calls) == 4  # warm-up and repeats once: no second, held measurement on the CPU
    assert call_ms == timing.median_ms and len(timing.samples_ms) == 3


def test_oom_exit_turns_oom_into_one_sentence():
    with pytest.raises(errors.CourseError, match="Out of GPU memory while testing"):
        with errors.oom_exit("testing"):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
