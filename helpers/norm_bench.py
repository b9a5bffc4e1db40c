"""Notebook 03: LayerNorm and RMSNorm implementations on Transformer-shaped hidden states.

Every candidate of one norm gets the same random affine parameters and the same inputs; each is
checked against a float64 reference before it is timed. A dtype configuration names the input
dtype and the parameter dtype; the output (and its gradient) has the parameters' dtype, which is
what Apex's ``Mixed*`` norms do when the two differ (``csrc/layer_norm_cuda.cpp``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from helpers import fusion, roofline
from helpers.progress import progress

if TYPE_CHECKING:
    import pandas as pd

    from helpers.profile import Profile

EPS = 1e-5  # passed to every norm: torch.nn.RMSNorm's default (eps=None) is finfo(dtype).eps
NORMS = ("LayerNorm", "RMSNorm")
PASSES = ("forward", "forward+backward")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# (rtol, atol): |got - ref| <= atol * max|ref| + rtol * |ref|, per tensor, by that tensor's dtype.
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1.6e-2),
              torch.float16: (2e-3, 2e-3)}


@dataclass(frozen=True)
class Config:
    """Input dtype ``x`` and parameter dtype ``w``; output and its gradient are in ``w``."""

    x: str
    w: str

    @property
    def label(self) -> str:
        """'bf16', or 'fp32->bf16' for fp32 inputs with bf16 parameters and output."""
        return self.x if self.x == self.w else f"{self.x}->{self.w}"

    @property
    def mixed(self) -> bool:
        """True when inputs and parameters differ in dtype."""
        return self.x != self.w


def configs_for(device: torch.device | str, *, bf16: bool, mixed: bool) -> list[Config]:
    """fp32 and bf16 on the CPU; fp32, bf16 (where supported) and fp16 on CUDA; with ``mixed``
    also fp32 inputs with half-precision parameters."""
    on_cuda = torch.device(device).type == "cuda"
    halves = (["bf16"] if bf16 else []) + (["fp16"] if on_cuda else [])
    configs = [Config("fp32", "fp32")] + [Config(h, h) for h in halves]
    if mixed and on_cuda:
        configs += [Config("fp32", h) for h in halves]
    return configs


class NativeNorm(nn.Module):
    """torch's ``F.layer_norm`` / ``F.rms_norm`` on the input's dtype, output cast to the
    parameters' dtype (a no-op unless they differ): the native way to get Apex's mixed output."""

    def __init__(self, norm: str, hidden: int) -> None:
        super().__init__()
        self.norm, self.shape = norm, (hidden,)
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden)) if norm == "LayerNorm" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.to(x.dtype)
        if self.norm == "LayerNorm":
            y = F.layer_norm(x, self.shape, w, self.bias.to(x.dtype), EPS)
        else:
            y = F.rms_norm(x, self.shape, w, EPS)
        return y.to(self.weight.dtype)


@dataclass(frozen=True)
class Candidate:
    """One implementation of one norm: kind is native, compiled, apex or apex-mixed."""

    norm: str
    kind: str

    @property
    def name(self) -> str:
        """The label used in tables and plots."""
        return {"native": f"torch {self.norm}", "compiled": f"torch.compile {self.norm}",
                "apex": f"apex Fused{self.norm}",
                "apex-mixed": f"apex MixedFused{self.norm}"}[self.kind]

    def applies(self, cfg: Config) -> bool:
        """Mixed configs: native (eager ``F.*_norm`` plus a cast) and apex-mixed only, so no
        torch.compile candidate competes there; plain configs: all but apex-mixed."""
        return self.kind == "native" or (self.kind == "apex-mixed") == cfg.mixed

    def build(self, hidden: int, cfg: Config, device: torch.device | str) -> nn.Module:
        """The module, parameters in ``cfg.w`` on ``device`` (not yet compiled)."""
        if self.kind in ("native", "compiled") and not cfg.mixed:
            cls = nn.LayerNorm if self.norm == "LayerNorm" else nn.RMSNorm
            module = cls(hidden, eps=EPS)
        elif self.kind in ("native", "compiled"):
            module = NativeNorm(self.norm, hidden)
        else:
            from apex import normalization

            prefix = "MixedFused" if self.kind == "apex-mixed" else "Fused"
            module = getattr(normalization, prefix + self.norm)(hidden, eps=EPS)
        return module.to(device=device, dtype=DTYPES[cfg.w])


def candidates(*, compiled: bool, apex: bool) -> list[Candidate]:
    """Native candidates always; compiled and Apex ones on request."""
    kinds = ["native"] + (["compiled"] if compiled else [])
    kinds += ["apex", "apex-mixed"] if apex else []
    return [Candidate(norm, kind) for norm in NORMS for kind in kinds]


def affine_params(norm: str, hidden: int, seed: int = 0) -> list[torch.Tensor]:
    """Random affine parameters (not ones and zeros): weight ~ 1 + 0.1 N(0,1), bias ~ 0.1 N(0,1)."""
    gen = torch.Generator().manual_seed(seed)
    weight = 1 + 0.1 * torch.randn(hidden, generator=gen)
    return [weight] + ([0.1 * torch.randn(hidden, generator=gen)] if norm == "LayerNorm" else [])


def load_affine(module: nn.Module, values: list[torch.Tensor]) -> nn.Module:
    """Copy ``values`` into the module's weight (and bias), keeping the module's dtype."""
    with torch.no_grad():
        for param, value in zip((module.weight, getattr(module, "bias", None)), values,
                                strict=False):
            param.copy_(value)
    return module


def make_inputs(tokens: int, hidden: int, cfg: Config, device: torch.device | str,
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states x (mean 0.5, std 2, in ``cfg.x``, requiring grad) and an output gradient
    dy (in ``cfg.w``), drawn in fp32 from a seeded generator."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = 0.5 + 2 * torch.randn(tokens, hidden, generator=gen, device=device)
    dy = torch.randn(tokens, hidden, generator=gen, device=device)
    return x.to(DTYPES[cfg.x]).requires_grad_(True), dy.to(DTYPES[cfg.w])


def reference(norm: str, x: torch.Tensor, params: list[torch.Tensor],
              dy: torch.Tensor) -> list[torch.Tensor]:
    """y, dx, dweight (, dbias) in float64, from the textbook formulas and autograd."""
    x64 = x.detach().double().requires_grad_(True)
    p64 = [p.detach().double().requires_grad_(True) for p in params]
    if norm == "LayerNorm":
        mean = x64.mean(-1, keepdim=True)
        var = ((x64 - mean) ** 2).mean(-1, keepdim=True)
        y = (x64 - mean) / torch.sqrt(var + EPS) * p64[0] + p64[1]
    else:
        y = x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + EPS) * p64[0]
    grads = torch.autograd.grad(y, [x64, *p64], dy.double())
    return [y.detach(), *grads]


def outputs(module: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> list[torch.Tensor]:
    """y, dx, dweight (, dbias) of one forward and backward."""
    params = [p for p in (module.weight, getattr(module, "bias", None)) if p is not None]
    y = module(x)
    return [y.detach(), *torch.autograd.grad(y, [x, *params], dy)]


def check(got: torch.Tensor, ref: torch.Tensor) -> dict:
    """Max absolute error, max error relative to max|ref|, and the tolerance verdict."""
    rtol, atol = TOLERANCES[got.dtype]
    diff = (got.double() - ref).abs()
    scale = float(ref.abs().max())
    ok = bool((diff <= atol * scale + rtol * ref.abs()).all())
    return {"max_abs_err": float(diff.max()), "max_rel_err": float(diff.max()) / scale,
            "rtol": rtol, "atol_x_max": atol, "ok": ok}


# What to do when torch.compile fails (no C compiler for Inductor, a broken Triton, ...).
COMPILE_FIX = ("set compile_native = False in the parameters cell, or make torch.compile work "
               "(Inductor needs a working C compiler and Triton)")


class CompileFailed(RuntimeError):
    """torch.compile (or the first call that compiles) failed; the message is one line."""


def one_line_cause(exc: BaseException) -> str:
    """The innermost cause of ``exc`` as 'Type: first line' (Dynamo wraps the real error)."""
    seen = {id(exc)}
    while True:
        inner = getattr(exc, "inner_exception", None) or exc.__cause__
        if inner is None or id(inner) in seen:
            break
        seen.add(id(inner))
        exc = inner
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:200]


def compile_and_time(module: nn.Module, x: torch.Tensor,
                     dy: torch.Tensor) -> tuple[nn.Module, float]:
    """``torch.compile(module, dynamic=False)`` and the seconds its first forward+backward takes
    (that is when Inductor compiles); any failure becomes a one-line :class:`CompileFailed`."""
    try:
        compiled = torch.compile(module, dynamic=False)
        start = time.perf_counter()
        outputs(compiled, x, dy)
        fusion.sync(x.device)
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:
        raise CompileFailed(f"torch.compile failed ({one_line_cause(exc)})") from None
    return compiled, time.perf_counter() - start


@dataclass
class Entry:
    """A built (and, if asked, compiled) module for one norm, config and candidate."""

    candidate: Candidate
    cfg: Config
    module: nn.Module
    compile_s: float = float("nan")


def build_suite(cands: list[Candidate], configs: list[Config], tokens: int, hidden: int,
                device: torch.device | str) -> tuple[list[Entry], dict, str]:
    """Every applicable (candidate, config) module with shared parameters, the inputs per
    config, and ``compile_error``. Compiled modules are compiled here (first forward+backward,
    timed as compile_s). If torch.compile fails, every compiled candidate is left out and
    ``compile_error`` says why in one line (empty when nothing failed)."""
    inputs = {cfg.label: make_inputs(tokens, hidden, cfg, device) for cfg in configs}
    entries, compile_error = [], ""
    for cfg in configs:
        for cand in (c for c in cands if c.applies(cfg)):
            if cand.kind == "compiled" and compile_error:
                continue
            module = load_affine(cand.build(hidden, cfg, device), affine_params(cand.norm, hidden))
            entry = Entry(cand, cfg, module)
            if cand.kind == "compiled":
                try:
                    entry.module, entry.compile_s = compile_and_time(module, *inputs[cfg.label])
                except CompileFailed as exc:
                    compile_error = f"{exc}: compiled candidates left out; {COMPILE_FIX}"
                    continue
            entries.append(entry)
    if compile_error:  # all or none: a table where some dtypes lack the compiled rows misleads
        entries = [e for e in entries if e.candidate.kind != "compiled"]
    return entries, inputs, compile_error


def affine_of(module: nn.Module) -> list[torch.Tensor]:
    """The module's weight (and bias) as it holds them."""
    return [p for p in (module.weight, getattr(module, "bias", None)) if p is not None]


