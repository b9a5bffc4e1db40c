"""What apex.amp's opt levels did and the torch.amp code that does the same today (notebook 04):
the migration map, which GPUs have bf16, and what importing ``apex.amp`` does on this machine."""

from __future__ import annotations

import importlib

import torch

# Apex removed apex.amp here; everything below is what a reader migrating old code needs.
REMOVAL = {"commit": "cb65b8ed", "pull_request": "NVIDIA/apex#1896", "date": "2025-05-08",
           "last_commit_with_amp": "e13873debc4699d39c6861074b9a3b2a02327f92"}

# Per opt level: what it cast, where the master weights lived, how the loss was scaled, and
# the torch.amp code that replaces it. The ``options`` are the defaults the legacy
# ``apex.amp.frontend`` sets; the notebook compares them with what the legacy Apex reports.
OPT_LEVELS: list[dict] = [
    {
        "opt_level": "O0",
        "what_it_cast": "nothing: fp32 weights and fp32 math (the baseline)",
        "master_weights": "none needed: the fp32 model weights",
        "loss_scaling": "none (static 1.0)",
        "torch_amp_today": "plain fp32 training: no autocast, no GradScaler",
        "options": {"cast_model_type": "float32", "patch_torch_functions": False,
                    "keep_batchnorm_fp32": None, "master_weights": False, "loss_scale": 1.0},
    },
    {
        "opt_level": "O1",
        "what_it_cast": "patched torch functions: matmul/linear/conv inputs to fp16; softmax, "
                        "norms, exp/log, reductions and losses to fp32; weights stay fp32",
        "master_weights": "none needed: the fp32 model weights",
        "loss_scaling": "dynamic (start 2**16, halve on overflow and skip the step, "
                        "double after 2000 clean steps)",
        "torch_amp_today": "with torch.autocast('cuda', dtype=torch.float16): loss = ...; "
                           "scaler = torch.amp.GradScaler('cuda'); "
                           "scaler.scale(loss).backward(); scaler.step(opt); scaler.update()  "
                           "# or dtype=torch.bfloat16 without a scaler",
        "options": {"cast_model_type": None, "patch_torch_functions": True,
                    "keep_batchnorm_fp32": None, "master_weights": None,
                    "loss_scale": "dynamic"},
    },
    {
        "opt_level": "O2",
        "what_it_cast": "the model itself to fp16 (BatchNorm kept fp32); inputs cast to fp16 "
                        "and outputs to fp32 by a patched forward",
        "master_weights": "fp32 copies inside the optimizer (amp swapped its param groups)",
        "loss_scaling": "dynamic (as O1)",
        "torch_amp_today": "same code as O1: the fp32 model's weights are the master copies "
                           "and autocast casts them per op; hand-written fp16 weights + fp32 "
                           "masters only where weight memory must shrink",
        "options": {"cast_model_type": "float16", "patch_torch_functions": False,
                    "keep_batchnorm_fp32": True, "master_weights": True,
                    "loss_scale": "dynamic"},
    },
    {
        "opt_level": "O3",
        "what_it_cast": "everything to fp16, BatchNorm included (pure fp16)",
        "master_weights": "none: the optimizer updates fp16 weights",
        "loss_scaling": "none (static 1.0)",
        "torch_amp_today": "no torch.amp equivalent on purpose; model.half() by hand if you "
                           "must, or bf16 weights with fp32 master copies",
        "options": {"cast_model_type": "float16", "patch_torch_functions": False,
                    "keep_batchnorm_fp32": False, "master_weights": False, "loss_scale": 1.0},
    },
]

# Compute capability per GPU generation (examples are common parts of that generation).
GPU_GENERATIONS: list[tuple[str, str, tuple[int, int]]] = [
    ("Volta", "V100", (7, 0)),
    ("Turing", "T4, RTX 20xx", (7, 5)),
    ("Ampere", "A100, A30", (8, 0)),
    ("Ampere", "A10, A40, RTX 30xx", (8, 6)),
    ("Ada Lovelace", "L4, L40S, RTX 40xx", (8, 9)),
    ("Hopper", "H100, H200", (9, 0)),
    ("Blackwell", "B200, GB200", (10, 0)),
    ("Blackwell", "RTX 50xx, RTX PRO 6000", (12, 0)),
]


def bf16_native(capability: tuple[int, int]) -> bool:
    """True when a GPU of this compute capability has bf16 tensor cores (8.0 or newer)."""
    return tuple(capability) >= (8, 0)


def migration_table():
    """The migration map as a pandas table (one row per opt level)."""
    import pandas as pd

    cols = ["opt_level", "what_it_cast", "master_weights", "loss_scaling", "torch_amp_today"]
    return pd.DataFrame([{c: row[c] for c in cols} for row in OPT_LEVELS])


def bf16_table():
    """Which GPU generations have native bf16, plus a row for this machine, computed."""
    import pandas as pd

    rows = [{"generation": gen, "examples": ex, "compute_capability": f"{cc[0]}.{cc[1]}",
             "bf16_native": bf16_native(cc)} for gen, ex, cc in GPU_GENERATIONS]
    if torch.cuda.is_available():
        cc = torch.cuda.get_device_capability()
        rows.append({"generation": "this machine", "examples": torch.cuda.get_device_name(),
                     "compute_capability": f"{cc[0]}.{cc[1]}", "bf16_native": bf16_native(cc)})
    else:
        rows.append({"generation": "this machine", "examples": "no CUDA GPU (CPU autocast "
                     "runs bf16 in software)", "compute_capability": "-", "bf16_native": False})
    return pd.DataFrame(rows)


def options_check(reported: dict[str, dict]) -> list[dict]:
    """Compare the options each opt level set in the legacy Apex (``reported``: level ->
    options) with the map above; one row per (level, option) with ``matches``."""
    rows = []
    for entry in OPT_LEVELS:
        got = reported.get(entry["opt_level"])
        if got is None:
            continue
        for key, expected in entry["options"].items():
            rows.append({"opt_level": entry["opt_level"], "option": key,
                         "map_says": expected, "apex_set": got.get(key),
                         "matches": got.get(key) == expected})
    return rows


def apex_amp_import() -> str:
    """What ``from apex import amp`` does in this process: 'ok (...)' or the one-line error."""
    try:
        apex = importlib.import_module("apex")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    try:
        from apex import amp  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return f"ok: apex.amp imports (from {apex.__file__})"
