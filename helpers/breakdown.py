"""Where a training step's time goes: ``torch.profiler`` kernel time grouped by kind.

On CUDA the categories add up the self time of the GPU kernels (and copies) the step launched;
comparing their sum with the step's measured wall time separates kernel time from time the GPU
sat idle waiting for the CPU (Python, dispatch, launch overhead, synchronisation). On the CPU
the same categories add up the self time of the ATen operators, as the nearest equivalent.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from helpers.fusion import quiet_profiler

# Checked in order: the first pattern that matches a kernel (or operator) name decides.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("attention", r"flash|fmha|attention|sdpa"),
    ("norm", r"layer_?norm|LayerNorm|GammaBeta|cuComputeGradInput"),
    ("optimizer", r"adam|multi_tensor|foreach|LpNorm|clip_grad"),
    ("matmul", r"gemm|nvjet|xmma|cutlass|wgmma|cublas|splitK|aten::(mm|addmm|bmm|baddbmm)$"),
    ("elementwise", r"elementwise|triton_poi|aten::(add|add_|mul|mul_|div|sub|gelu|"
                    r"gelu_backward|copy_|fill_|zero_|_to_copy|masked_fill|where|neg)$"),
)
NAMES = tuple(name for name, _ in CATEGORIES) + ("other",)
_COMPILED = [(name, re.compile(pattern, re.IGNORECASE)) for name, pattern in CATEGORIES]


def categorize(name: str) -> str:
    """The category of one kernel or operator name (``other`` when nothing matches)."""
    for category, pattern in _COMPILED:
        if pattern.search(name):
            return category
    return "other"


def _self_device_us(event) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total", "device_time_total"):
        value = getattr(event, attr, None)
        if value:
            return float(value)
    return 0.0


def summarize(events, steps: int, on_cuda: bool) -> dict[str, float]:
    """Per-step milliseconds by category from ``prof.key_averages()``, plus totals."""
    totals = dict.fromkeys(NAMES, 0.0)
    launches = 0
    for event in events:
        if on_cuda:
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = _self_device_us(event)
            launches += event.count
        else:
            if event.device_type != torch.autograd.DeviceType.CPU or \
                    not event.key.startswith("aten::"):
                continue
            us = float(event.self_cpu_time_total)
        totals[categorize(event.key)] += us
    row = {f"{k}_ms": v / 1e3 / steps for k, v in totals.items()}
    row["kernel_ms"] = sum(totals.values()) / 1e3 / steps
    row["kernels_per_step"] = launches / steps if on_cuda else float("nan")
    return row


def profile_steps(step: Callable[[], None], steps: int, device: torch.device) -> dict[str, float]:
    """Run one untraced step, then trace ``steps`` more and return :func:`summarize`'s row."""
    on_cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    step()
    if on_cuda:
        torch.cuda.synchronize(device)
    with quiet_profiler(), profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if on_cuda:
            torch.cuda.synchronize(device)
        traced = time.perf_counter() - start
    row = summarize(prof.key_averages(), steps, on_cuda)
    row["traced_step_ms"] = traced * 1e3 / steps
    row["device"] = device.type
    return row