def correctness(entries: list[Entry], inputs: dict) -> pd.DataFrame:
    """Every entry's y and gradients against the float64 reference, one row per tensor."""
    import pandas as pd

    rows, key, ref = [], None, []
    for e in entries:
        x, dy = inputs[e.cfg.label]
        if key != (e.candidate.norm, e.cfg.label):  # entries come grouped by norm and config
            key = (e.candidate.norm, e.cfg.label)
            ref = reference(e.candidate.norm, x, affine_of(e.module), dy)
        for name, got, want in zip(("y", "dx", "dweight", "dbias"), outputs(e.module, x, dy),
                                   ref, strict=False):
            rows.append({"norm": e.candidate.norm, "dtype": e.cfg.label,
                         "candidate": e.candidate.name, "tensor": name, **check(got, want)})
    return pd.DataFrame(rows)


def norm_bytes(norm: str, tokens: int, hidden: int, cfg: Config, pass_: str) -> int:
    """Bytes counted per call. Forward: read x, write y, read the affine vectors. Backward:
    read x and dy, write dx, read the affine vectors, write their gradients. Per-row statistics
    (4-8 bytes a row) are not counted."""
    sx, sy = DTYPES[cfg.x].itemsize, DTYPES[cfg.w].itemsize
    vectors = (2 if norm == "LayerNorm" else 1) * hidden * sy
    forward = tokens * hidden * (sx + sy) + vectors
    if pass_ == "forward":
        return forward
    return forward + tokens * hidden * (2 * sx + sy) + 2 * vectors


