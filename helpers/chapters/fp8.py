"""Notebook 06's readings: what FP8 training needs and measures, but does not teach.

- torchao: :func:`torchao_problem` ('' or one sentence with the install command), with the
  import-time log lines that say nothing about this course quieted (:func:`quiet_torchao`);
- (what this machine can run - FP8 tensor cores, a working torchao - is the course's one check,
  ``machine.needs(fp8=True, lacking=fp8.torchao_lack())``);
- the formats (:func:`formats_table`), the scale amax / finfo.max (:func:`scale`) and the
  rounding error of a cast against float64 (:func:`cast`, :func:`rounding_table`);
- the width sweep: one Linear's forward + backward timed as GPU time with the host-included call
  time and the host's issue time beside it (:class:`HostClock`) and the launch-bound flag
  (:func:`time_case`, :func:`launch_bound`), its table with TFLOP/s, the ratio to bf16 and the
  MB the casts move (:func:`sweep_table`, :func:`cast_mb`), the widths where float8 is faster
  by the tie rule (:func:`faster_widths`) and the crossover width (:func:`crossover`);
- the sweep against the step: a model's converted Linear shapes (:func:`linear_shapes`), the
  step change the sweep predicts for them (:func:`predict_step`) set against the measured one
  (:func:`reconcile_row`), beside torchao's published figures (:data:`PUBLISHED`);
- torchao's auto filter read against the sweep (:func:`filter_table`); what a forward keeps for
  backward (:func:`saved_for_backward`) and one training step's memory attributed part by part
  so that the parts add up to its measured peak (:func:`step_memory`, :func:`memory_table`);
- the end-to-end table and the verdict table, computed from the run's tables
  (:func:`end_to_end_table`, :func:`verdict_rows`): step times by the tie rule of
  :mod:`helpers.verdicts` (``verdicts.label``'s words), each float8 run's validation loss read
  as "do two numerics learn the same?" - against the bf16 baseline's other seeds
  (``verdicts.yardstick(noise, "numerics")``), with the 2% target's verdict
  (``verdicts.target_verdict``: within / beyond / undecided).

Every function returns numbers and verdict words; the notebook's markdown reads them. Longer
than 400 lines because notebook 06 measures six things (the formats, the cast error, the width
sweep, the end-to-end runs, the sweep's prediction of them, and torchao's filter and memory),
each with its table; they share the torchao checks, the recipes and the sweep's table.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
import math
import re
import statistics
import time
import warnings
from collections.abc import Callable, Iterable

import pandas as pd
import torch
from torch import nn

from helpers import bench, errors, gpt, kernels, verdicts

TORCHAO_PIN = "0.18.0"
INSTALL = f"pip install torchao=={TORCHAO_PIN}"
VAL_LOSS_TOLERANCE = verdicts.LOSS_TOLERANCE  # the course's: validation losses within 2%
EPS = 1e-12  # torchao's floor on amax, so an all-zero tensor still gets a finite scale


# ------------------------------------------------------------------ torchao and this machine
class _Drop(logging.Filter):
    """Drops the log records whose message matches ``pattern``; lets every other one through."""

    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


# (logger, message): torchao's own C++/CUDA libraries that fail to load where they were not built
# for this machine (the float8 training recipes do not call them: they run on torch._scaled_mm),
# and torch's notice that torchao registers an Enum as a pytree constant.
NOISE = (("torchao", r"^Failed to load .*\.so"),
         ("torch.utils._pytree", r"KernelPreference'> is an Enum subclass"))


def quiet_torchao() -> None:
    """Silence exactly the import-time lines of :data:`NOISE` (logging records, dropped by a
    filter on the logger that emits them) and torchao's call of the deprecated
    ``torch.get_autocast_gpu_dtype`` (a DeprecationWarning); any other message still shows."""
    for name, pattern in NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and f.pattern.pattern == pattern for f in logger.filters):
            logger.addFilter(_Drop(pattern))
    warnings.filterwarnings("ignore", message=r"torch\.get_autocast_gpu_dtype\(\) is deprecated",
                            category=DeprecationWarning)
    # Python 3.12 compiling torchao's sources on first import (an install that skipped byte
    # compilation): a docstring's "\." escape, torchao's own and harmless
    for category in (SyntaxWarning, DeprecationWarning):  # SyntaxWarning from Python 3.12 on
        warnings.filterwarnings("ignore", message=r"invalid escape sequence", category=category,
                                module=r".*[/\\]torchao[/\\]")


def torchao_version() -> str | None:
    """The installed torchao's version, or None."""
    try:
        return importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return None


def torchao_lack() -> str:
    """'' when torchao works here, else the clause for ``machine.needs(lacking=...)``."""
    return f"torchao {TORCHAO_PIN} ({INSTALL})" if torchao_problem() else ""


