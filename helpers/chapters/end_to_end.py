"""Notebook 05's readings: what the end-to-end comparison measures, but does not teach.

The model, the corpus, the batch plan, the recipe and the paths table it shares with notebooks
06 and 07 are :mod:`helpers.gpt`'s. This module reads one run of the notebook's paths; which
path plays which part (:class:`Roles`: the baseline, the Apex and native paths, the compiled
one) and the goals it is held to (:class:`Targets`) are the notebook's, passed in:

- memory: the size of the score matrix written-out attention would hold
  (:func:`score_matrix_bytes`) and the bytes autograd saves for backward (:func:`saved_bytes`);
- the time breakdown: per-category kernel time next to the step (:func:`breakdown_table`), its
  stacked chart (:func:`breakdown_chart`) and two paths' difference explained
  (:func:`compare_breakdown`);
- the readings, all computed from the run's tables: the verdict (:func:`verdict`, step times by
  the tie rule of :mod:`helpers.verdicts`), each target met or missed (:func:`targets`), what
  holds the fastest path's MFU down (:func:`mfu_limits`) and the closing lines
  (:func:`summary`), with the validation losses read against the run's noise floor
  (:func:`loss_reading`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from helpers import bench, gpt, kernels, verdicts


@dataclass(frozen=True)
class Roles:
    """Which of the notebook's paths plays which part in the readings: ``baseline`` is the one
    every speedup is over (``baseline_name`` in a sentence), ``apex`` and ``native`` the two the
    verdict compares, ``compiled`` the one whose compile time the summary sets against the step
    time it saves over ``native``."""

    baseline: str
    apex: str
    native: str
    compiled: str
    baseline_name: str


@dataclass(frozen=True)
class Targets:
    """The goals :func:`targets` marks met or MISSED: the fastest path at ``mfu`` MFU or more,
    the Apex path at least ``speedup`` times the baseline, at most ``slower`` (a fraction)
    slower than the native path, and validation losses within ``val_loss`` of each other."""

    mfu: float
    speedup: float
    slower: float
    val_loss: float


# ------------------------------------------------------------------ memory
def score_matrix_bytes(cfg: gpt.GPTConfig, batch: int, bytes_per_element: int = 4) -> int:
    """Size of one layer's attention score matrix, batch x heads x T x T, as written-out
    attention (``gpt.manual_attention``) materialises it; the flash and memory-efficient kernels
    behind ``gpt.sdpa_attention`` work through it in tiles and never hold it whole."""
    return batch * cfg.n_head * cfg.seq_len * cfg.seq_len * bytes_per_element


def saved_bytes(fn: Callable[[], object]) -> int:
    """Bytes of the tensors autograd keeps for the backward pass while ``fn()`` runs (each tensor
    counted once; parameters and views of them left out, they exist anyway): activation
    memory, measured."""
    seen: dict[tuple, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t if t._base is None else t._base, nn.Parameter):
            seen[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


# ------------------------------------------------------------------ where the time goes
def breakdown_table(runs: dict[str, bench.Run]) -> pd.DataFrame:
    """Per-step kernel time by category (``extra['breakdown']``, from ``kernels.profile_steps``)
    next to the step time, one row per profiled path.

    On CUDA the step time is the untraced median (kernel durations are not slowed by the
    profiler); on the CPU the traced step, since tracing slows the operators themselves down."""
    rows = []
    for key, run in runs.items():
        b = run.extra.get("breakdown") if run.ok else None
        if not b:
            continue
        on_cuda = b.get("device") == "cuda"
        step_ms = run.timing.median_ms if on_cuda else b["traced_step_ms"]
        rows.append({"path": key, "label": run.label,
                     **{f"{k}_ms": b[f"{k}_ms"] for k in kernels.NAMES},
                     "kernel_ms": b["kernel_ms"], "step_ms": step_ms,
                     "gap_ms": step_ms - b["kernel_ms"],
                     "busy_pct": 100.0 * b["kernel_ms"] / step_ms,
                     "kernels_per_step": b["kernels_per_step"],
                     "traced_step_ms": b["traced_step_ms"],
                     "step_reference": "untraced median" if on_cuda else "traced",
                     "device": b.get("device", "cpu")})
    return pd.DataFrame(rows)


def breakdown_chart(breakdown: pd.DataFrame, ax=None):
    """Stacked bars of shares: per path, each kernel category's and the gap's part of the step,
    in percent, with the step time in ms above the bar - so a 430 ms path and a 48 ms one are
    both readable on one axis."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8.5, 3.6))
    names = breakdown["path"] + ": " + breakdown["label"]
    on_cuda = (breakdown["device"] == "cuda").all()
    gap = "idle GPU (gap)" if on_cuda else "outside operators (gap)"
    parts = [(k, breakdown[f"{k}_ms"]) for k in kernels.NAMES]
    parts.append((gap, breakdown["gap_ms"].clip(lower=0.0)))
    whole = sum(values for _, values in parts)  # the step, or the kernels when they exceed it
    bottom = pd.Series(0.0, index=breakdown.index)
    for name, values in parts:
        share = 100 * values / whole
        ax.bar(names, share, bottom=bottom, label=name)
        bottom = bottom + share
    for x, ms in enumerate(breakdown["step_ms"]):
        ax.annotate(f"{ms:.3g} ms", (x, 100), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 112)
    ax.set_ylabel("share of a training step (%)")
    ax.set_title("Where a step's time goes, by " + ("kernel" if on_cuda else "operator")
                 + " category (step time above each bar)")
    ax.tick_params(axis="x", labelrotation=20)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="y")
    ax.figure.tight_layout()
    return ax


