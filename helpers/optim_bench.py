"""Notebook 02: AdamW implementations compared on the same parameters and the same gradients.

Every candidate gets fresh copies of one model's parameters and the same seeded gradients, so only
the update differs. Gradients are assigned, never computed: the timed region is
``optimizer.step()`` alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from helpers import bench, fusion, roofline
from helpers.progress import progress

if TYPE_CHECKING:
    import pandas as pd

    from helpers.profile import Profile

# One set of hyper-parameters for every candidate. Apex FusedAdam defaults to weight_decay=0.0
# and torch AdamW to 0.01, so every value is passed explicitly.
HPARAMS: dict = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}

FORLOOP, FOREACH, FUSED, APEX = "for-loop", "foreach", "fused", "apex FusedAdam"
LABELS = {FORLOOP: "AdamW(foreach=False)", FOREACH: "AdamW(foreach=True)",
          FUSED: "AdamW(fused=True)", APEX: "FusedAdam(adam_w_mode=True)"}

# Parameters of a candidate may differ from the float64 reference by at most this much after
# the checked steps: a thousandth of one step's size (lr).
ATOL = HPARAMS["lr"] * 1e-3


def adamw_bytes_per_param(param_bytes: int = 4, grad_bytes: int = 4,
                          state_bytes: int = 4) -> dict[str, int]:
    """Minimum bytes one AdamW step moves per parameter: reads param, grad, exp_avg, exp_avg_sq,
    writes param, exp_avg, exp_avg_sq (fp32 everywhere: 16 read + 12 written = 28)."""
    read = param_bytes + grad_bytes + 2 * state_bytes
    write = param_bytes + 2 * state_bytes
    return {"read": read, "write": write, "total": read + write}


def step_bytes_per_param(name: str, param_dtype: torch.dtype = torch.float32) -> int:
    """Minimum bytes one step of candidate ``name`` moves per parameter of ``param_dtype``: the
    gradient has the parameter's dtype; torch's AdamW keeps its moments in that dtype too, Apex's
    FusedAdam always in fp32 (28 B for every candidate in fp32; 14 and 22 B in bf16)."""
    size = torch.empty((), dtype=param_dtype).element_size()
    state = 4 if name == APEX else size
    return adamw_bytes_per_param(size, size, state)["total"]


def build_model(hidden: int, blocks: int, device: torch.device | str = "cpu",
                seed: int = 0) -> nn.Sequential:
    """A stack of Transformer-shaped blocks (LayerNorm, QKV, projection, LayerNorm, MLP):
    12*h^2 + 13*h parameters in 12 tensors per block. Only its parameters are used."""
    torch.manual_seed(seed)
    h = hidden
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.LayerNorm(h, device=device), nn.Linear(h, 3 * h, device=device),
                   nn.Linear(h, h, device=device), nn.LayerNorm(h, device=device),
                   nn.Linear(h, 4 * h, device=device), nn.Linear(4 * h, h, device=device)]
    return nn.Sequential(*layers)


def expected_size(hidden: int, blocks: int) -> tuple[int, int]:
    """(parameters, tensors) of :func:`build_model`, from the formula."""
    return blocks * (12 * hidden * hidden + 13 * hidden), 12 * blocks


def split_shapes(total: int, n_tensors: int) -> list[tuple[int]]:
    """``total`` parameters as ``n_tensors`` 1-D tensors of equal size (total must divide)."""
    if n_tensors < 1 or total % n_tensors:
        raise ValueError(f"{total} parameters do not split into {n_tensors} equal tensors")
    return [(total // n_tensors,)] * n_tensors


def make_grads(shapes: list, seed: int, device: torch.device | str,
               dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Gradients from a seeded generator (drawn in fp32, then cast), identical on every call."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(s, generator=gen, device=device).to(dtype) for s in shapes]


def fresh_params(source: list[torch.Tensor],
                 dtype: torch.dtype | None = None) -> list[nn.Parameter]:
    """Independent leaf copies of ``source`` (optionally cast), ready for an optimizer."""
    return [nn.Parameter(p.detach().clone().to(dtype or p.dtype)) for p in source]


def fused_supported(device: torch.device | str) -> str | None:
    """None when ``AdamW(fused=True)`` steps on ``device`` in this torch, else the reason."""
    p = nn.Parameter(torch.zeros(4, device=device))
    p.grad = torch.ones_like(p)
    try:
        torch.optim.AdamW([p], fused=True).step()
    except (RuntimeError, TypeError, ValueError) as exc:
        return str(exc).splitlines()[0]
    return None


def native_candidates(device: torch.device | str) -> list[str]:
    """The torch.optim.AdamW variants that run on ``device``; prints one line for a skip."""
    names = [FORLOOP, FOREACH]
    reason = fused_supported(device)
    if reason is None:
        names.append(FUSED)
    else:
        print(f"Skipped AdamW(fused=True): torch {torch.__version__} says: {reason}")
    return names


def make_optimizer(name: str, params: list, hparams: dict | None = None) -> torch.optim.Optimizer:
    """The optimizer called ``name`` over ``params``, with the course's hyper-parameters."""
    hp = dict(HPARAMS if hparams is None else hparams)
    if name == FORLOOP:
        return torch.optim.AdamW(params, foreach=False, **hp)
    if name == FOREACH:
        return torch.optim.AdamW(params, foreach=True, **hp)
    if name == FUSED:
        return torch.optim.AdamW(params, fused=True, **hp)
    if name == APEX:
        from apex.optimizers import FusedAdam

        return FusedAdam(params, adam_w_mode=True, **hp)
    raise KeyError(f"unknown candidate '{name}': use one of {', '.join(LABELS)}")


