"""The environment report: printed at the top of every notebook and saved with every result."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from datetime import datetime, timezone

import torch

from helpers import BENCH_METHOD_VERSION, __version__, gpu
from helpers.results import repo_root

# Environment variables that change what the numbers mean.
RELEVANT_VARS = (
    "COURSE_PROFILE", "CUDA_VISIBLE_DEVICES", "TORCH_CUDA_ARCH_LIST", "NVIDIA_TF32_OVERRIDE",
    "PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG",
)


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def course_commit() -> str | None:
    """The git commit of the course checkout (``$COURSE_COMMIT`` where the copy has no .git)."""
    if os.environ.get("COURSE_COMMIT"):
        return os.environ["COURSE_COMMIT"]
    root = repo_root()
    if root is None:
        return None
    return _run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"])


def environment_report() -> dict:
    """Everything that decides what a measurement means, as a flat-ish dict."""
    report: dict = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "course_commit": course_commit(),
        "helpers_version": __version__,
        "bench_method": f"v{BENCH_METHOD_VERSION}",
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": gpu.cuda_available(),
        "gpu_name": None,
        "gpu_capability": None,
        "gpu_memory_gib": None,
        "gpu_sm_count": None,
        "gpu_l2_mib": None,
        "driver": None,
        "bf16_supported": gpu.bf16_supported(),
        "apex_importable": gpu.apex_importable(),
        "apex_extensions": {},
        "apex_commit": None,
        "env": {k: os.environ[k] for k in RELEVANT_VARS if k in os.environ},
    }
    if report["cuda_available"]:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        report.update(
            gpu_name=props.name,
            gpu_capability=f"{props.major}.{props.minor}",
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            gpu_sm_count=props.multi_processor_count,
            gpu_l2_mib=round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
            driver=_run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        )
        if report["driver"]:
            report["driver"] = report["driver"].splitlines()[0]
    if report["apex_importable"]:
        report["apex_extensions"] = gpu.apex_extension_status()
        info = gpu.apex_build_info()
        report["apex_commit"] = (info or {}).get("commit")
    return report


def format_report(report: dict) -> str:
    """The readable header: a few aligned lines."""
    if report["cuda_available"]:
        device = (f"{report['gpu_name']} (sm_{report['gpu_capability'].replace('.', '')}, "
                  f"{report['gpu_memory_gib']} GiB, {report['gpu_sm_count']} SMs, "
                  f"L2 {report['gpu_l2_mib']} MiB, driver {report['driver'] or 'unknown'})")
    else:
        device = "CPU only - torch sees no CUDA GPU"
    if not report["apex_importable"]:
        apex = "not installed (./build_apex.sh builds it)"
    else:
        exts = report["apex_extensions"]
        have = [k for k, v in exts.items() if v]
        apex = (f"commit {(report['apex_commit'] or 'unknown')[:12]}, extensions: "
                + (", ".join(have) if have else "NONE (Python-only install)"))
    lines = [
        ("device", device),
        ("torch", f"{report['torch']} (CUDA {report['torch_cuda'] or '-'}, "
                  f"cuDNN {report['cudnn'] or '-'}), bf16: {report['bf16_supported']}"),
        ("apex", apex),
        ("python", f"{report['python']} on {report['platform']}, {report['cpu_count']} cores"),
        ("course", f"commit {report['course_commit'] or 'unknown'}, "
                   f"bench method {report['bench_method']}, {report['date']}"),
    ]
    if report["env"]:
        lines.append(("env", " ".join(f"{k}={v}" for k, v in report["env"].items())))
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}} : {v}" for k, v in lines)


def print_report(report: dict | None = None) -> dict:
    """Print the header and return the report (measured now when not given)."""
    report = report or environment_report()
    print(format_report(report), file=sys.stdout)
    return report