def compare_breakdown(table: pd.DataFrame, a: str, b: str) -> str:
    """Explain the step-time difference of paths ``a`` and ``b`` from their breakdown rows."""
    rows = table.set_index("path") if not table.empty else table
    if a not in rows.index or b not in rows.index:
        return f"Paths {a} and {b} were not both profiled, so there is nothing to compare."
    ra, rb = rows.loc[a], rows.loc[b]
    diffs = {k: ra[f"{k}_ms"] - rb[f"{k}_ms"] for k in kernels.NAMES}
    top = max(diffs, key=lambda k: abs(diffs[k]))
    kernel_diff = ra["kernel_ms"] - rb["kernel_ms"]
    gap_diff = ra["gap_ms"] - rb["gap_ms"]
    on_cuda = ra.get("device", "cuda") == "cuda"
    inside, outside = (("kernels", "idle GPU time (CPU-side overhead)") if on_cuda
                       else ("ATen operators", "time outside operators (Python, dispatch)"))
    cause = inside if abs(kernel_diff) >= abs(gap_diff) else outside
    text = (f"Path {a} vs path {b}: step {ra['step_ms'] - rb['step_ms']:+.2f} ms, of which "
            f"{inside} {kernel_diff:+.2f} ms and the rest {gap_diff:+.2f} ms; most of the "
            f"difference is in {cause}. The category that differs most is {top} "
            f"({diffs[top]:+.2f} ms per step)")
    if on_cuda:
        text += (f"; kernel launches per step: {ra['kernels_per_step']:.0f} vs "
                 f"{rb['kernels_per_step']:.0f}")
    return text + "."


# ------------------------------------------------------------------ the readings
def mfu_text(mfu: float) -> str:
    """'38.7% MFU', or a note where the figure is above 100% (the CHECK line has called it
    impossible: the peak it was measured against is wrong), so no summary repeats it."""
    if not math.isfinite(mfu):
        return "MFU not measured"
    return f"{mfu:.1%} MFU" if mfu <= 1.0 else "MFU not shown (above 100%: see the CHECK line)"


def speedup_text(row: pd.Series, base: pd.Series, what: str) -> str:
    """', 6.90x path 1' when the two step-time distributions can be told apart, else ', cannot
    be told apart from path 1 (why)' - never a ratio of two timings the tie rule rejects."""
    a, b = float(row["step_ms"]), float(base["step_ms"])
    why = verdicts.tie_reason(a, b, a_iqr=_step_iqr(row), b_iqr=_step_iqr(base))
    return f", cannot be told apart from {what} ({why})" if why else f", {b / a:.2f}x {what}"


