"""Notebook 03: what Apex's norms really do - their eager-mode fallback under ``torch.compile``
and the dtype combinations each class accepts. GPU and Apex's ``fused_layer_norm_cuda`` only."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch

from helpers import fusion, gpu
from helpers.norm_bench import (
    EPS,
    Config,
    affine_params,
    compile_and_time,
    load_affine,
    make_inputs,
    step_fn,
)

if TYPE_CHECKING:
    import pandas as pd

# Kernel names in Apex's csrc/layer_norm_cuda_kernel.cu.
APEX_KERNELS = ("cuApplyLayerNorm", "cuApplyRMSNorm", "cuComputeGradInput",
                "cuComputePartGradGammaBeta", "cuComputeGradGammaBeta", "cuComputeGradGamma")


def unavailable() -> str:
    """What the Apex norms need and this machine lacks, as one phrase ('' when they can run).
    Prints nothing: the notebook says it once and reuses the answer."""
    if not gpu.cuda_available():
        return "a CUDA GPU"
    if not gpu.apex_extension_status().get("fused_layer_norm_cuda", False):
        what = "Apex" if not gpu.apex_importable() else "Apex's compiled extension"
        return f"{what} fused_layer_norm_cuda ({gpu.BUILD_HINT})"
    return ""


def fallback_source(lines: int = 9) -> str:
    """The opening lines of FusedLayerNorm.forward and FusedRMSNorm.forward, as installed."""
    from apex.normalization import FusedLayerNorm, FusedRMSNorm

    parts = []
    for cls in (FusedLayerNorm, FusedRMSNorm):
        source = inspect.getsource(cls.forward).splitlines()[:lines]
        parts.append(f"# {cls.__name__}.forward ({inspect.getsourcefile(cls)})\n"
                     + "\n".join(source))
    return "\n\n".join(parts)


def compile_demo(tokens: int, hidden: int, dtype: str, device: torch.device | str, *,
                 warmup: int, repeats: int) -> pd.DataFrame:
    """FusedRMSNorm eager and compiled next to torch's RMSNorm compiled: kernels per
    forward+backward, how many are Apex's, and the median time. Raises
    :class:`helpers.norm_bench.CompileFailed` (one line) when torch.compile fails."""
    import pandas as pd
    from apex.normalization import FusedRMSNorm

    cfg = Config(dtype, dtype)
    x, dy = make_inputs(tokens, hidden, cfg, device)
    modules = {
        "apex FusedRMSNorm (eager)": FusedRMSNorm(hidden, eps=EPS),
        "apex FusedRMSNorm + torch.compile": FusedRMSNorm(hidden, eps=EPS),
        "torch RMSNorm + torch.compile": torch.nn.RMSNorm(hidden, eps=EPS),
    }
    rows = []
    for name, module in modules.items():
        module = load_affine(module.to(device=device, dtype=x.dtype),
                             affine_params("RMSNorm", hidden))
        compile_s = float("nan")
        if "compile" in name:
            module, compile_s = compile_and_time(module, x, dy)  # CompileFailed: one line
        fn = step_fn(module, x, dy, "forward+backward")
        counts = fusion.count_kernels(fn, x.device, match=APEX_KERNELS)
        t, _ = fusion.gpu_time(fn, x.device, warmup=warmup, repeats=repeats)
        rows.append({"candidate": name, "kernels": counts["per_call"],
                     "apex_kernels": counts["matching_per_call"], "top": counts["top"],
                     "median_ms": t.median_ms, "compile_s": compile_s})
    return pd.DataFrame(rows)


def dtype_probe(device: torch.device | str, hidden: int = 64) -> pd.DataFrame:
    """Which (input, parameter) dtype pairs FusedLayerNorm and MixedFusedLayerNorm accept on
    this build, and the output dtype; errors reported by their first line."""
    import pandas as pd
    from apex.normalization import FusedLayerNorm, MixedFusedLayerNorm

    half = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    pairs = [(half, half), (torch.float32, half), (half, torch.float32)]
    rows = []
    for cls in (FusedLayerNorm, MixedFusedLayerNorm):
        for x_dtype, w_dtype in pairs:
            module = cls(hidden, eps=EPS).to(device=device, dtype=w_dtype)
            x = torch.randn(8, hidden, device=device, dtype=x_dtype)
            try:
                result = f"output {str(module(x).dtype).replace('torch.', '')}"
                torch.cuda.synchronize()
            except RuntimeError as exc:
                result = f"RuntimeError: {str(exc).strip().splitlines()[0][:90]}"
            rows.append({"class": cls.__name__, "input": str(x_dtype).replace("torch.", ""),
                         "weights": str(w_dtype).replace("torch.", ""), "result": result})
    return pd.DataFrame(rows)
