"""Notebook 05's tables and verdict: MFU against a stated peak, speedups, the time breakdown.

MFU (model FLOPs utilisation) = FLOPs per token (``gpt.flops_per_token``: 6 N + 6 L d T) x
tokens per second / peak FLOP/s. The peak is the dense bf16 tensor-core figure of the GPU's
datasheet when the GPU is in :data:`DATASHEET_BF16_TFLOPS`, else the measured bf16 matmul
ceiling of ``roofline.measure_ceilings()`` - or, where no bf16 rate was measured (a CPU without
bf16 matrix units), the measured fp32 one - and the notebook prints which. Every path, fp32 ones
included, is measured against that same peak.
"""

from __future__ import annotations

import math
import re

import pandas as pd

from helpers.breakdown import NAMES
from helpers.fusion import TIE_FRACTION, compare, is_tie, tied_with_fastest
from helpers.gpt import flops_per_token

# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, from NVIDIA datasheets. A key matches when
# its words appear as whole words, in order, in the device name ("L4" does not match "L40", nor
# "A10" "A10G", which is left out: it falls back to the measured ceiling); first match wins, so
# the longer keys of a family come first.
DATASHEET_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H200 NVL", 835.0),
    ("GH200", 989.0), ("H100", 989.0), ("H200", 989.0),
    ("A100", 312.0), ("L40S", 362.0), ("L40", 181.05), ("L4", 121.0), ("A10", 125.0),
)