def _step_iqr(row: pd.Series) -> tuple[float, float] | None:
    """A row's (first, third) quartile of the step time, when the table has them."""
    q1, q3 = row.get("step_ms_q1", math.nan), row.get("step_ms_q3", math.nan)
    return None if math.isnan(q1) or math.isnan(q3) else (float(q1), float(q3))


def fastest_paths(table: pd.DataFrame) -> list[str]:
    """The fastest path that ran, then those ``verdicts.is_tie`` cannot tell apart from it
    (step-time IQRs used when the table has them); empty when no path ran."""
    ran = table[table["status"] == "ran"]
    if ran.empty:
        return []
    timings = ran.rename(columns={"step_ms": "median_ms", "step_ms_q1": "q1_ms",
                                  "step_ms_q3": "q3_ms"})
    return verdicts.tied_with_fastest(timings, key="path")


def verdict(table: pd.DataFrame, roles: Roles) -> str:
    """Sentences built from the run's numbers: fastest path, Apex vs native (step time through
    ``verdicts.compare``, and peak memory), against the baseline when it ran."""
    ran = table[table["status"] == "ran"]
    if ran.empty:
        return "No path ran, so there is nothing to compare."
    tied = fastest_paths(table)
    by = ran.set_index("path")
    fastest = by.loc[tied[0]]
    versus = (speedup_text(fastest, by.loc[roles.baseline], roles.baseline_name)
              if tied[0] != roles.baseline and roles.baseline in by.index else "")
    first = (f"On this run the fastest path was {tied[0]} ({fastest['label']}) at "
             f"{fastest['step_ms']:.1f} ms per step, {mfu_text(fastest['mfu'])}{versus}.")
    if len(tied) > 1:
        others = (f"Path {tied[1]}" if len(tied) == 2 else
                  f"Paths {', '.join(tied[1:-1])} and {tied[-1]}")
        first += (f" {others} cannot be told apart from it (medians within "
                  f"{verdicts.TIE_FRACTION:.0%}, step-time IQRs overlapping, or a spread over "
                  f"{verdicts.SPREAD_LIMIT:.0%} of a median).")
    lines = [first]
    apex, native = roles.apex, roles.native
    if {apex, native} <= set(by.index):
        ra, rn = by.loc[apex], by.loc[native]
        ms_a, ms_n = float(ra["step_ms"]), float(rn["step_ms"])
        iqr_a, iqr_n = _step_iqr(ra), _step_iqr(rn)
        faster = ms_a < ms_n and not verdicts.is_tie(ms_a, ms_n, a_iqr=iqr_a, b_iqr=iqr_n)
        compared = verdicts.compare(f"Path {apex}", ms_a, f"path {native}", ms_n, a_iqr=iqr_a,
                                    b_iqr=iqr_n)
        lines.append(f"{compared}: on this GPU Apex's FusedAdam and fused LayerNorm are "
                     f"{'faster' if faster else 'not faster'} than PyTorch's own fused AdamW "
                     "and LayerNorm.")
        mem_a = float(ra.get("peak_mem_gib", math.nan))
        mem_n = float(rn.get("peak_mem_gib", math.nan))
        if not (math.isnan(mem_a) or math.isnan(mem_n)):
            diff = mem_a - mem_n
            how = ("the same" if abs(diff) < 0.005 else
                   f"{abs(diff):.2f} GiB {'less' if diff < 0 else 'more'} for path {apex}")
            lines.append(f"Peak memory: path {apex} {mem_a:.2f} GiB, path {native} "
                         f"{mem_n:.2f} GiB ({how}).")
    else:
        lines.append("Apex and native could not both run here, so there is no Apex verdict.")
    return "\n".join(lines)


def val_loss_spread(table: pd.DataFrame) -> float:
    """(largest / smallest final validation loss) - 1 over the paths that ran; NaN under two."""
    losses = table.loc[table["status"] == "ran", "final_val_loss"].dropna()
    return float(losses.max() / losses.min() - 1) if len(losses) >= 2 else math.nan


