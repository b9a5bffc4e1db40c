"""The one timing function of the course.

On CUDA every repeat is bracketed by its own pair of CUDA events, the device is synchronized
before the clock is read, warm-up runs are discarded, and an optional L2 flush (a write larger
than the L2 cache) runs before each repeat, outside the timed region. On the CPU the same loop
uses ``time.perf_counter``. Results are medians with the inter-quartile range.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from helpers import BENCH_METHOD_VERSION


@dataclass
class Timing:
    """Per-repeat samples of one measurement, in milliseconds, with their summary."""

    label: str
    samples_ms: list[float]
    device: str
    flushed_l2: bool = False
    meta: dict = field(default_factory=dict)

    def _quantile(self, q: float) -> float:
        data = sorted(self.samples_ms)
        if len(data) == 1:
            return data[0]
        pos = q * (len(data) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(data) - 1)
        return data[lo] + (data[hi] - data[lo]) * (pos - lo)

    @property
    def median_ms(self) -> float:
        """Median of the repeats."""
        return float(statistics.median(self.samples_ms))

    @property
    def q1_ms(self) -> float:
        """First quartile."""
        return self._quantile(0.25)

    @property
    def q3_ms(self) -> float:
        """Third quartile."""
        return self._quantile(0.75)

    @property
    def iqr_ms(self) -> float:
        """Inter-quartile range, the spread the course reports."""
        return self.q3_ms - self.q1_ms

    @property
    def min_ms(self) -> float:
        """Fastest repeat."""
        return min(self.samples_ms)

    def as_row(self) -> dict:
        """A flat dict for a pandas table."""
        return {
            "label": self.label,
            "median_ms": self.median_ms,
            "q1_ms": self.q1_ms,
            "q3_ms": self.q3_ms,
            "iqr_ms": self.iqr_ms,
            "min_ms": self.min_ms,
            "repeats": len(self.samples_ms),
            "device": self.device,
            "l2_flush": self.flushed_l2,
            "method": f"v{BENCH_METHOD_VERSION}",
            **self.meta,
        }

    def __str__(self) -> str:
        return (
            f"{self.label or 'timing'}: median {self.median_ms:.4g} ms "
            f"(IQR {self.q1_ms:.4g}-{self.q3_ms:.4g} ms, n={len(self.samples_ms)}, {self.device})"
        )


_flush_buffers: dict[int, torch.Tensor] = {}


def _l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer twice the L2 size (at least 64 MiB), allocated once per device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _flush_buffers:
        l2 = getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or 0
        nbytes = max(2 * int(l2), 64 * 2**20)
        _flush_buffers[index] = torch.empty(nbytes // 4, dtype=torch.int32, device=f"cuda:{index}")
    return _flush_buffers[index]


def flush_l2(device: torch.device | str | None = None) -> None:
    """Evict the L2 cache by writing a buffer larger than it (enqueued, not synchronized)."""
    dev = torch.device(device or "cuda")
    _l2_flush_buffer(dev).zero_()


def benchmark(
    fn: Callable[[], object],
    *,
    label: str = "",
    warmup: int = 5,
    repeats: int = 30,
    flush: bool | None = None,
    device: str | torch.device | None = None,
    setup: Callable[[], object] | None = None,
    meta: dict | None = None,
) -> Timing:
    """Time ``fn()`` and return a :class:`Timing` in milliseconds.

    ``device`` defaults to CUDA when available. ``flush`` (default: on for CUDA) evicts the L2
    cache before each repeat, outside the timed region. ``setup``, when given, runs before every
    call (also untimed), e.g. to reset gradients.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError("benchmark needs repeats >= 1 and warmup >= 0")
    dev = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu"
    )
    on_cuda = dev.type == "cuda"
    do_flush = on_cuda if flush is None else (flush and on_cuda)

    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    if on_cuda:
        torch.cuda.synchronize(dev)

    samples: list[float] = []
    if on_cuda:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for start, end in zip(starts, ends, strict=True):
            if setup is not None:
                setup()
            if do_flush:
                flush_l2(dev)
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(dev)
        samples = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    else:
        for _ in range(repeats):
            if setup is not None:
                setup()
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return Timing(label=label, samples_ms=samples, device=str(dev.type),
                  flushed_l2=do_flush, meta=dict(meta or {}))


class StepTimer:
    """Per-step times of a loop whose steps cannot be repeated (a training run changes the model
    at every step): CUDA events around each step on a GPU, ``perf_counter`` on the CPU. The
    device is synchronized once, when the samples are read."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._cpu: list[float] = []

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Time the body as one step."""
        if self.cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            yield
            end.record()
            self._pairs.append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._cpu.append((time.perf_counter() - t0) * 1e3)

    def samples_ms(self) -> list[float]:
        """All step times in milliseconds (synchronizes the GPU once)."""
        if self.cuda:
            torch.cuda.synchronize()
            return [s.elapsed_time(e) for s, e in self._pairs]
        return list(self._cpu)


def table(timings: Iterable[Timing], baseline: str | None = None):
    """A pandas table of timings; with ``baseline``, a ``speedup`` column relative to that label."""
    import pandas as pd

    df = pd.DataFrame([t.as_row() for t in timings])
    if baseline is not None and not df.empty:
        base = df.loc[df["label"] == baseline, "median_ms"]
        if base.empty:
            raise KeyError(f"baseline '{baseline}' is not among the labels {list(df['label'])}")
        df[f"speedup_vs_{baseline}"] = float(base.iloc[0]) / df["median_ms"]
    return df