def torchao_problem() -> str:
    """'' when torchao's float8 training API imports; else one sentence with the fix."""
    quiet_torchao()
    fix = f"{INSTALL}, then restart the kernel"
    try:
        version = importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return f"torchao is not installed, so the float8 cells are skipped: {fix}."
    try:
        module = importlib.import_module("torchao.float8")
        config = module.Float8LinearConfig
        module.convert_to_float8_training  # noqa: B018 - the attribute must exist
    except Exception as exc:
        return (f"torchao {version} does not work with torch {torch.__version__} "
                f"({errors.one_line(exc, 120)}), so the float8 cells are skipped: {fix}.")
    fields = {f.name for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) \
        else set()
    lacks = [what for what, ok in (
        ("Float8LinearConfig.from_recipe_name", hasattr(config, "from_recipe_name")),
        ("Float8LinearConfig(emulate=...)", "emulate" in fields)) if not ok]
    if lacks:
        return (f"torchao {version} lacks {' and '.join(lacks)}, which this notebook uses, so "
                f"the float8 cells are skipped: {fix}.")
    return ""


# ------------------------------------------------------------------ formats and rounding
def format_row(dtype: torch.dtype) -> dict:
    """One floating-point format from ``torch.finfo``: bits, range, precision, infinity."""
    fi = torch.finfo(dtype)
    mantissa = round(-math.log2(fi.eps))  # eps = 2^-mantissa bits
    subnormal = fi.smallest_normal * fi.eps  # the last mantissa bit of the smallest exponent
    inf = torch.tensor(float("inf")).to(dtype).float()
    return {"dtype": str(dtype).removeprefix("torch."), "bits": fi.bits,
            "exponent_bits": fi.bits - 1 - mantissa, "mantissa_bits": mantissa, "max": fi.max,
            "smallest_normal": fi.smallest_normal, "smallest_subnormal": subnormal,
            "unit_roundoff": fi.eps / 2, "decades": math.log10(fi.max / subnormal),
            "has_inf": bool(torch.isinf(inf))}


def formats_table(dtypes: list[torch.dtype]) -> pd.DataFrame:
    """:func:`format_row` for each dtype."""
    return pd.DataFrame([format_row(d) for d in dtypes])


def scale(x: torch.Tensor, dtype: torch.dtype, *, rowwise: bool = False,
          pow2: bool = False) -> torch.Tensor:
    """The scale amax / finfo(dtype).max in float64, for the whole tensor or (``rowwise``) for
    each row, the amax taken over the last dimension: ``x / scale`` puts the largest |value|
    on the format's largest finite number. ``pow2`` rounds it up to a power of two, as
    torchao's rowwise recipe does (torchao keeps the reciprocal, rounded down)."""
    a = x.detach().abs().double()
    amax = a.amax(dim=-1, keepdim=True) if rowwise else a.amax()
    s = amax.clamp(min=EPS) / torch.finfo(dtype).max
    return torch.exp2(torch.ceil(torch.log2(s))) if pow2 else s


def roundtrip(x: torch.Tensor, dtype: torch.dtype, s: torch.Tensor | None = None) -> torch.Tensor:
    """``x / s`` cast to ``dtype`` (saturating at its largest finite value, as torchao's casts
    do) and back, times ``s``, in float64; ``s`` None casts ``x`` as it is."""
    limit = torch.finfo(dtype).max
    scaled = x.detach().double() / (1.0 if s is None else s)
    return scaled.clamp(-limit, limit).to(dtype).double() * (1.0 if s is None else s)


SCALINGS = ("none", "tensorwise", "rowwise")


def cast(x: torch.Tensor, dtype: torch.dtype, scaling: str) -> torch.Tensor:
    """``x`` through ``dtype`` with no scale, one per tensor, or one per row - rowwise with
    power-of-two scales, as in torchao's recipes of the same names."""
    if scaling not in SCALINGS:
        raise ValueError(f"scaling {scaling!r} is not one of {SCALINGS}")
    if scaling == "none":
        return roundtrip(x, dtype)
    rowwise = scaling == "rowwise"
    return roundtrip(x, dtype, scale(x, dtype, rowwise=rowwise, pow2=rowwise))


def row_errors(x: torch.Tensor, approx: torch.Tensor) -> torch.Tensor:
    """Each row's relative error ||approx - x|| / ||x|| against ``x`` in float64 (NaN for a
    zero row)."""
    ref = x.detach().double().reshape(-1, x.shape[-1])
    err = (approx.double().reshape(ref.shape) - ref).norm(dim=1)
    norm = ref.norm(dim=1)
    return torch.where(norm > 0, err / norm.clamp(min=1e-300), torch.nan)