def loss_reading(table: pd.DataFrame, noise: verdicts.NoiseFloor | None) -> str:
    """The paths' validation-loss spread read against the noise floor: '(spread X%; noise floor
    Y%: within noise)', or '(spread X%)' without a floor."""
    spread = val_loss_spread(table)
    if noise is None:
        return f"spread {spread:.2%}"
    return (f"spread {spread:.2%}; noise floor {noise.floor:.2%}: "
            f"{verdicts.noise_reading(spread, noise.floor)}")


def targets(table: pd.DataFrame, goals: Targets, roles: Roles, *, applies: bool,
            noise: verdicts.NoiseFloor | None = None) -> str:
    """Each of ``goals`` marked met / missed / not measured, with the number; the loss target is
    printed beside the noise floor measured in the same run (when given). ``applies``: whether
    this run is one the goals are set for. The Apex path's speedup is the table's
    ``speedup_vs_fp32`` (``gpt.paths_table`` with ``baseline=roles.baseline``)."""
    if not applies:
        return ("The course's targets (MFU, Apex vs FP32 and native) are set for the full "
                "profile on a GPU; this run is not one, so they are not evaluated.")
    by = table[table["status"] == "ran"].set_index("path")
    base, apex, native = roles.baseline, roles.apex, roles.native

    def mark(ok: bool | None) -> str:
        return "not measured here" if ok is None else ("met" if ok else "MISSED")

    mfu_goal = f"fastest path >= {goals.mfu:.0%} MFU"
    best = by["mfu"].max() if "mfu" in by and len(by) else math.nan
    if best > 1.0:
        lines = [f"{mfu_goal}: not measured here (an MFU above 100%: see the CHECK line)"]
    else:
        lines = [f"{mfu_goal}: {mark(None if math.isnan(best) else best >= goals.mfu)} "
                 f"(best {best:.1%})"]
    speedup_goal = f"path {apex} >= {goals.speedup:g}x path {base}"
    if {base, apex} <= set(by.index):
        x = by.loc[apex, "speedup_vs_fp32"]
        lines.append(f"{speedup_goal}: {mark(x >= goals.speedup)} ({x:.2f}x)")
    else:
        lines.append(f"{speedup_goal}: not measured here")
    slower_goal = f"path {apex} at most {goals.slower:.0%} slower than path {native}"
    if {apex, native} <= set(by.index):
        r = by.loc[apex, "step_ms"] / by.loc[native, "step_ms"]
        lines.append(f"{slower_goal}: {mark(r <= 1 + goals.slower)} (step-time ratio {r:.3f})")
    else:
        lines.append(f"{slower_goal}: not measured here")
    spread = val_loss_spread(table)
    if math.isnan(spread):
        lines.append(f"validation losses within {goals.val_loss:.0%}: not measured here")
    else:
        lines.append(f"validation losses within {goals.val_loss:.0%} of each other: "
                     f"{mark(spread <= goals.val_loss)} ({loss_reading(table, noise)})")
    return "\n".join(lines)


def _rate(tflops: float) -> str:
    return f"{tflops:.0f} TFLOP/s" if tflops >= 1 else f"{tflops * 1e3:.0f} GFLOP/s"


