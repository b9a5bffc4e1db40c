"""Checks behind notebook 04's claims: a forced overflow (is the step skipped and the loss scale
halved?), how many gradient values fp16 and bf16 can hold, and which dtype each op runs in
under autocast or apex's O1 patching. Shared by the notebook and the legacy child process."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F

from helpers.amp_train import Built, dtype_name, first_linear, make_model


class InfGradOnce:
    """A gradient hook that, once armed, turns one element of the next gradient into +inf."""

    def __init__(self) -> None:
        self.armed = False
        self.fired = False

    def __call__(self, grad: torch.Tensor) -> torch.Tensor | None:
        if not self.armed:
            return None
        self.armed, self.fired = False, True
        grad = grad.clone()
        grad.view(-1)[0] = float("inf")
        return grad


def overflow_probe(built: Built, batches, *, warm: int = 3) -> dict:
    """Train ``warm`` steps, then force an inf into the first layer's weight gradient for one
    step, and report the loss scale before/after and whether that step changed any parameter
    (model weights and master copies). One more clean step checks that training resumes."""
    if built.scale is None:
        raise ValueError("overflow_probe needs a run with a loss scaler")
    inject = InfGradOnce()
    handle = first_linear(built.model).weight.register_hook(inject)
    try:
        for i in range(warm):
            built.step(*batches[i % len(batches)])
        before = [t.detach().clone() for t in built.params()]
        scale_before = float(built.scale())
        inject.armed = True
        built.step(*batches[warm % len(batches)])
        scale_after = float(built.scale())
        unchanged = all(torch.equal(a, b) for a, b in zip(before, built.params(), strict=True))
        built.step(*batches[(warm + 1) % len(batches)])
        resumed = any(not torch.equal(a, b)
                      for a, b in zip(before, built.params(), strict=True))
    finally:
        handle.remove()
    return {
        "inf_injected": inject.fired,
        "loss_scale_before": scale_before,
        "loss_scale_after": scale_after,
        "scale_halved": scale_after == scale_before / 2,
        "params_unchanged": unchanged,
        "next_step_updates": resumed,
    }


def gradient_representability(cfg, batch, device: torch.device | str,
                              scales: tuple[float, ...] = (1.0, 2.0**16)) -> list[dict]:
    """Fresh fp32 model, one fp32 backward: the share of non-zero gradient values that become 0
    (underflow) or inf (overflow) when cast to fp16 after multiplying by each loss scale, and
    when cast to bf16 unscaled."""
    model = make_model(cfg).to(device)
    x, y = batch
    F.cross_entropy(model(x), y).backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    nonzero = grads != 0
    n = int(nonzero.sum())
    rows = []
    for dtype, scale in [(torch.float16, s) for s in scales] + [(torch.bfloat16, 1.0)]:
        cast = (grads * scale).to(dtype)
        rows.append({
            "format": dtype_name(dtype), "loss_scale": scale,
            "underflow_pct": 100.0 * int(((cast == 0) & nonzero).sum()) / max(n, 1),
            "overflow_pct": 100.0 * int(torch.isinf(cast).sum()) / max(n, 1),
            "grad_abs_median": float(grads[nonzero].abs().median()),
        })
    return rows


def _probe_ops(low: torch.dtype) -> dict[str, Callable]:
    """Ops to probe: matmuls take fp32 inputs (weights are fp32); the pointwise, reduction and
    loss ops take an activation in ``low`` precision, as a previous matmul would produce it."""
    return {
        "linear": lambda a, w, h, y: F.linear(a, w),
        "matmul": lambda a, w, h, y: a @ w.t(),
        "gelu": lambda a, w, h, y: F.gelu(h),
        "softmax": lambda a, w, h, y: F.softmax(h, dim=-1),
        "layer_norm": lambda a, w, h, y: F.layer_norm(h, h.shape[-1:]),
        "exp": lambda a, w, h, y: torch.exp(h),
        "sum": lambda a, w, h, y: h.sum(),
        "cross_entropy": lambda a, w, h, y: F.cross_entropy(h, y),
    }


def op_output_dtypes(device: torch.device | str, low: torch.dtype,
                     context: Callable[[], contextlib.AbstractContextManager] | None = None
                     ) -> dict[str, str]:
    """Output dtype of each probe op inside ``context()`` (e.g. ``torch.autocast``; None: no
    context, as under apex O1 whose patches are always on)."""
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(8, 16, generator=gen).to(dev)
    w = torch.randn(16, 16, generator=gen).to(dev)
    h = torch.randn(8, 16, generator=gen).to(dev, low)
    y = torch.randint(0, 16, (8,), generator=gen).to(dev)
    out = {}
    for name, fn in _probe_ops(low).items():
        with context() if context is not None else contextlib.nullcontext():
            try:
                out[name] = dtype_name(fn(a, w, h, y).dtype)
            except Exception as exc:  # an op the backend lacks in this dtype
                out[name] = f"error: {type(exc).__name__}"
    return out
