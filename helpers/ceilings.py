"""Ceilings: the device's measured limits, its datasheet peak, and the arithmetic that turns
(bytes, FLOPs, time) into "% of ceiling" and MFU.

Ceilings are measured, not copied from a datasheet: a large device-to-device copy (bytes read
plus bytes written) for memory bandwidth, and large square matrix products on random data for
FP32, TF32, BF16 and FP16. They are cached per device in the results folder, so notebook 01
measures them once and notebooks 02-05 reuse them.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from helpers import bench, machine
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


MIN_REPEATS = 5  # a cached ceiling measured with fewer repeats is measured again


def read_cache(path: Path) -> tuple[dict | None, str]:
    """The cached ceilings if they are whole and plausible, else (None, what is wrong)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({type(exc).__name__})"
    try:
        copy = float(data["copy_gbps"])
        rates = {k: float(v) for k, v in data["matmul_tflops"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return None, "incomplete (copy_gbps or matmul_tflops missing)"
    if copy <= 0 or not rates or min(rates.values()) <= 0:
        return None, "holds a zero or negative ceiling"
    peak = datasheet_peak(str(data.get("device", "")))
    if peak is not None and rates.get("bf16", 0) > 1.05 * peak[0]:
        return None, (f"bf16 ceiling {rates['bf16']:.0f} TFLOP/s is above the datasheet's "
                      f"{peak[0]:g}")
    if int(data.get("repeats", 0)) < MIN_REPEATS:
        return None, f"measured with fewer than {MIN_REPEATS} repeats (or by an older course)"
    return data, ""


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
        cached, problem = read_cache(path)
        if cached is not None and cached.get("torch") == torch.__version__:
            return cached
        if problem:
            print(f"{path}: {problem}; measuring the ceilings again.")
    small = dev.type == "cpu" if small is None else small
    copy_bytes = 64 * 2**20 if small else 2 * 2**30
    n = 512 if small else 8192
    repeats = 5 if small else 20
    rates = {"fp32": _measure_matmul(dev, n, torch.float32, False, repeats)}
    if dev.type == "cuda":
        rates["tf32"] = _measure_matmul(dev, n, torch.float32, True, repeats)
        if machine.bf16_supported():  # native bf16 only (sm_80+), not emulated
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
        "repeats": repeats,
        "matmul_data": "random normal",
    }
    save_json(path.stem, result, directory=path.parent)
    return result


# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, from NVIDIA datasheets. A key matches when
# its words appear as whole words, in order, in the device name ("L4" does not match "L40", nor
# "A10" "A10G", which is left out: it falls back to the measured ceiling); first match wins, so
# the longer keys of a family come first.
DATASHEET_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H200 NVL", 835.0),
    ("GH200", 989.0), ("H100", 989.0), ("H200", 989.0),
    ("A100", 312.0), ("L40S", 362.0), ("L40", 181.05), ("L4", 121.0), ("A10", 125.0),
)


def _words(name: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", name.lower())


def datasheet_match(key: str, device_name: str) -> bool:
    """True when the words of ``key`` appear, consecutive and whole, in ``device_name``."""
    k, n = _words(key), _words(device_name)
    return bool(k) and any(n[i:i + len(k)] == k for i in range(len(n) - len(k) + 1))


def datasheet_peak(device_name: str) -> tuple[float, str] | None:
    """The datasheet's dense bf16 peak of ``device_name`` in TFLOP/s and its key, or None."""
    for key, value in DATASHEET_BF16_TFLOPS:
        if datasheet_match(key, device_name):
            return value, key
    return None


def peak_tflops(device_name: str, ceilings: dict | None = None) -> tuple[float, str]:
    """The peak MFU is measured against, and where it came from: the datasheet's dense bf16
    figure, else the measured bf16 matmul ceiling, else (no bf16 units) the measured fp32 one."""
    found = datasheet_peak(device_name)
    if found is not None:
        return found[0], f"datasheet dense bf16 peak of the {found[1]}"
    rates = (ceilings or {}).get("matmul_tflops", {})
    if "bf16" in rates:
        return float(rates["bf16"]), "measured bf16 matmul ceiling (GPU not in the datasheet table)"
    if "fp32" in rates:
        return float(rates["fp32"]), "measured fp32 matmul ceiling (no bf16 tensor cores here)"
    raise ValueError(f"no peak known for '{device_name}' and no measured ceilings given")


# A measurement of the ceiling's own operation lands within this much of it: the ceiling is a
# median of a few repeats, and it moves between measurements (the bf16 matmul ceiling of one
# H200 read 787 and 781 TFLOP/s on two days, 0.8% apart; the same 8192^3 product timed later in
# notebook 01 read 0.2-0.3% above that day's ceiling). Up to this margin a share reads "at the
# ceiling"; above it the ceiling itself is wrong and the CHECK line says so.
AT_CEILING_PCT = 2.0
# What a reading says in place of a percentage of a ceiling that :func:`above_ceiling` flags.
NOT_SHOWN = "not shown: above 100%, so the ceiling check failed (see the CHECK line)"


def is_above(pct: float) -> bool:
    """True for a percentage of a ceiling that :func:`above_ceiling` flags: above 100% by more
    than a ceiling's own measurement moves (:data:`AT_CEILING_PCT`)."""
    return pct == pct and pct > 100.0 + AT_CEILING_PCT


def above_ceiling(percentages: dict[str, float], ceiling: str, device: torch.device | str) -> str:
    """'' when every percentage is at most 100 (plus :data:`AT_CEILING_PCT`); else one sentence
    naming those above the
    ``ceiling``, the likely cause and the fix (no figure above its ceiling stands as a fact:
    a table or summary shows :data:`NOT_SHOWN` in its place)."""
    above = {k: v for k, v in percentages.items() if is_above(v)}
    if not above:
        return ""
    names = ", ".join(f"{k} {v:.0f}%" for k, v in above.items())
    path = cache_path(torch.device(device))
    return (f"CHECK: {names} of the {ceiling} - above 100%, so the ceiling is too low, most "
            f"likely measured while the machine was busy: delete {path} (or run notebook 01, "
            "which measures it afresh) on an idle machine and run this notebook again.")


def mfu(flops_per_token: float, tokens_per_s: float, peak: float) -> float:
    """Model FLOPs utilisation: FLOPs the model needs per second over ``peak`` TFLOP/s."""
    return flops_per_token * tokens_per_s / (peak * 1e12)