def step_fn(module: nn.Module, x: torch.Tensor, dy: torch.Tensor, pass_: str):
    """The timed call: a training forward, or forward plus ``autograd.grad`` (no accumulation)."""
    if pass_ == "forward":
        return lambda: module(x)
    params = affine_of(module)
    return lambda: torch.autograd.grad(module(x), [x, *params], dy)


def time_entry(e: Entry, x: torch.Tensor, dy: torch.Tensor, pass_: str, copy_gbps: float, *,
               warmup: int, repeats: int) -> dict:
    """One timing row: GPU-time medians and IQR (host overhead hidden, see
    :func:`fusion.gpu_time`), bytes, GB/s, % of the copy ceiling, and ``call_ms``, the median of
    back-to-back calls with the host's cost included (the same number on the CPU)."""
    fn = step_fn(e.module, x, dy, pass_)
    t, call_ms = fusion.gpu_time(fn, x.device, warmup=warmup, repeats=repeats)
    tokens, hidden = x.shape
    nbytes = norm_bytes(e.candidate.norm, tokens, hidden, e.cfg, pass_)
    gbps = roofline.bandwidth_gbps(nbytes, t.median_ms)
    return {"norm": e.candidate.norm, "candidate": e.candidate.name, "dtype": e.cfg.label,
            "pass": pass_, "median_ms": t.median_ms, "q1_ms": t.q1_ms, "q3_ms": t.q3_ms,
            "iqr_ms": t.iqr_ms, "gbps": gbps,
            "pct_of_copy_ceiling": roofline.pct_of(gbps, copy_gbps), "bytes": nbytes,
            "call_ms": call_ms, "tokens": tokens, "hidden": hidden, "compile_s": e.compile_s}