def _words(name: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", name.lower())


def datasheet_match(key: str, device_name: str) -> bool:
    """True when the words of ``key`` appear, consecutive and whole, in ``device_name``."""
    k, n = _words(key), _words(device_name)
    return bool(k) and any(n[i:i + len(k)] == k for i in range(len(n) - len(k) + 1))


def peak_bf16_tflops(device_name: str, ceilings: dict | None = None) -> tuple[float, str]:
    """The peak MFU is measured against, and where it came from."""
    for key, value in DATASHEET_BF16_TFLOPS:
        if datasheet_match(key, device_name):
            return value, f"datasheet dense bf16 peak of the {key}"
    rates = (ceilings or {}).get("matmul_tflops", {})
    if "bf16" in rates:
        return float(rates["bf16"]), "measured bf16 matmul ceiling (GPU not in the datasheet table)"
    if "fp32" in rates:
        return float(rates["fp32"]), "measured fp32 matmul ceiling (no bf16 tensor cores here)"
    raise ValueError(f"no peak known for '{device_name}' and no measured ceilings given")


def mfu(tokens_per_s: float, cfg, peak_tflops: float) -> float:
    """Model FLOPs utilisation as a fraction of ``peak_tflops``."""
    return flops_per_token(cfg) * tokens_per_s / (peak_tflops * 1e12)


def paths_table(runs: list, exp, peak_tflops: float) -> pd.DataFrame:
    """One row per path (skipped paths keep a row with their reason)."""
    rows = []
    for run in runs:
        row = {"path": run.path.key, "label": run.path.label, "status": run.skipped or "ran"}
        if not run.skipped:
            tokens_per_s = exp.tokens_per_step / (run.timing.median_ms / 1e3)
            row.update(step_ms=run.timing.median_ms, step_ms_iqr=run.timing.iqr_ms,
                       step_ms_q1=run.timing.q1_ms, step_ms_q3=run.timing.q3_ms,
                       tokens_per_s=tokens_per_s, mfu=mfu(tokens_per_s, exp.cfg, peak_tflops),
                       peak_mem_gib=run.peak_mem_gib, final_train_loss=run.final_train_loss,
                       final_val_loss=run.val_loss, compile_s=run.compile_s,
                       first_step_s=run.first_step_s, wall_s=run.wall_s, steps=exp.hp.steps,
                       batch_checksum=str(run.checksum))
        rows.append(row)
    table = pd.DataFrame(rows)
    if "step_ms" not in table:
        table["step_ms"] = math.nan
    base = table.loc[table["path"] == "1", "step_ms"]
    base_ms = float(base.iloc[0]) if len(base) else math.nan
    table["speedup_vs_fp32"] = base_ms / table["step_ms"]
    return table


def breakdown_table(runs: list) -> pd.DataFrame:
    """Per-step kernel time by category next to the step time, one row per profiled path.

    On CUDA the reference is the untraced median step time (kernel durations are not slowed by
    the profiler); on the CPU it is the traced step time, since tracing slows the operators
    themselves down.
    """
    rows = []
    for run in runs:
        if run.skipped or not run.breakdown:
            continue
        b = run.breakdown
        row = {"path": run.path.key, "label": run.path.label}
        row.update({f"{k}_ms": b[f"{k}_ms"] for k in NAMES})
        on_cuda = b.get("device") == "cuda"
        step_ms = run.timing.median_ms if on_cuda else b["traced_step_ms"]
        row.update(kernel_ms=b["kernel_ms"], step_ms=step_ms, gap_ms=step_ms - b["kernel_ms"],
                   busy_pct=100.0 * b["kernel_ms"] / step_ms,
                   kernels_per_step=b["kernels_per_step"], traced_step_ms=b["traced_step_ms"],
                   step_reference="untraced median" if on_cuda else "traced",
                   device=b.get("device", "cpu"))
        rows.append(row)
    return pd.DataFrame(rows)


def _step_iqr(row: pd.Series) -> tuple[float, float] | None:
    """A row's (first, third) quartile of the step time, when the table has them."""
    q1, q3 = row.get("step_ms_q1", math.nan), row.get("step_ms_q3", math.nan)
    return None if math.isnan(q1) or math.isnan(q3) else (float(q1), float(q3))


def fastest_paths(table: pd.DataFrame) -> list[str]:
    """The fastest path that ran, then those :func:`helpers.fusion.is_tie` cannot tell apart from
    it (step-time IQRs used when the table has them); empty when no path ran."""
    ran = table[table["status"] == "ran"]
    if ran.empty:
        return []
    timings = ran.rename(columns={"step_ms": "median_ms", "step_ms_q1": "q1_ms",
                                  "step_ms_q3": "q3_ms"})
    return tied_with_fastest(timings, key="path")


def verdict(table: pd.DataFrame) -> str:
    """Sentences built from the run's numbers: fastest path, Apex vs native (step time through
    :func:`helpers.fusion.compare`, and peak memory), against the FP32 baseline when it ran."""
    ran = table[table["status"] == "ran"]
    if ran.empty:
        return "No path ran, so there is nothing to compare."
    tied = fastest_paths(table)
    by = ran.set_index("path")
    fastest = by.loc[tied[0]]
    speedup = fastest.get("speedup_vs_fp32", math.nan)
    versus = (f", {speedup:.2f}x the FP32 baseline" if tied[0] != "1" and not math.isnan(speedup)
              else "")
    first = (f"On this run the fastest path was {tied[0]} ({fastest['label']}) at "
             f"{fastest['step_ms']:.1f} ms per step, {fastest['mfu']:.1%} MFU{versus}.")
    if len(tied) > 1:
        others = (f"Path {tied[1]}" if len(tied) == 2 else
                  f"Paths {', '.join(tied[1:-1])} and {tied[-1]}")
        first += (f" {others} cannot be told apart from it (medians within {TIE_FRACTION:.0%} "
                  "or step-time IQRs overlapping).")
    lines = [first]
    if {"2", "3"} <= set(by.index):
        r2, r3 = by.loc["2"], by.loc["3"]
        ms2, ms3 = float(r2["step_ms"]), float(r3["step_ms"])
        iqr2, iqr3 = _step_iqr(r2), _step_iqr(r3)
        faster = ms2 < ms3 and not is_tie(ms2, ms3, a_iqr=iqr2, b_iqr=iqr3)
        lines.append(f"{compare('Path 2', ms2, 'path 3', ms3, a_iqr=iqr2, b_iqr=iqr3)}: on this "
                     f"GPU Apex's FusedAdam and fused LayerNorm are "
                     f"{'faster' if faster else 'not faster'} than PyTorch's own fused AdamW "
                     "and LayerNorm.")
        mem2 = float(r2.get("peak_mem_gib", math.nan))
        mem3 = float(r3.get("peak_mem_gib", math.nan))
        if not (math.isnan(mem2) or math.isnan(mem3)):
            diff = mem2 - mem3
            how = ("the same" if abs(diff) < 0.005 else
                   f"{abs(diff):.2f} GiB {'less' if diff < 0 else 'more'} for path 2")
            lines.append(f"Peak memory: path 2 {mem2:.2f} GiB, path 3 {mem3:.2f} GiB ({how}).")
    else:
        lines.append("Apex and native could not both run here, so there is no Apex verdict.")
    return "\n".join(lines)


def compare_breakdown(table: pd.DataFrame, a: str = "2", b: str = "3") -> str:
    """Explain the step-time difference of paths ``a`` and ``b`` from their breakdown rows."""
    rows = table.set_index("path") if not table.empty else table
    if a not in rows.index or b not in rows.index:
        return f"Paths {a} and {b} were not both profiled, so there is nothing to compare."
    ra, rb = rows.loc[a], rows.loc[b]
    diffs = {k: ra[f"{k}_ms"] - rb[f"{k}_ms"] for k in NAMES}
    top = max(diffs, key=lambda k: abs(diffs[k]))
    step_diff = ra["step_ms"] - rb["step_ms"]
    kernel_diff = ra["kernel_ms"] - rb["kernel_ms"]
    gap_diff = ra["gap_ms"] - rb["gap_ms"]
    on_cuda = ra.get("device", "cuda") == "cuda"
    inside, outside = (("kernels", "idle GPU time (CPU-side overhead)") if on_cuda
                       else ("ATen operators", "time outside operators (Python, dispatch)"))
    cause = inside if abs(kernel_diff) >= abs(gap_diff) else outside
    text = (f"Path {a} vs path {b}: step {step_diff:+.2f} ms, of which {inside} "
            f"{kernel_diff:+.2f} ms and the rest {gap_diff:+.2f} ms; most of the difference is "
            f"in {cause}. The category that differs most is {top} ({diffs[top]:+.2f} ms per step)")
    if on_cuda:
        text += (f"; kernel launches per step: {ra['kernels_per_step']:.0f} vs "
                 f"{rb['kernels_per_step']:.0f}")
    return text + "."


def targets(table: pd.DataFrame, applies: bool = True) -> str:
    """The course's H200 targets, each marked met / missed / not measured, with the number."""
    if not applies:
        return "The course's targets (MFU, Apex vs FP32 and native) are set for the full profile "\
               "on a GPU; this run is not one, so they are not evaluated."
    by = table[table["status"] == "ran"].set_index("path")
    lines = []

    def mark(ok: bool | None) -> str:
        return "not measured here" if ok is None else ("met" if ok else "MISSED")

    best = by["mfu"].max() if "mfu" in by and len(by) else math.nan
    lines.append(f"fastest path >= 45% MFU: {mark(None if math.isnan(best) else best >= 0.45)} "
                 f"(best {best:.1%})")
    if {"1", "2"} <= set(by.index):
        x = by.loc["2", "speedup_vs_fp32"]
        lines.append(f"path 2 >= 5x path 1: {mark(x >= 5)} ({x:.2f}x)")
    else:
        lines.append("path 2 >= 5x path 1: not measured here")
    if {"2", "3"} <= set(by.index):
        r = by.loc["2", "step_ms"] / by.loc["3", "step_ms"]
        lines.append(f"path 2 at most 10% slower than path 3: {mark(r <= 1.10)} "
                     f"(step-time ratio {r:.3f})")
    else:
        lines.append("path 2 at most 10% slower than path 3: not measured here")
    spread = val_loss_spread(table)
    if math.isnan(spread):
        lines.append("validation losses within 2%: not measured here")
    else:
        lines.append(f"validation losses within 2% of each other: {mark(spread <= 0.02)} "
                     f"(spread {spread:.2%})")
    return "\n".join(lines)


def val_loss_spread(table: pd.DataFrame) -> float:
    """(largest / smallest final validation loss) - 1 over the paths that ran; NaN under two."""
    losses = table.loc[table["status"] == "ran", "final_val_loss"] if "final_val_loss" in table \
        else pd.Series(dtype=float)
    if len(losses) < 2:
        return math.nan
    return float(losses.max() / losses.min() - 1)


def summary(table: pd.DataFrame, *, where: str, tokens_per_step: int, steps: int) -> str:
    """The notebook's closing lines: every path that ran, compile payback, fastest, loss spread.
    Speedups over path 1 are left out where path 1 did not run."""
    ran = table[table["status"] == "ran"]
    if ran.empty:
        return f"No path ran on this run ({where}), so there is nothing to summarise."
    by_path = ran.set_index("path")
    lines = [f"On this run ({where}, {tokens_per_step} tokens per step, {steps} steps per path):"]
    for key, row in by_path.iterrows():
        speedup = float(row.get("speedup_vs_fp32", math.nan))
        versus = "" if key == "1" or math.isnan(speedup) else f", {speedup:.2f}x path 1"
        lines.append(f"- path {key} ({row['label']}): {row['step_ms']:.1f} ms/step, "
                     f"{row['tokens_per_s']:,.0f} tokens/s, MFU {row['mfu']:.1%}{versus}, "
                     f"val loss {row['final_val_loss']:.3f}")
    if {"3", "4"} <= set(by_path.index):
        r3, r4 = by_path.loc["3"], by_path.loc["4"]
        saved_s = (r3["step_ms"] - r4["step_ms"]) / 1e3
        tie = is_tie(float(r4["step_ms"]), float(r3["step_ms"]), a_iqr=_step_iqr(r4),
                     b_iqr=_step_iqr(r3))
        payback = (f"paid back after {r4['compile_s'] / saved_s:.0f} steps" if saved_s > 0
                   and not tie else "never paid back: path 4 was not measurably faster than "
                   "path 3")
        lines.append(f"- torch.compile took {r4['compile_s']:.1f} s, {payback}")
    tied = fastest_paths(table)
    fastest = f"path {tied[0]}" + (f" (indistinguishable from {', '.join(tied[1:])})"
                                   if len(tied) > 1 else "")
    spread = val_loss_spread(table)
    losses = "" if math.isnan(spread) else f"; validation losses differ by {spread:.2%}"
    lines.append(f"- fastest: {fastest}{losses}")
    return "\n".join(lines)


def _rate(tflops: float) -> str:
    return f"{tflops:.0f} TFLOP/s" if tflops >= 1 else f"{tflops * 1e3:.0f} GFLOP/s"


def mfu_limits(breakdown: pd.DataFrame, table: pd.DataFrame, cfg, tokens_per_step: int,
               peak_tflops: float, matmul_ceiling_tflops: float | None = None) -> str:
    """What holds the fastest profiled path's MFU down, from its kernel-time breakdown.

    FLOPs counted as in :func:`mfu`: the parameter matmuls 6 N per token (N = non-embedding
    parameters plus the tied head's d x V) and attention 6 L d T per token. Everything else the
    step runs (norms, element-wise, optimizer, copies) does no counted FLOPs, so its time is
    time the tensor cores are idle.
    """
    ran = table[table["status"] == "ran"]
    profiled = ran[ran["path"].isin(set(breakdown["path"]))] if not breakdown.empty else ran[:0]
    if profiled.empty:
        return "No path was profiled, so what limits MFU is not measured here."
    fastest = profiled.loc[profiled["step_ms"].idxmin()]
    row = breakdown.set_index("path").loc[fastest["path"]]
    attention_per_token = 6 * cfg.n_layer * cfg.d_model * cfg.seq_len
    matmul_flops = (flops_per_token(cfg) - attention_per_token) * tokens_per_step
    attention_flops = attention_per_token * tokens_per_step
    step_ms = float(row["step_ms"])
    mm_ms, att_ms = float(row["matmul_ms"]), float(row["attention_ms"])
    rest_ms = step_ms - mm_ms - att_ms
    lines = [f"What limits path {fastest['path']} ({fastest['label']}, {fastest['mfu']:.1%} MFU), "
             f"per step of {step_ms:.1f} ms:"]
    if mm_ms > 0:
        rate = matmul_flops / (mm_ms * 1e-3) / 1e12
        ceiling = (f", {rate / matmul_ceiling_tflops:.0%} of the measured bf16 matmul ceiling"
                   if matmul_ceiling_tflops else "")
        lines.append(f"- parameter matmuls: {mm_ms:.1f} ms ({mm_ms / step_ms:.0%} of the step) at "
                     f"{_rate(rate)}{ceiling}, {rate / peak_tflops:.0%} of the "
                     f"{_rate(peak_tflops)} peak")
    if att_ms > 0:
        rate = attention_flops / (att_ms * 1e-3) / 1e12
        lines.append(f"- attention: {att_ms:.1f} ms ({att_ms / step_ms:.0%}) at {_rate(rate)}")
    others = {k: float(row[f"{k}_ms"]) for k in NAMES if k not in ("matmul", "attention")}
    top = ", ".join(f"{k} {v:.1f}" for k, v in sorted(others.items(), key=lambda kv: -kv[1]))
    what = ("kernels that do no counted FLOPs, or an idle GPU" if row.get("device") == "cuda"
            else "operators that do no counted FLOPs, or time outside operators")
    lines.append(f"- everything else: {rest_ms:.1f} ms ({rest_ms / step_ms:.0%}) of {what} "
                 f"(ms: {top}; gap {float(row['gap_ms']):.1f})")
    if mm_ms + att_ms > 0:
        bound = (matmul_flops + attention_flops) / ((mm_ms + att_ms) * 1e-3) / 1e12 / peak_tflops
        lines.append(f"Even if everything else took no time, this path would reach {bound:.0%} "
                     "MFU; the rest of the distance to the peak is the matmul and attention "
                     "kernels' own.")
    return "\n".join(lines)
