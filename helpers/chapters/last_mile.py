"""Notebook 08's readings: what the last mile of MFU measures, but does not teach.

The levers themselves (the attention functions, the loss, the batch, the compile modes, float8)
and the rule that keeps one are written in the notebook's cells; the model, the recipe and the
run record are :mod:`helpers.gpt`'s and :mod:`helpers.bench`'s, the time breakdown is
:mod:`helpers.kernels`' (split into matmuls, attention and everything else by notebook 05's
reading, which the notebook calls). This module holds what is left:

- what this machine has for the optional levers: FlashAttention-3/4 behind
  ``torch.nn.attention.activate_flash_attention_impl`` (:func:`flash_impls`), torchao's float8
  training (:func:`float8_lack`), and the one check that a step never waits for the GPU
  (:func:`first_sync`);
- the timing of candidates in interleaved rounds, per the same number of sequences
  (:func:`step_rounds`), and the rule's two answers read together (:func:`kept`);
- the tables: one lever's numbers (:func:`record`), the chain of kept levers with each one's
  gain (:func:`chain_table`), what the breakdown leaves for the levers not built
  (:func:`bounds`), MFU against the width (:func:`width_table`) and the same MFU counted the
  way nanoGPT and PaLM count attention (:func:`full_attention_factor`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import math
import warnings
from collections.abc import Callable

import pandas as pd
import torch

from helpers import bench, ceilings, gpt, kernels, machine

# ------------------------------------------------------------------ what this machine has
FLASH_MODULES = {"FA3": "flash_attn_interface", "FA4": "flash_attn.cute.interface"}
FLASH_INSTALL = "pip install flash-attn-4 (FA4; FA3 is built from the flash-attention repository)"


def _importable(module: str) -> bool:
    """True when ``module`` can be found without importing it (its parent packages are)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken one
        return False


def flash_impls() -> tuple[list[str], str]:
    """The FlashAttention implementations this torch can switch SDPA's flash kernel to
    (``torch.nn.attention.activate_flash_attention_impl``) and whose package is installed, in
    the order tried, and one clause saying what is missing when there is none ('' otherwise)."""
    attention = torch.nn.attention
    if not torch.cuda.is_available():
        return [], "a CUDA GPU"
    if not hasattr(attention, "activate_flash_attention_impl"):
        return [], (f"a torch with torch.nn.attention.activate_flash_attention_impl (this is "
                    f"{torch.__version__}: upgrade torch)")
    registered = set(attention.list_flash_attention_impls())
    found = [impl for impl, module in FLASH_MODULES.items()
             if impl in registered and _importable(module)]
    return found, "" if found else f"FlashAttention-3 or -4 installed ({FLASH_INSTALL})"


def float8_lack() -> str:
    """'' when torchao's float8 training API imports; else the clause with the fix. The import
    runs with its messages held back (torchao logs each of its optional C++ libraries that was
    not built for this machine; the float8 recipes do not use them): only a failure speaks."""
    machine.quiet_torchao()  # torch's log handler writes to the stderr it was made with
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()), \
                kernels.quiet_stderr():
            warnings.simplefilter("ignore")
            importlib.import_module("torchao.float8").convert_to_float8_training  # noqa: B018
    except Exception as exc:  # noqa: BLE001 - any import failure means the same: not usable
        return f"torchao's float8 training ({type(exc).__name__}: pip install torchao)"
    return ""


