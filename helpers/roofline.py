"""The device's measured ceilings and the arithmetic that turns (bytes, FLOPs, time) into "% of
ceiling".

Ceilings are measured, not copied from a datasheet: a large device-to-device copy (bytes read
plus bytes written) for memory bandwidth, and large square matrix products on random data for
FP32, TF32, BF16 and FP16. They are cached per device in the results folder, so notebook 01
measures them once and notebooks 02-05 reuse them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from helpers import bench, gpu
from helpers.results import results_dir, save_json, slug


def bandwidth_gbps(nbytes: float, ms: float) -> float:
    """Achieved bandwidth in GB/s (1e9 bytes per second)."""
    if ms <= 0:
        raise ValueError("time must be positive")
    return nbytes / (ms * 1e-3) / 1e9


def tflops(flops: float, ms: float) -> float:
    """Achieved rate in TFLOP/s (1e12 floating-point operations per second)."""
    if ms <= 0:
        raise ValueError("time must be positive")
    return flops / (ms * 1e-3) / 1e12


def pct_of(value: float, ceiling: float) -> float:
    """``value`` as a percentage of ``ceiling``."""
    if ceiling <= 0:
        raise ValueError("ceiling must be positive")
    return 100.0 * value / ceiling


def floor_ms(nbytes: float, flops: float, gbps: float, peak_tflops: float) -> float:
    """The roofline floor: the larger of bytes/bandwidth and FLOPs/peak, in milliseconds."""
    return max(nbytes / (gbps * 1e9), flops / (peak_tflops * 1e12)) * 1e3


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m x k) @ (k x n) product: one multiply and one add per term."""
    return 2 * m * n * k


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """Temporarily allow or forbid TF32 in CUDA matrix products (restored on exit)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def device_name(device: torch.device) -> str:
    """The GPU's marketing name, or 'cpu'."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def cache_path(device: torch.device, directory: Path | None = None) -> Path:
    """``<results>/ceilings-<device-slug>.json``."""
    return (directory or results_dir()) / f"ceilings-{slug(device_name(device))}.json"


def _measure_copy(device: torch.device, nbytes: int, repeats: int) -> float:
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    t = bench.benchmark(lambda: dst.copy_(src), warmup=3, repeats=repeats, device=device,
                        flush=False)
    return bandwidth_gbps(2 * src.numel() * 4, t.median_ms)  # read + write


def _measure_matmul(device: torch.device, n: int, dtype: torch.dtype, allow_tf32: bool,
                    repeats: int) -> float:
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    out = torch.empty(n, n, device=device, dtype=dtype)
    with tf32(allow_tf32):
        t = bench.benchmark(lambda: torch.mm(a, b, out=out), warmup=3, repeats=repeats,
                            device=device, flush=False)
    return tflops(matmul_flops(n, n, n), t.median_ms)


def measure_ceilings(device: torch.device | str | None = None, *, force: bool = False,
                     directory: Path | None = None, small: bool | None = None) -> dict:
    """Measure (or load from cache) copy bandwidth and matmul rates for ``device``.

    ``small`` shrinks the problem sizes (default: small on the CPU) so the smoke profile takes
    about a second.
    """
    dev = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    path = cache_path(dev, directory)
    if path.exists() and not force:
        cached = json.loads(path.read_text())
        if cached.get("torch") == torch.__version__:
            return cached
    small = dev.type == "cpu" if small is None else small
    copy_bytes = 64 * 2**20 if small else 2 * 2**30
    n = 512 if small else 8192
    repeats = 5 if small else 20
    rates = {"fp32": _measure_matmul(dev, n, torch.float32, False, repeats)}
    if dev.type == "cuda":
        rates["tf32"] = _measure_matmul(dev, n, torch.float32, True, repeats)
        if gpu.bf16_supported():  # native bf16 only (sm_80+), not emulated
            rates["bf16"] = _measure_matmul(dev, n, torch.bfloat16, False, repeats)
        rates["fp16"] = _measure_matmul(dev, n, torch.float16, False, repeats)
    result = {
        "device": device_name(dev),
        "torch": torch.__version__,
        "copy_gbps": _measure_copy(dev, copy_bytes, repeats),
        "copy_bytes_counted": "bytes read + bytes written",
        "copy_size_bytes": copy_bytes,
        "matmul_tflops": rates,
        "matmul_n": n,
        "matmul_data": "random normal",
    }
    save_json(path.stem, result, directory=path.parent)
    return result