def timings(entries: list[Entry], inputs: dict, copy_gbps: float, *, warmup: int,
            repeats: int) -> pd.DataFrame:
    """The 03_norm_timings table: every entry, both passes."""
    import pandas as pd

    return pd.DataFrame([time_entry(e, *inputs[e.cfg.label], p, copy_gbps, warmup=warmup,
                                    repeats=repeats) for e in entries for p in PASSES])


def hidden_sweep(cands: list[Candidate], cfg: Config, tokens: int, hiddens: list[int],
                 device: torch.device | str, copy_gbps: float, *, warmup: int, repeats: int,
                 profile: Profile | None = None) -> pd.DataFrame:
    """GB/s of eager candidates over hidden sizes at a fixed token count (no compile here)."""
    import pandas as pd

    rows = []
    for hidden in progress(hiddens, profile=profile, desc="hidden sizes") if profile else hiddens:
        x, dy = make_inputs(tokens, hidden, cfg, device)
        for cand in (c for c in cands if c.applies(cfg) and c.kind != "compiled"):
            module = load_affine(cand.build(hidden, cfg, device), affine_params(cand.norm, hidden))
            for p in PASSES:
                rows.append(time_entry(Entry(cand, cfg, module), x, dy, p, copy_gbps,
                                       warmup=warmup, repeats=repeats))
        del x, dy
    return pd.DataFrame(rows).drop(columns=["compile_s"])

