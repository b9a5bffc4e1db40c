"""Shared by the fused-kernel chapters (02 optimizers, 03 norms): verdict sentences built from
measured timings, kernel counts from ``torch.profiler``, and a one-sentence out-of-memory exit.

Verdicts are never written by hand: :func:`compare` chooses "faster", "slower" or "no clear
winner" from the medians and inter-quartile ranges it is given.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterator

import torch

from helpers import bench

# Below this relative difference two medians are called a tie, whatever their spreads.
TIE_FRACTION = 0.03


def is_tie(a_ms: float, b_ms: float, *, a_iqr: tuple[float, float] | None = None,
           b_iqr: tuple[float, float] | None = None, tie: float = TIE_FRACTION) -> bool:
    """True when two timings cannot be told apart: medians within ``tie`` or IQRs overlapping."""
    if a_ms <= 0 or b_ms <= 0:
        raise ValueError("timings must be positive")
    if abs(a_ms / b_ms - 1.0) < tie:
        return True
    if a_iqr is not None and b_iqr is not None:
        return a_iqr[0] <= b_iqr[1] and b_iqr[0] <= a_iqr[1]
    return False


def compare(a_name: str, a_ms: float, b_name: str, b_ms: float, *,
            a_iqr: tuple[float, float] | None = None, b_iqr: tuple[float, float] | None = None,
            tie: float = TIE_FRACTION) -> str:
    """One sentence comparing ``a`` with ``b`` from their medians (and IQRs, when given)."""
    if is_tie(a_ms, b_ms, a_iqr=a_iqr, b_iqr=b_iqr, tie=tie):
        why = "IQRs overlap" if abs(a_ms / b_ms - 1.0) >= tie else f"within {tie:.0%}"
        return (f"{a_name} ({a_ms:.3g} ms) and {b_name} ({b_ms:.3g} ms) are indistinguishable "
                f"on this run ({why})")
    if a_ms < b_ms:
        ratio, word = b_ms / a_ms, "faster"
    else:
        ratio, word = a_ms / b_ms, "slower"
    return f"{a_name} ({a_ms:.3g} ms) is {ratio:.2f}x {word} than {b_name} ({b_ms:.3g} ms)"


def compare_rows(df, a: str, b: str, *, key: str = "candidate") -> str:
    """:func:`compare` for two rows of a timing table (columns median_ms, q1_ms, q3_ms)."""
    ra = df.loc[df[key] == a].iloc[0]
    rb = df.loc[df[key] == b].iloc[0]
    return compare(a, float(ra.median_ms), b, float(rb.median_ms),
                   a_iqr=(float(ra.q1_ms), float(ra.q3_ms)),
                   b_iqr=(float(rb.q1_ms), float(rb.q3_ms)))


def fastest(df, *, key: str = "candidate", among: list[str] | None = None) -> str:
    """The name of the row with the lowest median (optionally among some names only)."""
    rows = df if among is None else df[df[key].isin(among)]
    if rows.empty:
        raise ValueError("no rows to choose from")
    return str(rows.loc[rows["median_ms"].idxmin(), key])


def tied_with_fastest(df, *, key: str = "candidate", among: list[str] | None = None) -> list[str]:
    """The rows that cannot be told apart from the fastest (:func:`is_tie`), fastest first.

    IQRs are used when the table has ``q1_ms``/``q3_ms`` columns, else medians alone.
    """
    rows = df if among is None else df[df[key].isin(among)]
    if rows.empty:
        raise ValueError("no rows to choose from")
    rows = rows.sort_values("median_ms")
    best = rows.iloc[0]
    has_iqr = {"q1_ms", "q3_ms"} <= set(rows.columns)

    def iqr(r):
        return (float(r.q1_ms), float(r.q3_ms)) if has_iqr else None

    return [str(r[key]) for _, r in rows.iterrows()
            if r[key] == best[key] or is_tie(float(best.median_ms), float(r.median_ms),
                                            a_iqr=iqr(best), b_iqr=iqr(r))]


def fastest_text(df, *, key: str = "candidate", among: list[str] | None = None) -> str:
    """'X' when one row is clearly fastest, else 'X (indistinguishable from Y, Z)'."""
    names = tied_with_fastest(df, key=key, among=among)
    if len(names) == 1:
        return names[0]
    return f"{names[0]} (indistinguishable from {', '.join(names[1:])})"


def sync(device: torch.device) -> None:
    """Wait for the GPU (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler's C++ start/stop log lines) inside the block."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def quiet_profiler() -> Iterator[None]:
    """:func:`quiet_stderr` plus torch's Python notice that the profiler clears its events per
    cycle, which says nothing about the code being profiled."""
    with warnings.catch_warnings(), quiet_stderr():
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        yield


def _is_top_level_op(event) -> bool:
    parent = event.cpu_parent
    return event.name.startswith("aten::") and (
        parent is None or not parent.name.startswith("aten::"))


def count_kernels(fn: Callable[[], object], device: torch.device | str, *,
                  calls: int = 1, match: tuple[str, ...] = ()) -> dict:
    """Profile ``calls`` calls of ``fn`` (after one untimed call) and count what ran per call.

    On CUDA: GPU kernels (memset/memcpy left out). On the CPU: outermost ``aten::`` operator
    calls (an op's internal sub-ops not counted again). ``what`` says which was counted.
    """
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    on_cuda = device.type == "cuda"
    fn()
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with quiet_profiler():
        with profile(activities=activities) as prof:
            for _ in range(calls):
                fn()
            sync(device)
    if on_cuda:
        names = [e.name for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA
                 and not getattr(e, "is_user_annotation", False)
                 and not e.name.startswith(("Memcpy", "Memset"))]
        what = "CUDA kernels"
    else:
        names = [e.name for e in prof.events() if _is_top_level_op(e)]
        what = "aten ops (CPU)"
    counts = Counter(names)
    result = {"per_call": len(names) / calls, "what": what, "distinct": len(counts)}
    if match:
        result["matching_per_call"] = sum(c for n, c in counts.items()
                                          if any(m in n for m in match)) / calls
    return {**result,
            "top": ", ".join(f"{short_name(n)} x{c / calls:g}" for n, c in counts.most_common(3))}


def short_name(name: str, width: int = 48) -> str:
    """A kernel or op name cut to ``width`` characters (return type, anonymous namespaces and
    template arguments dropped)."""
    name = name.replace("(anonymous namespace)::", "").removeprefix("void ")
    name = name.split("<")[0].split("(")[0].strip()
    return name if len(name) <= width else name[: width - 3] + "..."


_cycles_per_ms: dict[int, float] = {}


def hold_gpu(device: torch.device | str, ms: float = 2.0) -> Callable[[], None] | None:
    """A ``setup`` for :func:`helpers.bench.benchmark` that queues ``ms`` of GPU busy-wait before
    each timed call, so the host has launched the whole call before the GPU reaches it: the
    timing is then GPU time alone, as in a training step where the host runs ahead. None on the
    CPU, where there is nothing to overlap."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _cycles_per_ms:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(2):  # the second run, at working clocks, is the one kept
            start.record()
            torch.cuda._sleep(1_000_000)
            end.record()
            torch.cuda.synchronize(device)
        _cycles_per_ms[index] = 1_000_000 / start.elapsed_time(end)
    cycles = int(ms * _cycles_per_ms[index])
    return lambda: torch.cuda._sleep(cycles)


def gpu_time(fn: Callable[[], object], device: torch.device | str, *, warmup: int,
             repeats: int) -> tuple[bench.Timing, float]:
    """GPU time of ``fn`` and ``call_ms``, the median of back-to-back calls without a hold
    (host cost included: where the host is slower than the GPU, the GPU waits for it).

    The GPU time is measured behind :func:`hold_gpu`, sized to twice the third quartile of
    ``call_ms`` (at least 2 ms): a fixed hold shorter than the host's cost of one call would
    let launch gaps back into the timed window. On the CPU both are the same timing."""
    device = torch.device(device)
    calls = bench.benchmark(fn, warmup=warmup, repeats=repeats, device=device)
    if device.type != "cuda":
        return calls, calls.median_ms
    hold = hold_gpu(device, ms=max(2.0, 2 * calls.q3_ms))
    timing = bench.benchmark(fn, warmup=warmup, repeats=repeats, device=device, setup=hold)
    return timing, calls.median_ms


@contextlib.contextmanager
def oom_exit(what: str) -> Iterator[None]:
    """Turn a CUDA out-of-memory error inside the block into one clear sentence."""
    try:
        yield
    except torch.cuda.OutOfMemoryError:
        free, total = torch.cuda.mem_get_info() if torch.cuda.is_available() else (0, 0)
        raise SystemExit(
            f"Out of GPU memory while {what} ({free / 2**30:.1f} of {total / 2**30:.1f} GiB free): "
            "run with profile = 'smoke', or free the GPU (other processes, other notebooks)."
        ) from None