def rounding_errors(x: torch.Tensor, approx: torch.Tensor) -> dict:
    """Errors of ``approx`` against ``x`` in float64: the whole tensor's relative error, the
    median and the worst row's, and the percentage of non-zero values flushed to zero."""
    ref = x.detach().double()
    approx = approx.double().reshape(ref.shape)
    rows = row_errors(ref, approx)
    rows = rows[~rows.isnan()]
    nonzero = ref != 0
    return {"rel_err": float((approx - ref).norm() / ref.norm()),
            "median_row_rel_err": float(rows.median()), "worst_row_rel_err": float(rows.max()),
            "flushed_pct": float(100.0 * ((approx == 0) & nonzero).sum() / nonzero.sum())}


def rounding_table(tensors: dict[str, torch.Tensor],
                   cases: list[tuple[torch.dtype, str]]) -> pd.DataFrame:
    """One row per tensor and (dtype, scaling) case: :func:`rounding_errors` of :func:`cast`."""
    rows = []
    for name, x in tensors.items():
        for dtype, scaling in cases:
            rows.append({"tensor": name, "dtype": str(dtype).removeprefix("torch."),
                         "scaling": scaling, **rounding_errors(x, cast(x, dtype, scaling))})
    return pd.DataFrame(rows)


def outlier_sweep(x: torch.Tensor, factors: list[float], cases: list[tuple[torch.dtype, str]],
                  *, row: int) -> pd.DataFrame:
    """:func:`rounding_table` of ``x`` with its row ``row`` multiplied by each factor (one
    outlier token of growing size), a ``factor`` and a ``cast`` column added."""
    tables = []
    for factor in factors:
        grown = x.detach().clone()
        grown[row] *= factor
        table = rounding_table({"x": grown}, cases).drop(columns="tensor")
        tables.append(table.assign(factor=factor, cast=table["dtype"] + " " + table["scaling"]))
    return pd.concat(tables, ignore_index=True)


def breaking_factor(grown: pd.DataFrame, cast: str, limit: float) -> float | None:
    """The smallest factor of :func:`outlier_sweep` at which ``cast``'s median row error is
    above ``limit`` (None when it stays at or below it)."""
    rows = grown[(grown["cast"] == cast) & (grown["median_row_rel_err"] > limit)]
    return float(rows["factor"].min()) if len(rows) else None


# A product through FP8 must round at least this many times as coarsely as the same product
# with bf16 operands: FP8's unit roundoff is 16 (e4m3) or 32 (e5m2) times bf16's, so an error
# within a few percent of bf16's says the product did not go through FP8.
FP8_OVER_BF16 = 2.0


def product_ok(err: float, floor: float, tolerance: float, *, through_fp8: bool) -> bool:
    """Whether a float8 Linear's product error is where it belongs: through FP8, strictly above
    :data:`FP8_OVER_BF16` x ``floor`` (the bf16 copy's error) and strictly below ``tolerance``
    (one FP8 rounding); with both operands in high precision, no worse than ``floor``."""
    if not all(math.isfinite(v) for v in (err, floor, tolerance)):
        return False
    if through_fp8:
        return FP8_OVER_BF16 * floor < err < tolerance
    return err <= floor


def capture(linear: nn.Module, run: Callable[[], torch.Tensor]) -> dict[str, torch.Tensor]:
    """The input entering ``linear`` and the gradient arriving at its output while ``run()``
    computes a loss and it is backpropagated, each as a (rows, features) float32 copy."""
    seen: dict[str, torch.Tensor] = {}

    def keep(name: str, t: torch.Tensor) -> None:
        seen[name] = t.detach().reshape(-1, t.shape[-1]).float().clone()

    def before(module, args):
        keep("activation", args[0])

    def after(module, args, out):
        out.register_hook(lambda grad: keep("gradient", grad))

    handles = [linear.register_forward_pre_hook(before), linear.register_forward_hook(after)]
    try:
        run().backward()
    finally:
        for handle in handles:
            handle.remove()
    return seen