def attention_kernels(fn: Callable[[], object], device: torch.device) -> list[str]:
    """The distinct GPU kernels that ``fn()`` launches in the breakdown's attention category
    (:func:`helpers.kernels.categorize`), short names in launch order: which kernel SDPA
    picked. CUDA only; ``fn`` runs once untraced first."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize(device)
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with kernels.quiet_profiler(), profile(activities=activities) as prof:
        fn()
        torch.cuda.synchronize(device)
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return list(dict.fromkeys(kernels.short_name(n) for n in names
                              if kernels.categorize(n) == "attention"))


def first_sync(step: Callable[[], object]) -> str:
    """Run ``step()`` once with CUDA's synchronisation check set to fail on the first operation
    that makes the host wait for the GPU; '' when there was none, else that error's first line
    (the operation and where). CUDA only."""
    torch.cuda.synchronize()
    with warnings.catch_warnings():  # torch's note that the check is a prototype, each switch
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
        except RuntimeError as exc:
            return str(exc).strip().splitlines()[0]
        finally:
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
    return ""


# ------------------------------------------------------------------ timing and the rule
def step_rounds(steps: dict[str, Callable[[], object]], sequences: dict[str, int], *, per: int,
                rounds: int, repeats: int, device: torch.device) -> dict[str, list[float]]:
    """Each candidate's training step timed in ``rounds`` interleaved rounds
    (:func:`helpers.bench.interleaved`: one warm-up and ``repeats`` timed steps per candidate
    and round, a first round thrown away, no L2 flush - training does not flush either), as
    each round's median in ms per ``per`` sequences: a step of ``sequences[name]`` sequences
    is scaled by ``per / sequences[name]``, so a larger batch is read per token."""
    timings = bench.interleaved(steps, rounds=rounds, warmup=1, repeats=repeats, flush=False,
                                device=device)
    return {name: [ms * per / sequences[name] for ms in medians]
            for name, medians in bench.round_medians(timings).items()}


def kept(time_answer: dict, loss_answer: dict) -> bool:
    """The chapter's rule: a lever stays when its step is faster (the time answer's verdict)
    and it learns the same (the loss answer's verdict 'same'); anything else - slower, the
    same speed, cannot tell, another loss, not measured - leaves the best so far as it was."""
    return time_answer["verdict"] == "faster" and loss_answer["verdict"] == "same"


# ------------------------------------------------------------------ tables
RECORD_COLUMNS = ["setup", "sequences", "step_ms", "tokens_per_s", "mfu", "matmul_ms",
                  "attention_ms", "rest_ms", "idle_ms", "optimizer_ms", "attention_vs_ceiling",
                  "peak_mem_gib", "compile_s", "val_loss"]


def record(paths_row: pd.Series, breakdown: pd.DataFrame, limits: pd.DataFrame,
           sequences: int) -> dict:
    """One measured setup's numbers: from its row of ``gpt.paths_table`` (step time, tokens/s,
    MFU, memory, compile time, validation loss), its time breakdown (notebook 05's
    ``breakdown_table``: the idle GPU and the optimizer's kernels) and its split into the
    parameter matmuls, attention and everything else (05's ``mfu_limits``, with attention's
    rate over the measured matmul ceiling). NaN where a part was not measured."""
    nan = math.nan
    parts = limits.set_index("part") if not limits.empty else pd.DataFrame()

    def part(name: str, column: str = "ms") -> float:
        return float(parts.loc[name, column]) if name in parts.index else nan

    b = breakdown.iloc[0] if not breakdown.empty else {}
    gap = float(b.get("gap_ms", nan))  # the untraced step less the traced kernels: idle, or
    # below zero when the kernels' sum (traced, a little slower) is longer than the step
    return {"setup": str(paths_row["label"]), "sequences": sequences,
            "step_ms": float(paths_row.get("step_ms", nan)),
            "tokens_per_s": float(paths_row.get("tokens_per_s", nan)),
            "mfu": float(paths_row.get("mfu", nan)),
            "matmul_ms": part("parameter matmuls"), "attention_ms": part("attention"),
            "rest_ms": part("everything else"), "idle_ms": 0.0 if gap < 0 else gap,
            "optimizer_ms": float(b.get("optimizer_ms", nan)),
            "attention_vs_ceiling": part("attention", "vs_burst_ceiling"),
            "peak_mem_gib": float(paths_row.get("peak_mem_gib", nan)),
            "compile_s": float(paths_row.get("compile_s", nan)),
            "val_loss": float(paths_row.get("final_val_loss", nan))}


def chain_table(chain: list[tuple[dict, dict | None]], per: int) -> pd.DataFrame:
    """The levers kept, in order: each setup's record with ``ms_per_batch`` (its step time per
    ``per`` sequences), ``gain_x`` - the previous best's time over its own, the median of the
    interleaved rounds' ratios its time answer holds (NaN for the starting point) - and
    ``total_x``, the starting point's ``ms_per_batch`` over its own."""
    rows = []
    for rec, answer in chain:
        row = {**rec, "ms_per_batch": rec["step_ms"] * per / rec["sequences"],
               "gain_x": 1 / answer["ratio"] if answer else math.nan}
        rows.append(row)
    table = pd.DataFrame(rows)
    if not table.empty:
        table["total_x"] = table["ms_per_batch"].iloc[0] / table["ms_per_batch"]
    return table


def bounds(rec: dict) -> dict[str, float]:
    """What the breakdown of one step leaves for the levers that remove host work or launches
    (the idle GPU: CUDA graphs, fewer host synchronisations) and for a faster optimizer (its
    kernels, clipping included), each as a share of the step: no such lever can save more."""
    step = rec["step_ms"]
    return {"idle": rec["idle_ms"] / step, "optimizer": rec["optimizer_ms"] / step}


WIDTH_COLUMNS = ["setup", "d_model", "n_head", "params_m", "gflop_per_token", "status", "step_ms",
                 "tokens_per_s", "mfu", "peak_mem_gib", "compile_s"]


def width_table(runs: dict[str, bench.Run], cfgs: dict[str, gpt.GPTConfig],
                peak_tflops: float) -> pd.DataFrame:
    """One row per run of the width sweep (name -> run, name -> its model's shape): width,
    heads, parameters outside the embeddings, FLOPs per token, step time, tokens/s and MFU
    (``ceilings.mfu`` against ``peak_tflops``), peak memory and compile time; a run that
    failed keeps its row with its one-line reason in ``status``."""
    rows = []
    for name, run in runs.items():
        cfg = cfgs[name]
        row = {"setup": name, "d_model": cfg.d_model, "n_head": cfg.n_head,
               "params_m": gpt.non_embedding_params(cfg) / 1e6,
               "gflop_per_token": gpt.flops_per_token(cfg) / 1e9,
               "status": run.status()}
        if run.ok:
            row.update(step_ms=run.timing.median_ms, tokens_per_s=run.tokens_per_s,
                       mfu=ceilings.mfu(gpt.flops_per_token(cfg), run.tokens_per_s, peak_tflops),
                       peak_mem_gib=run.peak_mem_gib,
                       compile_s=run.extra.get("compile_s", math.nan))
        rows.append(row)
    return pd.DataFrame(rows, columns=WIDTH_COLUMNS)


def full_attention_factor(cfg: gpt.GPTConfig) -> float:
    """How much higher the same run's MFU reads when attention is counted as 12 L d T FLOPs per
    token (the PaLM paper's and nanoGPT's count, as if the causal mask saved nothing) instead of
    the course's 6 L d T (``gpt.flops_per_token``): compare MFU figures only under one count."""
    return (gpt.flops_per_token(cfg) + 6 * cfg.n_layer * cfg.d_model * cfg.seq_len) \
        / gpt.flops_per_token(cfg)