def run_steps(name: str, source: list[torch.Tensor], steps: int, *, seed: int = 0,
              dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """Parameters after ``steps`` steps of candidate ``name`` from ``source``; step k uses the
    gradients of seed ``seed + k``."""
    params = fresh_params(source, dtype)
    optimizer = make_optimizer(name, params)
    shapes = [p.shape for p in params]
    for k in range(steps):
        for p, g in zip(params, make_grads(shapes, seed + k, params[0].device, params[0].dtype),
                        strict=True):
            p.grad = g
        optimizer.step()
    return [p.detach() for p in params]


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Largest element-wise difference between two parameter lists (in float64)."""
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b, strict=True))


def correctness(source: list[torch.Tensor], candidates: list[str], steps: int) -> pd.DataFrame:
    """Each candidate's parameters after ``steps`` steps against the fp32 for-loop and a float64
    for-loop; ``ok`` when within :data:`ATOL` of float64."""
    import pandas as pd

    ref64 = run_steps(FORLOOP, source, steps, dtype=torch.float64)
    ref32 = run_steps(FORLOOP, source, steps)
    rows = []
    for name in candidates:
        got = ref32 if name == FORLOOP else run_steps(name, source, steps)
        err64 = max_abs_diff(got, ref64)
        rows.append({"candidate": name, "steps": steps,
                     "max_abs_vs_forloop": max_abs_diff(got, ref32), "max_abs_vs_float64": err64,
                     "atol": ATOL, "ok": err64 <= ATOL})
        del got
    return pd.DataFrame(rows)


@dataclass
class Workload:
    """Parameters and gradients shared by every timed candidate."""

    params: list[torch.Tensor]
    grads: list[torch.Tensor]

    @property
    def numel(self) -> int:
        """Total number of parameters."""
        return sum(p.numel() for p in self.params)

    def prepared(self, name: str) -> tuple[list[nn.Parameter], torch.optim.Optimizer]:
        """Fresh parameters holding the shared gradients, and the optimizer ``name`` over them."""
        params = fresh_params(self.params)
        for p, g in zip(params, self.grads, strict=True):
            p.grad = g
        return params, make_optimizer(name, params)


def workload(params: list[torch.Tensor], seed: int = 1) -> Workload:
    """A :class:`Workload` over ``params`` with seeded gradients of the parameters' dtype."""
    return Workload(params, make_grads([p.shape for p in params], seed, params[0].device,
                                       params[0].dtype))


def time_step(work: Workload, name: str, *, warmup: int, repeats: int,
              step_fn: Callable | None = None, label: str | None = None) -> bench.Timing:
    """Time ``optimizer.step()`` of candidate ``name`` (state created by the warm-up steps),
    or ``step_fn`` when given."""
    if step_fn is None:
        _, optimizer = work.prepared(name)
        step_fn = optimizer.step
    return bench.benchmark(step_fn, label=label or name, warmup=warmup, repeats=repeats,
                           device=work.params[0].device)


def step_table(timings: list[bench.Timing], numel: int, copy_gbps: float,
               param_dtype: torch.dtype = torch.float32) -> pd.DataFrame:
    """The 02_optimizer_step table: medians, IQR, speed-ups and bandwidth per candidate.

    Bandwidth counts each candidate's minimum bytes for parameters of ``param_dtype``
    (:func:`step_bytes_per_param`), whatever the implementation actually moves."""
    import pandas as pd

    df = pd.DataFrame([t.as_row() for t in timings]).rename(columns={"label": "candidate"})
    df["bytes_per_param"] = [step_bytes_per_param(name, param_dtype) for name in df["candidate"]]
    df["bytes_per_step"] = numel * df["bytes_per_param"]
    df["gbps"] = [roofline.bandwidth_gbps(nbytes, ms)
                  for nbytes, ms in zip(df["bytes_per_step"], df["median_ms"], strict=True)]
    df["pct_of_copy_ceiling"] = [roofline.pct_of(g, copy_gbps) for g in df["gbps"]]
    for base in (FOREACH, FORLOOP):
        ref = df.loc[df["candidate"] == base, "median_ms"]
        df[f"speedup_vs_{base.replace('-', '')}"] = (float(ref.iloc[0]) / df["median_ms"]
                                                     if not ref.empty else math.nan)
    cols = ["candidate", "median_ms", "q1_ms", "q3_ms", "iqr_ms", "gbps", "pct_of_copy_ceiling",
            "speedup_vs_foreach", "speedup_vs_forloop"]
    return df[cols + [c for c in df.columns if c not in cols]]


def verdict(df) -> str:
    """Sentences saying, from the measured table, who won and by how much."""
    names = list(df["candidate"])
    tied = fusion.tied_with_fastest(df)
    best = (f"{tied[0]} ({LABELS.get(tied[0], tied[0])})" if len(tied) == 1
            else fusion.fastest_text(df))
    lines = [f"Fastest on this run: {best}."]
    if APEX in names:
        for other in (FUSED, FOREACH):
            if other in names:
                lines.append(fusion.compare_rows(df, APEX, other) + ".")
    else:
        lines.append("Apex FusedAdam was not measured here (it needs a CUDA GPU and amp_C).")
    if FUSED in names and FOREACH in names:
        lines.append(fusion.compare_rows(df, FUSED, FOREACH) + ".")
    if FOREACH in names and FORLOOP in names:
        lines.append(fusion.compare_rows(df, FOREACH, FORLOOP) + ".")
    return "\n".join(lines)


def kernel_table(work: Workload, candidates: list[str]) -> pd.DataFrame:
    """Per candidate: kernels (CUDA) or top-level ops (CPU) launched by one step."""
    import pandas as pd

    rows = []
    for name in candidates:
        _, optimizer = work.prepared(name)
        optimizer.step()  # creates the state outside the profiled step
        counts = fusion.count_kernels(optimizer.step, work.params[0].device)
        rows.append({"candidate": name, "tensors": len(work.params), **counts})
    return pd.DataFrame(rows).rename(columns={"per_call": "per_step"})


def tensor_count_sweep(total: int, counts: list[int], candidates: list[str],
                       device: torch.device | str, *, warmup: int, repeats: int,
                       profile: Profile | None = None) -> pd.DataFrame:
    """Step time of each candidate with ``total`` parameters split into each of ``counts``."""
    import pandas as pd

    rows = []
    for n in progress(counts, profile=profile, desc="tensor counts") if profile else counts:
        shapes = split_shapes(total, n)
        params = make_grads(shapes, seed=2, device=device)  # random starting values
        work = workload(params)
        for name in candidates:
            t = time_step(work, name, warmup=warmup, repeats=repeats)
            rows.append({"tensors": n, "params_per_tensor": total // n, "candidate": name,
                         "median_ms": t.median_ms, "q1_ms": t.q1_ms, "q3_ms": t.q3_ms})
        del work, params
    return pd.DataFrame(rows)


def sweep_reading(df) -> str:
    """Sentences reading the sweep: each candidate's slow-down from fewest to most tensors."""
    lo, hi = int(df["tensors"].min()), int(df["tensors"].max())
    lines = []
    for name, group in df.groupby("candidate", sort=False):
        a = float(group.loc[group["tensors"] == lo, "median_ms"].iloc[0])
        b = float(group.loc[group["tensors"] == hi, "median_ms"].iloc[0])
        lines.append(f"{name}: {a:.3g} ms with {lo} tensors, {b:.3g} ms with {hi} "
                     f"({b / a:.1f}x the time for the same parameter count)")
    return "\n".join(lines)


def time_compiled_step(work: Workload, name: str, *, warmup: int,
                       repeats: int) -> tuple[float, bench.Timing]:
    """Compile time (s, the first call) and timing of a ``torch.compile``d ``optimizer.step``."""
    _, optimizer = work.prepared(name)

    @torch.compile(fullgraph=False)
    def step() -> None:
        optimizer.step()

    start = time.perf_counter()
    step()
    fusion.sync(work.params[0].device)
    compile_s = time.perf_counter() - start
    return compile_s, time_step(work, name, warmup=warmup, repeats=repeats, step_fn=step,
                                label=f"compiled {name}")