def spread(x: torch.Tensor) -> dict:
    """How the magnitudes of a (rows, features) tensor spread: its amax, the decades between
    the 99.9th and the 0.1th percentile of the non-zero |values|, and the largest row amax
    over the median row's (with the row it is in)."""
    a = x.detach().abs().double()
    values = a[a > 0].flatten()
    values = values[:: 1 + values.numel() // 2**24]  # torch.quantile takes at most 2^24 values
    low, high = torch.quantile(values, torch.tensor([0.001, 0.999], dtype=torch.float64,
                                                    device=values.device)).tolist()
    rows = a.reshape(-1, a.shape[-1]).amax(dim=1)
    return {"amax": float(a.max()), "decades": math.log10(high / low),
            "row_amax_ratio": float(rows.max() / rows.median()), "largest_row": int(rows.argmax())}


def rel_error(a: torch.Tensor, reference: torch.Tensor) -> float:
    """||a - reference|| / ||reference||, in float64."""
    ref = reference.detach().double()
    return float((a.detach().double() - ref).norm() / ref.norm())


# ------------------------------------------------------------------ the width sweep
def launch_bound(issue_ms: float, timing: bench.Timing) -> bool:
    """True when the host takes clearly longer to issue one call (``issue_ms``: its own clock
    around the call, the GPU held busy so nothing waits for it) than the GPU takes to run it:
    by more than :data:`helpers.verdicts.HOST_MARGIN` of the GPU time's third quartile
    (:func:`helpers.verdicts.host_bound`). Then back-to-back calls leave the GPU waiting for the
    host. The host's pace moves between runs, so an issue time near the GPU time is read as
    neither. On the CPU the host does the work itself (issuing is running): never
    launch-bound."""
    if timing.device != "cuda" or not (math.isfinite(issue_ms) and timing.median_ms > 0):
        return False
    return verdicts.host_bound(issue_ms, timing.median_ms, timing.q3_ms)


class HostClock:
    """Wraps a call and keeps the host's time of each call in ms (``perf_counter`` around it,
    nothing synchronized): behind :func:`helpers.bench.hold_gpu` the GPU is busy with the hold
    while the call is issued, so this is the host's cost of issuing it, without waiting."""

    def __init__(self, fn: Callable[[], object]):
        self.fn, self.samples_ms = fn, []

    def __call__(self) -> None:
        start = time.perf_counter()
        self.fn()
        self.samples_ms.append((time.perf_counter() - start) * 1e3)

    def median_of_last(self, n: int) -> float:
        """Median of the last ``n`` calls (NaN when there were none)."""
        last = self.samples_ms[-n:] if n > 0 else []
        return float(statistics.median(last)) if last else math.nan


def cast_mb(tokens: int, in_features: int, out_features: int, recipe: str) -> float:
    """MB a recipe's casts must move at least, counted (not measured): the input (tokens x in),
    the weight (in x out) and the output gradient (tokens x out) each read once in bf16 (2
    bytes) and written once in FP8 (1 byte); rowwise casts each twice, with a scale along each
    axis (one per product it enters); bf16 casts nothing."""
    if recipe == "bf16":
        return 0.0
    elements = tokens * in_features + in_features * out_features + tokens * out_features
    return (2 if recipe.startswith("rowwise") else 1) * 3 * elements / 1e6


def time_case(linear: nn.Module, in_features: int, out_features: int, tokens: int, *,
              device: torch.device, dtype: torch.dtype = torch.bfloat16, warmup: int = 3,
              repeats: int = 20, count: bool = False, seed: int = 0) -> dict:
    """Forward + backward of ``linear`` on a fixed random (tokens x in_features) input that
    requires grad, so all three matrix products run (output, grad_input, grad_weight); the
    gradients are cleared before each call, untimed. Timed with :func:`helpers.bench.gpu_time`:
    the median and IQR are GPU time (the host's launches kept out of the window), ``call_ms``
    the median of back-to-back calls, host included; ``issue_ms`` the host's own time to issue
    one call (:class:`HostClock` around the last ``repeats`` calls, those ``gpu_time`` makes
    behind its GPU hold; on the CPU, its only timed calls: the whole call), and
    ``launch_bound`` whether issuing clearly takes longer than the GPU work
    (:func:`launch_bound`). The first call (compilation, if any) is timed apart on the host's
    clock (``first_s``); ``count`` adds the kernels of one call."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, in_features, device=device, dtype=dtype, generator=gen)
    x.requires_grad_(True)
    grad = torch.randn(tokens, out_features, device=device, dtype=dtype, generator=gen)
    params = list(linear.parameters())

    def reset() -> None:
        x.grad = None
        for p in params:
            p.grad = None

    def call() -> None:
        linear(x).backward(grad)

    first_s = bench.wall_s(lambda: (reset(), call()), device)
    clock = HostClock(call)
    timing, call_ms = bench.gpu_time(clock, device, warmup=warmup, repeats=repeats, setup=reset)
    issue_ms = clock.median_of_last(repeats)
    result = {"median_ms": timing.median_ms, "q1_ms": timing.q1_ms, "q3_ms": timing.q3_ms,
              "iqr_ms": timing.iqr_ms, "call_ms": call_ms, "issue_ms": issue_ms,
              "launch_bound": launch_bound(issue_ms, timing), "first_s": first_s,
              "compile_s": max(0.0, first_s - timing.median_ms / 1e3)}
    if count:
        counted = kernels.count_kernels(lambda: (reset(), call()), device)
        result.update(kernels=counted["per_call"], counted=counted["what"])
    return result


SWEEP_COLUMNS = ["shape", "kind", "tokens", "in_features", "out_features", "recipe", "median_ms",
                 "q1_ms", "q3_ms", "iqr_ms", "compile_s"]


def sweep_table(rows: list[dict]) -> pd.DataFrame:
    """The sweep's rows (shape, kind, tokens, in_features, out_features, recipe, median_ms,
    q1_ms, q3_ms, iqr_ms, compile_s) with the FLOPs counted - 6 x tokens x in x out for one
    forward + backward: three matrix products of 2 x M x K x N each - TFLOP/s, and the ratio to
    bf16 at the same shape (bf16's median time over this one's: above 1 is faster)."""
    df = pd.DataFrame(rows, columns=None if rows else SWEEP_COLUMNS)
    df["flops"] = 6.0 * df["tokens"] * df["in_features"] * df["out_features"]
    df["tflops"] = df["flops"] / (df["median_ms"] * 1e-3) / 1e12
    base = df[df["recipe"] == "bf16"].set_index("shape")["median_ms"]
    df["ratio_vs_bf16"] = df["shape"].map(base) / df["median_ms"]
    df["extra_ms_vs_bf16"] = df["median_ms"] - df["shape"].map(base)
    df["cast_mb"] = [cast_mb(int(t), int(k), int(n), str(r)) for t, k, n, r in
                     zip(df["tokens"], df["in_features"], df["out_features"], df["recipe"],
                         strict=True)]
    return df


def _faster(row: pd.Series, base: pd.Series) -> bool:
    """True when ``row`` is faster than ``base`` and the tie rule tells them apart."""
    if not (row["median_ms"] > 0 and base["median_ms"] > 0):
        return False
    tie = verdicts.is_tie(float(row["median_ms"]), float(base["median_ms"]),
                          a_iqr=(float(row["q1_ms"]), float(row["q3_ms"])),
                          b_iqr=(float(base["q1_ms"]), float(base["q3_ms"])))
    return bool(row["median_ms"] < base["median_ms"]) and not tie


def faster_widths(sweep: pd.DataFrame, recipe: str) -> dict[int, bool]:
    """For each square width where both ``recipe`` and bf16 were measured: is ``recipe`` faster
    than bf16 there (tie rule)? A width not measured for the recipe is left out, never read
    as 'not faster'."""
    square = sweep[sweep["kind"] == "square"].set_index(["in_features", "recipe"])
    result = {}
    for width in sorted(sweep.loc[sweep["kind"] == "square", "in_features"].unique()):
        if all((width, r) in square.index for r in (recipe, "bf16")):
            result[int(width)] = _faster(square.loc[(width, recipe)], square.loc[(width, "bf16")])
    return result


def crossover(sweep: pd.DataFrame, recipe: str) -> int | None:
    """The smallest square width from which ``recipe`` is faster than bf16 at it and at every
    larger width measured; None when it is not faster at the largest one."""
    found = None
    for width, faster in sorted(faster_widths(sweep, recipe).items(), reverse=True):
        if not faster:
            break
        found = width
    return found


def linear_shapes(model: nn.Module, module_filter_fn: Callable[[nn.Module, str], bool]
                  | None = None) -> dict[tuple[int, int], int]:
    """(in_features, out_features) -> how many of the model's Linears have that shape, of those
    ``module_filter_fn(module, fqn)`` accepts (all of them without one)."""
    counts: dict[tuple[int, int], int] = {}
    for fqn, module in model.named_modules():
        if isinstance(module, nn.Linear) and (module_filter_fn is None
                                              or module_filter_fn(module, fqn)):
            key = (module.in_features, module.out_features)
            counts[key] = counts.get(key, 0) + 1
    return counts


def predict_step(sweep: pd.DataFrame, shapes: dict[tuple[int, int], int], recipe: str, *,
                 tokens: int) -> dict:
    """The change in step time the sweep predicts when a model's Linears of ``shapes`` (count
    each) go from bf16 to ``recipe``: the sum of count x (recipe's GPU time - bf16's) at each
    shape and ``tokens``, with a range from the quartiles (the recipe's first minus bf16's
    third, and the other way round); NaN, with ``missing`` naming a shape, when one was not
    swept."""
    rows = sweep[sweep["tokens"] == tokens].set_index(["in_features", "out_features", "recipe"])
    total = {"predicted_delta_ms": 0.0, "predicted_low_ms": 0.0, "predicted_high_ms": 0.0,
             "predicted_bf16_linears_ms": 0.0, "linears": sum(shapes.values()), "missing": ""}
    for (k, n), count in shapes.items():
        if (k, n, recipe) not in rows.index or (k, n, "bf16") not in rows.index:
            nan = dict.fromkeys(("predicted_delta_ms", "predicted_low_ms", "predicted_high_ms",
                                 "predicted_bf16_linears_ms"), math.nan)
            return {**total, **nan, "missing": f"{k}x{n}"}
        a, b = rows.loc[(k, n, recipe)], rows.loc[(k, n, "bf16")]
        total["predicted_delta_ms"] += count * (a["median_ms"] - b["median_ms"])
        total["predicted_low_ms"] += count * (a["q1_ms"] - b["q3_ms"])
        total["predicted_high_ms"] += count * (a["q3_ms"] - b["q1_ms"])
        total["predicted_bf16_linears_ms"] += count * b["median_ms"]
    return total


# torchao's published end-to-end figures (not measured here): torchtitan, Llama3-8B, 8 H100s,
# batch 1 x 8192, torch.compile, FSDP2, per-op SAC; the speedup of median tokens/s over bf16.
PUBLISHED = {"tensorwise": 1.2503, "rowwise": 1.1005}
PUBLISHED_SOURCE = ("torchao's published figure (H100: torchtitan Llama3-8B on 8 GPUs, "
                    "torchao's float8 README, github.com/pytorch/ao)")


def reconcile_row(model: str, recipe: str, e2e: pd.DataFrame, predicted: dict,
                  baseline: str = "bf16") -> dict:
    """One row of the sweep-against-step table: the measured step times of ``baseline`` and
    ``recipe`` in ``e2e`` (an :func:`end_to_end_table`), their difference with a range from the
    quartiles, the sweep's predicted difference and range (:func:`predict_step`), the
    predicted speedup (baseline's measured step over it plus the predicted difference) beside
    the measured one, and whether the two ranges overlap."""
    ran = e2e[e2e["status"] == "ran"].set_index("recipe") if len(e2e) else e2e
    row = {"model": model, "recipe": recipe, **predicted}
    if baseline not in getattr(ran, "index", []) or recipe not in ran.index:
        return {**row, "reading": "not measured"}
    a, b = ran.loc[recipe], ran.loc[baseline]
    low, high = a["step_ms_q1"] - b["step_ms_q3"], a["step_ms_q3"] - b["step_ms_q1"]
    delta = a["step_ms"] - b["step_ms"]
    pred = predicted["predicted_delta_ms"]
    row.update(bf16_step_ms=b["step_ms"], float8_step_ms=a["step_ms"], measured_delta_ms=delta,
               measured_low_ms=low, measured_high_ms=high,
               measured_speedup=b["step_ms"] / a["step_ms"],
               predicted_speedup=b["step_ms"] / (b["step_ms"] + pred),
               published_speedup=PUBLISHED.get(recipe, math.nan))
    if not math.isfinite(pred):
        reading = "no prediction"  # the sweep did not time ``missing``
    elif predicted["predicted_low_ms"] <= high and low <= predicted["predicted_high_ms"]:
        reading = "overlap"
    else:
        reading = "predicted above" if pred > delta else "predicted below"
    return {**row, "prediction_gap_ms": pred - delta, "reading": reading}


# ------------------------------------------------------------------ torchao's auto filter
def filter_table(models: dict[str, nn.Module], filters: dict[str, Callable[[nn.Module, str], bool]],
                 sweep: pd.DataFrame) -> pd.DataFrame:
    """One row per model, Linear (blocks numbered as ``blocks.*``), shape and recipe: whether
    ``filters[recipe]`` (e.g. torchao's ``_auto_filter_for_recipe``) converts it, the sweep's
    ratio to bf16 at that shape, whether the sweep found float8 faster there (tie rule), and
    whether the filter's choice agrees with the sweep (empty where the shape was not swept)."""
    keyed = (sweep.set_index(["in_features", "out_features", "recipe"]) if len(sweep)
             else pd.DataFrame())
    rows = []
    for model_name, model in models.items():
        families: dict[str, tuple[str, nn.Module, int]] = {}  # family: (first fqn, module, count)
        for fqn, module in model.named_modules():
            if isinstance(module, nn.Linear):
                family = re.sub(r"^blocks\.\d+\.", "blocks.*.", fqn)
                first, kept, count = families.get(family, (fqn, module, 0))
                families[family] = (first, kept, count + 1)
        for family, (fqn, module, count) in families.items():
            k, n = module.in_features, module.out_features
            for recipe, accept in filters.items():
                converts = bool(accept(module, fqn))
                ratio, faster = math.nan, None
                if (k, n, recipe) in keyed.index and (k, n, "bf16") in keyed.index:
                    ratio = float(keyed.loc[(k, n, recipe), "ratio_vs_bf16"])
                    faster = _faster(keyed.loc[(k, n, recipe)], keyed.loc[(k, n, "bf16")])
                rows.append({"model": model_name, "linear": family, "in x out": f"{k} x {n}",
                             "count": count, "recipe": recipe, "auto_filter_converts": converts,
                             "sweep_ratio_vs_bf16": ratio, "sweep_faster": faster,
                             "agrees": None if faster is None else converts == faster})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ what is saved for backward
def _storages(t: torch.Tensor):
    """(storage address, bytes, dtype) of a tensor, or of a tensor subclass's inner tensors."""
    if type(t) not in (torch.Tensor, nn.Parameter) and hasattr(type(t), "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        for name in names:
            yield from _storages(getattr(t, name))
        return
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # a tensor without a storage: its own bytes
        yield id(t), t.numel() * t.element_size(), t.dtype
        return
    yield storage.data_ptr(), storage.nbytes(), t.dtype


def saved_for_backward(run: Callable[[], torch.Tensor],
                       params: Iterable[torch.Tensor]) -> pd.DataFrame:
    """What autograd keeps for backward while ``run()`` runs its forward (counted with
    ``torch.autograd.graph.saved_tensors_hooks``, each storage once): MiB by dtype, and whether
    the storage is one of ``params`` (a parameter kept by reference: no new memory) or new
    memory (an activation or a copy). The graph is then freed (no backward)."""
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, tuple[int, torch.dtype]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        for ptr, nbytes, dtype in _storages(t):
            seen.setdefault(ptr, (nbytes, dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    del out
    rows: dict[tuple[str, str], float] = {}
    for ptr, (nbytes, dtype) in seen.items():
        key = (str(dtype).removeprefix("torch."),
               "parameter (no new memory)" if ptr in param_ptrs else "new memory")
        rows[key] = rows.get(key, 0.0) + nbytes / 2**20
    return pd.DataFrame([{"dtype": d, "kind": k, "mib": v} for (d, k), v in sorted(rows.items())],
                        columns=["dtype", "kind", "mib"])


def _bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a tensor subclass's inner ones)."""
    seen: dict[int, int] = {}
    for t in tensors:
        for ptr, nbytes, _ in _storages(t):
            seen.setdefault(ptr, nbytes)
    return sum(seen.values())


STEP_MEMORY = ("parameters", "optimizer states", "other allocated before the step",
               "saved for backward", "gradients", "residual (peak minus the rows above)")


def step_memory(forward: Callable[[], torch.Tensor], update: Callable[[], object],
                model: nn.Module, optimizer: torch.optim.Optimizer,
                device: torch.device | str) -> dict[str, float]:
    """GiB of one training step, attributed by measurement so that the parts add up to its
    peak (:data:`STEP_MEMORY`): the parameters and the optimizer's states (counted, each
    storage once), the rest allocated before the step (batches on the GPU, caches), what the
    forward ``forward()`` leaves allocated for backward (the growth of
    ``torch.cuda.memory_allocated``: what the whole model, compiled or not, saves), the
    gradients after ``loss.backward()`` (counted), and the residual: the step's peak
    (``max_memory_allocated`` over forward, backward and ``update()``) minus all of those -
    backward's temporaries, casts, workspace. ``peak`` is that measured peak, ``reserved`` what
    the allocator holds beyond it (its cache). On the CPU no allocator is read: the saved
    memory is counted by :func:`saved_for_backward`'s hooks, peak and residual are NaN."""
    device = torch.device(device)
    params = _bytes(model.parameters())
    states = _bytes(t for s in optimizer.state.values() for t in s.values()
                    if isinstance(t, torch.Tensor))
    gib = 2.0**30
    out = {"parameters": params / gib, "optimizer states": states / gib}
    if device.type != "cuda":
        saved: dict[int, int] = {}
        keep = {p.untyped_storage().data_ptr() for p in model.parameters()}

        def pack(t: torch.Tensor) -> torch.Tensor:
            for ptr, nbytes, _ in _storages(t):
                if ptr not in keep:
                    saved.setdefault(ptr, nbytes)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = forward()
        loss.backward()
        grads = _bytes(p.grad for p in model.parameters() if p.grad is not None)
        del loss
        update()
        nan = math.nan
        return {**out, "other allocated before the step": nan,
                "saved for backward": sum(saved.values()) / gib, "gradients": grads / gib,
                "residual (peak minus the rows above)": nan, "peak": nan, "reserved": nan}
    bench.sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    loss = forward()
    bench.sync(device)
    held = torch.cuda.memory_allocated(device) - before
    loss.backward()
    grads = _bytes(p.grad for p in model.parameters() if p.grad is not None)
    del loss
    update()
    bench.sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    return {**out, "other allocated before the step": (before - params - states) / gib,
            "saved for backward": held / gib, "gradients": grads / gib,
            "residual (peak minus the rows above)": (peak - before - held - grads) / gib,
            "peak": peak / gib,
            "reserved": (torch.cuda.memory_reserved(device) - peak) / gib}


def memory_table(parts: dict[tuple[str, str], dict[str, float]],
                 baseline: str = "bf16") -> pd.DataFrame:
    """One row per model and :data:`STEP_MEMORY` part, a column per recipe (GiB, from
    :func:`step_memory` keyed by (model, recipe)) and each float8 recipe's change from
    ``baseline``; a ``sum of the parts`` row (equal to the measured ``peak of the step`` row
    by construction on a GPU), then the allocator's cache beyond the peak (not in the sum)."""
    order = [*STEP_MEMORY, "sum of the parts", "peak of the step (measured)",
             "allocator cache beyond the peak"]
    rows = []
    for model in dict.fromkeys(m for m, _ in parts):
        recipes = [r for m, r in parts if m == model]
        for what in order:
            row = {"model": model, "part": what}
            for recipe in recipes:
                p = parts[(model, recipe)]
                row[recipe] = (sum(p[k] for k in STEP_MEMORY) if what == "sum of the parts"
                               else p["peak"] if what.startswith("peak")
                               else p["reserved"] if what.startswith("allocator") else p[what])
            for recipe in recipes:
                if recipe != baseline and baseline in recipes:
                    row[f"{recipe} - {baseline}"] = row[recipe] - row[baseline]
            rows.append(row)
    return pd.DataFrame(rows)

# ------------------------------------------------------------------ end to end
def end_to_end_table(runs: dict[str, bench.Run], labels: dict[str, str], *,
                     flops_per_token: float, peak_tflops: float, baseline: str = "bf16",
                     noise: verdicts.NoiseFloor | None = None) -> pd.DataFrame:
    """``gpt.paths_table`` keyed by recipe, with the speedup over the ``baseline`` run (its
    step time over this one's), the validation loss's difference to it in percent, the
    same-seed noise floor beside it (``noise_floor_pct``: does the baseline repeat itself?),
    and the difference read as the question "do two numerics learn the same?" asks: against
    the other seeds' spread (``yardstick``, ``yardstick_pct``: :func:`helpers.verdicts.yardstick`
    with 'numerics'), ``loss_verdict`` (:func:`helpers.verdicts.loss_verdict`) and ``target``
    (:func:`helpers.verdicts.target_verdict`: within / beyond / undecided for the 2% target)."""
    table = gpt.paths_table(runs, labels, flops_per_token=flops_per_token,
                            peak_tflops=peak_tflops)
    table = table.rename(columns={"path": "recipe"}).drop(columns="speedup_vs_fp32")
    base = table[(table["recipe"] == baseline) & (table["status"] == "ran")]
    base_ms = float(base["step_ms"].iloc[0]) if len(base) else math.nan
    base_loss = float(base["final_val_loss"].iloc[0]) if len(base) else math.nan
    table["speedup_vs_bf16"] = base_ms / table["step_ms"]
    table["val_loss_diff_pct"] = 100.0 * (table["final_val_loss"] - base_loss) / base_loss
    table["noise_floor_pct"] = 100.0 * (noise.floor if noise is not None else math.nan)
    scale, name = verdicts.yardstick(noise, "numerics")
    table["yardstick"] = name
    table["yardstick_pct"] = 100.0 * scale
    diffs = table["val_loss_diff_pct"] / 100.0
    table["loss_verdict"] = ["baseline" if r == baseline else verdicts.loss_verdict(x, scale)
                             for r, x in zip(table["recipe"], diffs, strict=True)]
    table["target"] = ["baseline" if r == baseline else "not measured" if not math.isfinite(scale)
                       else verdicts.target_verdict(x, scale, VAL_LOSS_TOLERANCE)
                       for r, x in zip(table["recipe"], diffs, strict=True)]
    return table


def _iqr(row: pd.Series) -> tuple[float, float]:
    return float(row["step_ms_q1"]), float(row["step_ms_q3"])


# ------------------------------------------------------------------ the verdict as one table
def verdict_rows(model: str, e2e: pd.DataFrame, *, baseline: str = "bf16") -> list[dict]:
    """One row per float8 recipe of ``model``'s :func:`end_to_end_table`: both step times, the
    step time read by the tie rule (which refuses spreads too wide; ``step_label`` as
    :func:`helpers.verdicts.label` writes it), the loss difference with the table's yardstick
    (named), its ``loss_verdict`` and ``target`` verdict, and ``speeds_up``: measurably faster
    with the target verdict 'within'."""
    ran = e2e[e2e["status"] == "ran"].set_index("recipe") if len(e2e) else e2e
    rows = []
    for recipe, row in (e2e.set_index("recipe").iterrows() if len(e2e) else ()):
        if recipe == baseline:
            continue
        out = {"model": model, "recipe": recipe}
        if baseline not in getattr(ran, "index", []) or recipe not in ran.index:
            rows.append({**out, "step_label": f"not compared ({row['status']})",
                         "faster": False, "target": "not measured", "speeds_up": False})
            continue
        base = ran.loc[baseline]
        a, b = float(row["step_ms"]), float(base["step_ms"])
        why = verdicts.tie_reason(a, b, a_iqr=_iqr(row), b_iqr=_iqr(base))
        word = verdicts.TIE_WORD if why else "faster" if a < b else "slower"
        faster = word == "faster"
        rows.append({**out, "bf16_ms": b, "float8_ms": a,
                     "step_label": verdicts.label(word, b / a), "step_why": why,
                     "val_loss_diff_pct": float(row["val_loss_diff_pct"]),
                     "yardstick": row["yardstick"], "yardstick_pct": float(row["yardstick_pct"]),
                     "loss_verdict": row["loss_verdict"], "target": row["target"],
                     "faster": faster, "speeds_up": bool(faster and row["target"] == "within")})
    return rows

