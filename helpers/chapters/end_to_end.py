"""Notebook 05's readings: what the end-to-end comparison measures, but does not teach.

The model, the corpus, the batch plan, the recipe and the paths table it shares with notebooks
06 and 07 are :mod:`helpers.gpt`'s. This module reads one run of the notebook's paths; which
path plays which part (:class:`Roles`: the baseline, the Apex and native paths, the compiled
one) and the goals it is held to (:class:`Targets`) are the notebook's, passed in:

- memory: the size of the score matrix written-out attention would hold
  (:func:`score_matrix_bytes`) and the bytes autograd saves for backward (:func:`saved_bytes`);
- the time breakdown: per-category kernel time next to the step (:func:`breakdown_table`) and
  its stacked chart (:func:`breakdown_chart`);
- the tables read from the run: the targets met or missed (:func:`targets`, the loss target
  read against the run's other seeds), what holds the fastest path's MFU down
  (:func:`mfu_limits`), the paths' speed-ups by the tie rule (:func:`summary_table`), the
  yardsticks, and the norm a step pays for (:func:`norm_choice`, :func:`norm_in_step`).
Each returns numbers and verdict words (``verdicts.label``); the notebook's markdown reads them.

Longer than 400 lines (just) because the time breakdown, the norm choice and the TF32 shares
all read the same kernel categories, and split apart they would drift.
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


# ------------------------------------------------------------------ the readings
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


def val_loss_spread(table: pd.DataFrame) -> float:
    """(largest / smallest final validation loss) - 1 over the paths that ran; NaN under two."""
    losses = table.loc[table["status"] == "ran", "final_val_loss"].dropna()
    return float(losses.max() / losses.min() - 1) if len(losses) >= 2 else math.nan


TARGET_COLUMNS = ["target", "threshold", "measured", "yardstick", "reading"]


def targets(table: pd.DataFrame, goals: Targets, roles: Roles, *, applies: bool,
            noise: verdicts.NoiseFloor | None = None) -> pd.DataFrame:
    """One row per goal of ``goals``: the ``target``, its ``threshold``, what this run
    ``measured`` (a number: the best MFU, the Apex path's speed-up over the baseline, the Apex
    over native step-time ratio, the validation losses' relative spread) and the ``reading`` -
    "met", "MISSED" or "not measured here"; the loss target is read against the other seeds'
    spread measured in the same run (``yardstick``; :func:`helpers.verdicts.target_verdict`):
    "met", "MISSED" or "undecided" when a re-run could land on either side. ``applies``: whether
    this run is one the goals are set for; where it is not, every reading is "not evaluated".
    An MFU above 100% (a wrong peak: the CHECK line) is not measured. The Apex path's speedup is
    the table's ``speedup_vs_fp32`` (``gpt.paths_table`` with ``baseline=roles.baseline``)."""
    by = table[table["status"] == "ran"].set_index("path")
    base, apex, native = roles.baseline, roles.apex, roles.native
    rows = []

    def add(target: str, threshold: float, measured: float, ok: bool | None,
            reading: str | None = None, yardstick: float = math.nan) -> None:
        if not applies:
            reading = "not evaluated"
        elif reading is None:
            reading = "not measured here" if ok is None else ("met" if ok else "MISSED")
        rows.append({"target": target, "threshold": threshold, "measured": measured,
                     "yardstick": yardstick, "reading": reading})

    best = by["mfu"].max() if "mfu" in by and len(by) else math.nan
    best = math.nan if best > 1.0 else best  # above 100%: a wrong peak, not a measurement
    add("fastest path's MFU, at least", goals.mfu, best,
        None if math.isnan(best) else bool(best >= goals.mfu))
    x = float(by.loc[apex, "speedup_vs_fp32"]) if {base, apex} <= set(by.index) else math.nan
    add(f"path {apex}'s speed-up over path {base}, at least", goals.speedup, x,
        None if math.isnan(x) else bool(x >= goals.speedup))
    r = (float(by.loc[apex, "step_ms"] / by.loc[native, "step_ms"])
         if {apex, native} <= set(by.index) else math.nan)
    add(f"path {apex}'s step time over path {native}'s, at most", 1 + goals.slower, r,
        None if math.isnan(r) else bool(r <= 1 + goals.slower))
    spread = val_loss_spread(table)
    if math.isnan(spread):
        add("validation losses' spread, at most", goals.val_loss, spread, None)
    else:  # the target read against the other seeds' spread: within, beyond or undecided
        scale, _ = verdicts.yardstick(noise, "numerics")
        word = verdicts.target_verdict(spread, scale, goals.val_loss)
        add("validation losses' spread, at most", goals.val_loss, spread, None,
            {"within": "met", "beyond": "MISSED"}.get(word, word), yardstick=scale)
    return pd.DataFrame(rows, columns=TARGET_COLUMNS)


LIMITS_COLUMNS = ["path", "part", "ms", "share_of_step", "tflop_per_step", "tflops",
                  "vs_matmul_ceiling", "vs_peak"]


def mfu_limits(breakdown: pd.DataFrame, table: pd.DataFrame, cfg: gpt.GPTConfig,
               tokens_per_step: int, peak_tflops: float,
               matmul_ceiling_tflops: float | None = None) -> pd.DataFrame:
    """What holds the fastest profiled path's MFU down, from its kernel-time breakdown: one row
    per part of its step - the parameter matmuls, attention, everything else - with its time,
    its share of the step, the FLOPs it does per step, its rate, and that rate over the
    measured bf16 matmul ceiling and over the peak. Empty where no path was profiled, or where
    the fastest one's MFU is above 100% (the peak it is measured against is then wrong).

    FLOPs counted as in ``gpt.flops_per_token``: the parameter matmuls 6 N per token and
    attention 6 L d T per token. Everything else the step runs (norms, element-wise, optimizer,
    copies, an idle GPU) does no counted FLOPs, so its time is time the tensor cores are idle."""
    ran = table[table["status"] == "ran"]
    profiled = ran[ran["path"].isin(set(breakdown["path"]))] if not breakdown.empty else ran[:0]
    if profiled.empty:
        return pd.DataFrame(columns=LIMITS_COLUMNS)
    fastest = profiled.loc[profiled["step_ms"].idxmin()]
    if not float(fastest["mfu"]) <= 1.0:
        return pd.DataFrame(columns=LIMITS_COLUMNS)
    row = breakdown.set_index("path").loc[fastest["path"]]
    attention_per_token = 6 * cfg.n_layer * cfg.d_model * cfg.seq_len
    step_ms = float(row["step_ms"])
    mm_ms, att_ms = float(row["matmul_ms"]), float(row["attention_ms"])
    parts = [("parameter matmuls", mm_ms,
              (gpt.flops_per_token(cfg) - attention_per_token) * tokens_per_step),
             ("attention", att_ms, attention_per_token * tokens_per_step),
             ("everything else", step_ms - mm_ms - att_ms, 0.0)]
    rows = []
    for part, ms, flops in parts:
        rate = flops / (ms * 1e-3) / 1e12 if ms > 0 and flops else math.nan
        rows.append({"path": str(fastest["path"]), "part": part, "ms": ms,
                     "share_of_step": ms / step_ms, "tflop_per_step": flops / 1e12,
                     "tflops": rate,
                     "vs_matmul_ceiling": (rate / matmul_ceiling_tflops
                                           if matmul_ceiling_tflops and flops else math.nan),
                     "vs_peak": rate / peak_tflops if flops else math.nan})
    return pd.DataFrame(rows, columns=LIMITS_COLUMNS)


SUMMARY_COLUMNS = ["path", "label", "step_ms", "tokens_per_s", "mfu", "speedup", "vs_baseline",
                   "final_val_loss"]


def summary_table(table: pd.DataFrame, roles: Roles) -> pd.DataFrame:
    """One row per path that ran: step time, tokens/s, MFU (NaN where above 100%: see the CHECK
    line), its speed-up over the baseline and the tie rule's reading of it (``vs_baseline``, as
    ``verdicts.label`` writes it: 'faster 6.90x', 'slower 0.95x' or 'tie', never a ratio of two
    timings it cannot separate: ``speedup`` is NaN then), and the validation loss."""
    ran = table[table["status"] == "ran"]
    rows = []
    base = roles.baseline
    timings = ran.rename(columns={"step_ms": "median_ms", "step_ms_q1": "q1_ms",
                                  "step_ms_q3": "q3_ms"})
    pairs = verdicts.comparison_table(timings, [(k, base) for k in ran["path"] if k != base],
                                      key="path").set_index("path")
    for _, row in ran.iterrows():
        key = row["path"]
        if key == base:
            speedup, reading = 1.0, "baseline"
        elif key in pairs.index:
            pair = pairs.loc[key]
            speedup = (math.nan if pair["verdict"] == verdicts.TIE_WORD
                       else float(pair["speedup"]))
            reading = verdicts.label(pair["verdict"], speedup)
        else:
            speedup, reading = math.nan, "no baseline"
        mfu = float(row.get("mfu", math.nan))
        rows.append({"path": key, "label": row["label"], "step_ms": float(row["step_ms"]),
                     "tokens_per_s": float(row.get("tokens_per_s", math.nan)),
                     "mfu": mfu if mfu <= 1.0 else math.nan, "speedup": speedup,
                     "vs_baseline": reading,
                     "final_val_loss": float(row.get("final_val_loss", math.nan))})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


# ------------------------------------------------------------------ the yardsticks
def yardsticks_table(noise: verdicts.NoiseFloor) -> pd.DataFrame:
    """One row per question a loss difference answers (:data:`helpers.verdicts.QUESTIONS`):
    the yardstick it is read against, how many runs measured it, and its spread (percent of
    the baseline's loss; NaN where it was not measured)."""
    runs = {"repeat": len(noise.same_seed), "numerics": len(noise.seeds)}
    rows = []
    for question in verdicts.QUESTIONS:
        scale, name = verdicts.yardstick(noise, question)
        rows.append({"question": question, "yardstick": name, "runs": runs[question],
                     "spread_pct": 100 * scale,
                     "beyond_at_pct": 100 * verdicts.NOISE_FACTOR * scale})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ the norm a step pays for
MEASURES = {"gpu": "standalone, GPU time", "call": "standalone, host included",
            "step": "in the training step (profile)"}


def norm_choice(gpu_rounds: dict[str, list[float]], call_rounds: dict[str, list[float]],
                baseline: str) -> pd.DataFrame:
    """One row per norm timed in interleaved rounds two ways (name -> each round's median, ms):
    ``gpu`` with the GPU's work alone (the host queued ahead, as in a busy training step) and
    ``call`` with the host's time to issue it included; each with its rounds' range (percent of
    their median) and its verdict against ``baseline`` (:func:`helpers.verdicts.label` of
    :func:`helpers.verdicts.rounds_table`: 'faster 1.13x' is the baseline's time over this
    one's)."""
    rows = []
    for how, rounds in (("gpu", gpu_rounds), ("call", call_rounds)):
        spread = verdicts.round_stability(rounds).set_index("candidate")
        pairs = verdicts.rounds_table(rounds, [(n, baseline) for n in rounds if n != baseline])
        labels = dict(zip(pairs["candidate"], pairs["label"], strict=True))
        for name in rounds:
            rows.append({"norm": name, "how": how, "ms": float(spread.loc[name, "median_ms"]),
                         "range_pct": float(spread.loc[name, "range_pct"]),
                         "vs_baseline": "baseline" if name == baseline else labels[name]})
    long = pd.DataFrame(rows)
    wide = long.pivot(index="norm", columns="how", values=["ms", "range_pct", "vs_baseline"])
    wide.columns = [f"{how}_{what}" for what, how in wide.columns]
    wide = wide.reindex(list(gpu_rounds)).reset_index()
    wide = wide.astype({"gpu_ms": float, "call_ms": float, "gpu_range_pct": float,
                        "call_range_pct": float})
    return wide[
        ["norm", "gpu_ms", "gpu_vs_baseline", "gpu_range_pct", "call_ms", "call_vs_baseline",
         "call_range_pct"]]


def pick_norm(gpu_rounds: dict[str, list[float]], call_rounds: dict[str, list[float]],
              among: list[str]) -> str:
    """The norm among ``among`` a GPU-bound step pays least for: the lowest GPU time by the
    rounds' rule (:func:`helpers.verdicts.fastest_by_rounds`), and among those it cannot tell
    apart, the lowest time with the host included (the host's cost then breaks the tie)."""
    best, tied = verdicts.fastest_by_rounds({n: gpu_rounds[n] for n in among})
    return min([best, *tied], key=lambda n: sorted(call_rounds[n])[len(call_rounds[n]) // 2])


def norm_in_step(choice: pd.DataFrame, breakdown: pd.DataFrame, paths: dict[str, str],
                 calls: int) -> pd.DataFrame:
    """The two norms of ``paths`` (norm name -> the path that ran it; the first is the
    baseline) side by side, one row per measure (:data:`MEASURES`): the standalone GPU time and
    host-included time per forward + backward call (:func:`norm_choice`), and what the step
    paid - the breakdown's norm kernels per step over the ``calls`` norm calls of a step. The
    step's row ``decides`` (it is what a training step pays); ``agrees_with_step`` says whether
    a standalone figure ranks the two as the step does (a tie counts as its own ranking)."""
    (a, path_a), (b, path_b) = list(paths.items())[:2]
    by_norm = choice.set_index("norm")
    steps = breakdown.set_index("path") if not breakdown.empty else breakdown
    rows = []
    for how in ("gpu", "call"):
        rows.append({"measure": MEASURES[how], f"{a}_ms": float(by_norm.loc[a, f"{how}_ms"]),
                     f"{b}_ms": float(by_norm.loc[b, f"{how}_ms"]),
                     f"{b}_vs_{a}": by_norm.loc[b, f"{how}_vs_baseline"]})
    if {path_a, path_b} <= set(steps.index):
        ms_a = float(steps.loc[path_a, "norm_ms"]) / calls
        ms_b = float(steps.loc[path_b, "norm_ms"]) / calls
        word = verdicts.TIE_WORD if verdicts.is_tie(ms_b, ms_a) else (
            "faster" if ms_b < ms_a else "slower")
        rows.append({"measure": MEASURES["step"], f"{a}_ms": ms_a, f"{b}_ms": ms_b,
                     f"{b}_vs_{a}": verdicts.label(word, ms_a / ms_b)})
    table = pd.DataFrame(rows)
    step = table[f"{b}_vs_{a}"].iloc[-1].split()[0] if len(rows) == 3 else None
    table["decides"] = table["measure"] == MEASURES["step"]
    table["agrees_with_step"] = [None if step is None or d else v.split()[0] == step
                                 for v, d in zip(table[f"{b}_vs_{a}"], table["decides"],
                                                 strict=True)]
    return table


# ------------------------------------------------------------------ where a precision's gain lands
def category_shares(breakdown: pd.DataFrame, paths: list[str]) -> pd.DataFrame:
    """For ``paths`` (the first is the reference), each one's step split into the parameter
    matmuls, attention and the rest (every other kernel category and the idle GPU), in ms and
    in percent of its step, and each part's time in the reference over its time in the path
    (``*_x``: 2.0 = that part took half as long). Read from the breakdown table."""
    rows = breakdown.set_index("path")
    present = [p for p in paths if p in rows.index]
    out = []
    for p in present:
        r = rows.loc[p]
        parts = {"matmul": float(r["matmul_ms"]), "attention": float(r["attention_ms"])}
        parts["rest"] = float(r["step_ms"]) - sum(parts.values())
        row = {"path": p, "label": r["label"], "step_ms": float(r["step_ms"])}
        for name, ms in parts.items():
            row[f"{name}_ms"] = ms
            row[f"{name}_pct"] = 100 * ms / float(r["step_ms"])
        out.append(row)
    table = pd.DataFrame(out)
    if not table.empty:
        for name in ("matmul", "attention", "rest", "step"):
            table[f"{name}_x"] = table[f"{name}_ms"].iloc[0] / table[f"{name}_ms"]
    return table