def mfu_limits(breakdown: pd.DataFrame, table: pd.DataFrame, cfg: gpt.GPTConfig,
               tokens_per_step: int, peak_tflops: float,
               matmul_ceiling_tflops: float | None = None) -> str:
    """What holds the fastest profiled path's MFU down, from its kernel-time breakdown.

    FLOPs counted as in ``gpt.flops_per_token``: the parameter matmuls 6 N per token and
    attention 6 L d T per token. Everything else the step runs (norms, element-wise, optimizer,
    copies) does no counted FLOPs, so its time is time the tensor cores are idle."""
    ran = table[table["status"] == "ran"]
    profiled = ran[ran["path"].isin(set(breakdown["path"]))] if not breakdown.empty else ran[:0]
    if profiled.empty:
        return "No path was profiled, so what limits MFU is not measured here."
    fastest = profiled.loc[profiled["step_ms"].idxmin()]
    row = breakdown.set_index("path").loc[fastest["path"]]
    attention_per_token = 6 * cfg.n_layer * cfg.d_model * cfg.seq_len
    matmul_flops = (gpt.flops_per_token(cfg) - attention_per_token) * tokens_per_step
    attention_flops = attention_per_token * tokens_per_step
    step_ms = float(row["step_ms"])
    mm_ms, att_ms = float(row["matmul_ms"]), float(row["attention_ms"])
    rest_ms = step_ms - mm_ms - att_ms
    if not float(fastest["mfu"]) <= 1.0:
        return (f"What limits path {fastest['path']}'s MFU is not read here: its MFU is above "
                "100% (see the CHECK line), so the peak it is measured against is wrong.")
    lines = [f"What limits path {fastest['path']} ({fastest['label']}, "
             f"{mfu_text(fastest['mfu'])}), per step of {step_ms:.1f} ms:"]
    if mm_ms > 0:
        rate = matmul_flops / (mm_ms * 1e-3) / 1e12
        ceiling = (f", {rate / matmul_ceiling_tflops:.0%} of the measured bf16 matmul ceiling"
                   if matmul_ceiling_tflops else "")
        lines.append(f"- parameter matmuls: {mm_ms:.1f} ms ({mm_ms / step_ms:.0%} of the step) "
                     f"at {_rate(rate)}{ceiling}, {rate / peak_tflops:.0%} of the "
                     f"{_rate(peak_tflops)} peak")
    if att_ms > 0:
        rate = attention_flops / (att_ms * 1e-3) / 1e12
        lines.append(f"- attention: {att_ms:.1f} ms ({att_ms / step_ms:.0%}) at {_rate(rate)}")
    others = {k: float(row[f"{k}_ms"]) for k in kernels.NAMES if k not in ("matmul", "attention")}
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


def summary(table: pd.DataFrame, roles: Roles, *, where: str, tokens_per_step: int, steps: int,
            noise: verdicts.NoiseFloor | None = None) -> str:
    """The notebook's closing lines: every path that ran, compile payback, fastest, loss spread
    (against the noise floor when given). Speedups over the baseline are left out where it did
    not run."""
    ran = table[table["status"] == "ran"]
    if ran.empty:
        return f"No path ran on this run ({where}), so there is nothing to summarise."
    by_path = ran.set_index("path")
    base, native, compiled = roles.baseline, roles.native, roles.compiled
    lines = [f"On this run ({where}, {tokens_per_step} tokens per step, {steps} steps per path):"]
    for key, row in by_path.iterrows():
        versus = ("" if key == base or base not in by_path.index else
                  speedup_text(row, by_path.loc[base], f"path {base}"))
        lines.append(f"- path {key} ({row['label']}): {row['step_ms']:.1f} ms/step, "
                     f"{row['tokens_per_s']:,.0f} tokens/s, {mfu_text(row['mfu'])}{versus}, "
                     f"val loss {row['final_val_loss']:.3f}")
    if {native, compiled} <= set(by_path.index):
        rn, rc = by_path.loc[native], by_path.loc[compiled]
        saved_s = (rn["step_ms"] - rc["step_ms"]) / 1e3
        tie = verdicts.is_tie(float(rc["step_ms"]), float(rn["step_ms"]), a_iqr=_step_iqr(rc),
                              b_iqr=_step_iqr(rn))
        payback = (f"paid back after {rc['compile_s'] / saved_s:.0f} steps" if saved_s > 0
                   and not tie else f"never paid back: path {compiled} was not measurably "
                   f"faster than path {native}")
        lines.append(f"- torch.compile took {rc['compile_s']:.1f} s, {payback}")
    tied = fastest_paths(table)
    fastest = f"path {tied[0]}" + (f" (cannot be told apart from {', '.join(tied[1:])})"
                                   if len(tied) > 1 else "")
    spread = val_loss_spread(table)
    losses = "" if math.isnan(spread) else f"; validation losses {loss_reading(table, noise)}"
    lines.append(f"- fastest: {fastest}{losses}")
    return "\n".join(lines)
