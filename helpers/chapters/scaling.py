"""Notebook 07's helpers: what the chapter uses but does not teach.

- the launch: :func:`launch` and :func:`launch_all` run the notebook's training script under
  torchrun through the course's one child launcher (:mod:`helpers.launch`: ``--plan JSON --out
  PATH``, a wall-clock limit, every rank stopped past it, a failure in one sentence), after
  :func:`launch_problem` has refused what would fail anyway (no NCCL in a CPU-only torch, fewer
  GPUs than ranks); :class:`Launch` reads rank 0's runs and saved weights;
- the script's side (it reads its plan with ``launch.read_plan``): the gathered parameters,
  their checksums, the bytes each rank holds, a timed all-reduce, what it ran on;
- the equivalence check of a distributed run against one process (:func:`compare`);
- the noise: the baseline trained again in the same launch (same seed: does it repeat itself?;
  other seeds: the yardstick of the wrappers' loss differences), each difference read against
  the yardstick of its question (:func:`noise_table`), where a run parts from its reference step
  by step (:func:`divergence_table`); a variant's step time and peak memory against its
  reference's, by the tie rule (:func:`pairs_table`); what DDP allocates
  (:func:`ddp_memory_growth`);
- the tables and the chart of the memory and communication model (its formulas are the
  notebook's cells, passed in), the link's datasheet figure, notebook 05's step time
  (:func:`compute_from_05`, on the table the notebook read);
- the interleaved timing rounds of the wrappers' cost: the stop rule (:func:`settled`) and one
  row per wrapper with its own flags and its verdict against the baseline (:func:`rounds_table`);
- Apex's distributed pieces and their PyTorch counterparts, checked in the legacy source where
  it is on disk (parsed with ``ast``, never imported) and in this torch.

Why this module is longer than a chapter's usual ~400 lines: each of these parts is notebook
07's alone (nothing here is imported by another notebook or chapter), and a chapter is one
module (:mod:`helpers.chapters`); the launcher, the one part other notebooks share, is
:mod:`helpers.launch`.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import math
import os
import re
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from helpers import bench, ceilings, gpt, machine, verdicts
from helpers import launch as launcher

if TYPE_CHECKING:  # pandas is imported by the functions that make tables: a process that
    import pandas as pd  # only trains (a torchrun rank) does not pay for its import

# ------------------------------------------------------------------ the launch
# Past the deadline: what a stopped launch says.
PAST_LIMIT = ("the launch ran past {timeout:.0f} s and was stopped with all its ranks (a rank may "
              "be waiting in a collective for one that never came): raise the timeout, or read "
              ".stderr")


def launch_problem(backend: str, nproc: int) -> str:
    """'' when ``nproc`` ranks of ``backend`` can start here, else the one sentence why not."""
    if nproc < 1:
        return f"{nproc} ranks cannot start: ask for at least 1"
    if not dist.is_available():
        return "this torch has no torch.distributed: install a torch build that includes it"
    if backend == "nccl":
        if not dist.is_nccl_available():
            return ("the nccl backend needs NCCL and this torch has none "
                    "(torch.distributed.is_nccl_available() is False: a CPU-only build): use "
                    "backend 'gloo' on the CPU, or install a CUDA build of torch")
        count = torch.cuda.device_count()
        if count < nproc:
            return (f"{nproc} ranks of nccl need {nproc} GPUs (one per rank) and torch sees "
                    f"{count}: ask for at most {count}, or run on a machine with more GPUs")
    elif backend == "gloo":
        if not dist.is_gloo_available():
            return "this torch has no gloo backend: install a torch build that includes it"
    else:
        return f"backend {backend!r} is not one of nccl, gloo"
    return ""


@dataclass
class Launch(launcher.Result):
    """One torchrun launch (:class:`helpers.launch.Result`) on ``nproc`` ranks: the payload is
    rank 0's JSON."""

    nproc: int = 1

    def runs(self) -> list[bench.Run]:
        """The payload's training runs (one per variant)."""
        return [bench.Run.from_dict(r) for r in self.payload.get("runs", [])]

    def params(self, variant: str) -> dict[str, torch.Tensor]:
        """The parameters a variant ended with, as the script saved them (``save_params``)."""
        return torch.load(params_path(self.out, variant), weights_only=True)

    def summary(self) -> str:
        """One line: how many ranks, how long, how it ended, what went to stderr."""
        said = len([ln for ln in self.stderr.splitlines() if ln.strip()])
        kept = f"; {said} stderr lines kept in .stderr" if said else ""
        end = "finished" if self.ok else f"FAILED: {self.error}"
        return f"torchrun, {self.nproc} rank(s): {end} ({self.seconds:.1f} s{kept})"


def launch(script: Path | str, nproc: int, plan: dict, out: Path | str, *,
           timeout: float = 300, port: int | None = None) -> Launch:
    """Run ``script`` on ``nproc`` ranks with ``--plan JSON --out PATH``; wait at most
    ``timeout`` seconds (then stop every process it started); read rank 0's JSON."""
    return launch_all([(script, nproc, plan, out, port)], timeout=timeout)[0]


def launch_all(jobs: list[tuple], *, timeout: float = 300) -> list[Launch]:
    """:func:`launch` for several ``(script, nproc, plan, out)`` at once, each with an optional
    fifth item, its port: every torchrun starts before the first is waited for (on CPUs, one
    launch's idle time is another's work). One OpenMP thread per rank unless OMP_NUM_THREADS
    is set (torchrun warns when it is not)."""
    env = launcher.child_env(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    specs = [launcher.Job(launcher.torchrun(script, nproc, port=port[0] if port else None), plan,
                          out, env, refused=launch_problem(plan.get("backend", "gloo"), nproc),
                          past_limit=PAST_LIMIT)
             for script, nproc, plan, out, *port in jobs]
    done = launcher.run_all(specs, timeout=timeout)
    return [Launch(**vars(result), nproc=job[1]) for result, job in zip(done, jobs, strict=True)]


# ------------------------------------------------------------------ the script's side
def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: the local shard of a DTensor, else the tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (detached, on its device), named as in the unwrapped model (DDP's
    ``module.`` prefix dropped). FSDP2's shards are gathered: every rank must call this."""
    params = {}
    for name, p in model.named_parameters():
        whole = p.full_tensor() if hasattr(p, "full_tensor") else p
        params[name.removeprefix("module.")] = whole.detach()
    return params


def checksums(params: dict[str, torch.Tensor]) -> dict[str, float]:
    """One float64 sum per parameter: equal runs agree to rounding."""
    return {name: float(t.double().sum()) for name, t in params.items()}


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of parameters, gradients and Adam's two moments this rank holds (local shards)."""
    params = list({id(p): p for p in model.parameters()}.values())
    moments = [_local(s[k]) for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")
               if k in s]
    return {"params": sum(_local(p).numel() * _local(p).element_size() for p in params),
            "grads": sum(_local(p.grad).numel() * _local(p.grad).element_size()
                         for p in params if p.grad is not None),
            "optimizer": sum(t.numel() * t.element_size() for t in moments)}


def max_over_ranks(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """The largest value of each key over all ranks (NaN stays NaN), one all-reduce."""
    keys = list(values)
    raw = [float(values[k]) for k in keys]
    t = torch.tensor([v if math.isfinite(v) else -1.0 for v in raw], dtype=torch.float64,
                     device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {k: (float(v) if math.isfinite(r) else math.nan)
            for k, v, r in zip(keys, t.tolist(), raw, strict=True)}


def time_allreduce(mib: float, device: torch.device, *, warmup: int = 3,
                   repeats: int = 10) -> dict:
    """Time an all-reduce of ``mib`` MiB of fp32 with ``bench.benchmark`` (a barrier before each
    repeat, untimed) and give the bus bandwidth NCCL's tests report:
    bytes x 2(N-1)/N / time, what each rank sends per second in a ring."""
    world = dist.get_world_size()
    x = torch.ones(int(mib * 2**20) // 4, device=device)
    # the course's timer: the barrier before each call untimed, no L2 flush (NCCL's own buffers)
    timing = bench.benchmark(lambda: dist.all_reduce(x), setup=dist.barrier, warmup=warmup,
                             repeats=repeats, flush=False, device=device, label="all_reduce")
    nbytes = x.numel() * 4
    return {"bytes": nbytes, "world_size": world, "median_ms": timing.median_ms,
            "iqr_ms": timing.iqr_ms, "algbw_gbps": nbytes / timing.median_ms / 1e6,
            "busbw_gbps": nbytes * 2 * (world - 1) / world / timing.median_ms / 1e6}


def meta(device: torch.device) -> dict:
    """What the results were measured on: world size, backend, versions, device."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"world_size": dist.get_world_size(), "backend": dist.get_backend(),
            "torch": torch.__version__, "python": sys.version.split()[0], "device": name,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda"
            else None}


def params_path(out: Path | str, variant: str) -> Path:
    """Where the script saves a variant's final parameters, beside its JSON result (a name
    such as 'plain (repeat 1)' becomes 'plain_repeat_1')."""
    out = Path(out)
    name = re.sub(r"[^\w.-]+", "_", variant).strip("_")
    return out.with_name(f"{out.stem}.{name}.pt")


# ------------------------------------------------------------------ correctness
# How far an FP32 run on N ranks may be from one process: rounding fp32 sums in another order
# moves a loss of ~5 nats, a gradient norm or a weight by a few 1e-7 of itself; a wrong batch
# slice or a missing gradient average moves them by 1e-2 or more (tests/test_scaling.py).
TOLERANCE = {"max_loss_diff": 1e-5, "max_grad_norm_rel_diff": 1e-4, "max_param_diff": 1e-5}


def compare(reference: bench.Run, run: bench.Run, ref_params: dict | None = None,
            params: dict | None = None) -> dict:
    """How far ``run`` is from ``reference``: largest loss difference, largest relative
    difference of the gradient norms, largest parameter difference (when both are given)."""
    losses = torch.tensor(run.losses, dtype=torch.float64)
    ref_losses = torch.tensor(reference.losses, dtype=torch.float64)
    norms = torch.tensor(run.extra["grad_norms"], dtype=torch.float64)
    ref_norms = torch.tensor(reference.extra["grad_norms"], dtype=torch.float64)
    row = {"variant": run.extra["variant"], "world_size": run.extra["world_size"],
           "accum": run.extra.get("accum", 1), "steps": len(run.losses),
           "max_loss_diff": float((losses - ref_losses).abs().max()),
           "max_grad_norm_rel_diff": float(((norms - ref_norms).abs() / ref_norms).max()),
           "max_param_diff": math.nan}
    if ref_params is not None and params is not None:
        row["max_param_diff"] = max(float((params[k] - ref_params[k]).abs().max())
                                    for k in ref_params)
    return row


def within(row: dict, tolerance: dict[str, float] | None = None) -> bool:
    """True when every measured difference of ``row`` is at most its tolerance (NaN, not
    measured, passes)."""
    return all(not row[k] > limit for k, limit in (tolerance or TOLERANCE).items())


# ------------------------------------------------------------------ the noise floor
# The baseline trained again in the same launch: "plain (repeat k)" with the same seed (what
# differs between them is the machine's own run-to-run noise: a GPU's reductions do not repeat
# their order), "plain (seed s)" with another seed (other initial weights and batches: for
# scale). The notebook makes each a record of the plan: the wrapper its name starts with.
def wrapper_of(variant: str) -> str:
    """The wrapper a variant trains with: 'plain (repeat 1)' and 'plain (seed 1)' -> 'plain'."""
    return variant.split(" (", 1)[0]


def noise_variants(repeats: int, seed: int, other_seed: int | Sequence[int] | None = None,
                   baseline: str = "plain") -> dict[str, int]:
    """The extra runs of ``baseline`` for its noise floor, each name with its seed: ``repeats``
    runs with ``seed``, then one per other seed (``other_seed``: one seed, several, or None)."""
    if repeats < 1:
        raise ValueError(f"a noise floor needs at least 1 repeat of {baseline}, not {repeats}")
    runs = {f"{baseline} (repeat {k})": seed for k in range(1, repeats + 1)}
    others = [] if other_seed is None else (
        [other_seed] if isinstance(other_seed, int) else list(other_seed))
    for s in others:
        if s == seed:
            raise ValueError(f"the other seed ({s}) is the baseline's own")
        runs[f"{baseline} (seed {s})"] = s
    return runs


def _same_seed(runs: dict[str, bench.Run], baseline: str) -> tuple[list[bench.Run],
                                                                    list[bench.Run]]:
    """The baseline and its same-seed repeats (baseline first), and its other-seed runs."""
    base = runs[baseline]
    seed = base.extra.get("seed")
    same, others = [base], []
    for name, run in runs.items():
        if name == baseline or wrapper_of(name) != baseline:
            continue
        (same if run.extra.get("seed") == seed else others).append(run)
    return same, others


def step_diff(a: bench.Run, b: bench.Run) -> float:
    """The largest difference of two runs' losses at the same step (nats)."""
    return max(abs(x - y) for x, y in zip(a.losses, b.losses, strict=True))


def end_loss(run: bench.Run) -> float:
    """The loss two runs are compared by: the validation loss the script measured after
    training (the same held-out batches for every run), else the mean of the last tenth of the
    training steps (``bench.Run.final_loss``)."""
    value = run.extra.get("val_loss")
    return run.final_loss if value is None else float(value)


def noise_floor(runs: dict[str, bench.Run], baseline: str = "plain"
                ) -> tuple[verdicts.NoiseFloor, float]:
    """The baseline's noise from its runs in ``runs`` (name -> run, the script's ``extra``
    holding each run's seed): of the end loss (:func:`end_loss`, relative:
    :class:`verdicts.NoiseFloor`, its same-seed floor and its other seeds), and of the loss at
    any one step (the largest per-step difference between two same-seed runs, in nats)."""
    same, others = _same_seed(runs, baseline)
    ends = [end_loss(r) for r in others]
    floor = verdicts.NoiseFloor(same_seed=tuple(end_loss(r) for r in same),
                                other_seed=ends[0] if ends else None,
                                other_seeds=tuple(ends[1:]), what=baseline)
    per_step = max(step_diff(a, b) for i, a in enumerate(same) for b in same[i + 1:])
    return floor, per_step


def step_floors(runs: dict[str, bench.Run], baseline: str = "plain") -> list[float]:
    """Step by step, the largest loss difference between two same-seed runs of the baseline
    (nats): how far the machine's own noise has carried them apart by that step."""
    same, _ = _same_seed(runs, baseline)
    return [max(abs(x - y) for i, x in enumerate(col) for y in col[i + 1:])
            for col in zip(*(r.losses for r in same), strict=True)]


def noise_table(runs: dict[str, bench.Run], baseline: str = "plain",
                compared: tuple[str, ...] = ("ddp", "fsdp2")
                ) -> tuple[pd.DataFrame, verdicts.NoiseFloor, float]:
    """One row per run of ``compared`` and of the baseline's own runs: its end loss and its
    difference from the baseline's (relative), each read against the yardstick of its question
    (:func:`verdicts.loss_table`): the baseline's same-seed repeats against the same-seed floor
    ('does it repeat itself?'), the compared runs against the baseline's other seeds ('do they
    learn the same?'); the other-seed runs are that yardstick. Beside them, the largest
    per-step difference (nats) and the same-seed per-step floor, as data. Also returns the
    two floors."""
    import pandas as pd

    floor, per_step = noise_floor(runs, baseline)
    same, others = _same_seed(runs, baseline)
    names = [n for n in runs if n in compared or wrapper_of(n) == baseline]
    losses = {n: end_loss(runs[n]) for n in names}
    by_question = {q: verdicts.loss_table(losses, baseline, floor, question=q).set_index("run")
                   for q in verdicts.QUESTIONS}
    repeats = {id(r) for r in same}
    other_ids = {id(r) for r in others}
    rows = []
    for n in names:
        question = "repeat" if id(runs[n]) in repeats else "numerics"
        row = by_question[question].loc[n].to_dict()
        if id(runs[n]) in other_ids:
            row["verdict"] = row["target"] = "yardstick"
        rows.append({"run": n, "seed": runs[n].extra.get("seed"), **row})
    table = pd.DataFrame(rows)
    if any(runs[n].extra.get("val_loss") is None for n in names):  # an older script's runs
        table = table.rename(columns={"val_loss": "final_loss"})
    table["same_seed_floor_pct"] = 100 * floor.floor
    table["max_step_diff"] = [step_diff(runs[n], runs[baseline]) for n in names]
    table["step_floor"] = per_step
    return table, floor, per_step


def divergence_table(runs: dict[str, bench.Run], pairs: Sequence[tuple[str, str]],
                     baseline: str = "plain", factor: float = verdicts.NOISE_FACTOR
                     ) -> pd.DataFrame:
    """Where two runs of the same seed part, step by step: for each (run, reference) in
    ``pairs``, the loss difference at step 0 (the same weights and batch: the forward alone),
    the first step whose difference exceeds ``factor`` x the baseline's same-seed difference at
    that step (:func:`step_floors`; -1: none), the largest per-step difference and its step, the
    end-loss difference (relative) and its verdict (:func:`verdicts.loss_verdict`) against the
    yardstick its question calls for: a repeat of its reference (``"fsdp2 (repeat 1)"`` against
    ``"fsdp2"``) against the same-seed repeats, another wrapper against the other seeds."""
    import pandas as pd

    floors = step_floors(runs, baseline)
    floor, _ = noise_floor(runs, baseline)
    rows = []
    for run, ref in pairs:
        if run not in runs or ref not in runs:
            continue
        question = "repeat" if run.startswith(f"{ref} (repeat") else "numerics"
        scale, name = verdicts.yardstick(floor, question)
        diffs = [abs(x - y) for x, y in zip(runs[run].losses, runs[ref].losses, strict=True)]
        beyond = [i for i, (d, f) in enumerate(zip(diffs, floors, strict=True)) if d > factor * f]
        worst = max(range(len(diffs)), key=diffs.__getitem__)
        end = end_loss(runs[run]) / end_loss(runs[ref]) - 1
        rows.append({"run": run, "vs": ref, "step0_diff": diffs[0],
                     "first_step_beyond_floor": beyond[0] if beyond else -1,
                     "max_step_diff": diffs[worst], "max_at_step": worst,
                     "end_diff_pct": 100 * end, "yardstick": name, "yardstick_pct": 100 * scale,
                     "verdict": verdicts.loss_verdict(end, scale, factor)})
    return pd.DataFrame(rows, columns=["run", "vs", "step0_diff", "first_step_beyond_floor",
                                       "max_step_diff", "max_at_step", "end_diff_pct",
                                       "yardstick", "yardstick_pct", "verdict"])


def losses_record(runs: dict[str, bench.Run], floor: verdicts.NoiseFloor, per_step: float
                  ) -> dict:
    """Every run's per-step losses and gradient norms, with the floors, for ``07_losses.json``."""
    return {"runs": {name: {"wrapper": wrapper_of(name), "seed": r.extra.get("seed"),
                            "world_size": r.extra.get("world_size"),
                            "final_loss": r.final_loss, "val_loss": r.extra.get("val_loss"),
                            "losses": r.losses,
                            "grad_norms": r.extra.get("grad_norms")}
                     for name, r in runs.items()},
            "noise_floor": {"same_seed": list(floor.same_seed), "other_seed": floor.other_seed,
                            "other_seeds": list(floor.other_seeds),
                            "floor": floor.floor, "seed_spread": floor.seed_spread,
                            "per_step_floor_nats": per_step},
            "final_loss": "the mean of the last tenth of the steps (bench.Run.final_loss)",
            "val_loss": "the same held-out batches for every run, after training; the floor's"}


# ------------------------------------------------------------------ memory and communication
# The formulas (bytes per parameter, the collectives' ring factors, the step time) are written in
# the notebook's cells; these tabulate whatever functions the cells pass in.
# Larger GPTs of the same architecture, on paper: GPT-2 XL's shape (48 x 1600, GPT-2's
# vocabulary of 50,257 tokens, padded to 50,304) and a 7B-class shape (32 x 4096, 32,000 tokens).
GPT2_XL = gpt.GPTConfig(n_layer=48, d_model=1600, n_head=25, seq_len=1024, vocab=50257)
GPT_7B = gpt.GPTConfig(n_layer=32, d_model=4096, n_head=32, seq_len=2048, vocab=32000)

def params_of(cfg: gpt.GPTConfig) -> int:
    """The model's parameter count (the tied head counted once), by notebook 05's formula."""
    return gpt.non_embedding_params(cfg) + gpt.embedding_params(cfg)


def strategies_table(strategies: dict[str, dict]) -> pd.DataFrame:
    """What each strategy (the notebook's ``STRATEGIES``: ``shard`` = (params, grads, Adam)
    sharded?, ``buckets``, ``comm`` = [(collective, bytes per parameter)], ``how``) splits over
    the GPUs, its collectives per step, what implements it."""
    import pandas as pd

    def part(sharded: bool) -> str:
        return "1/N" if sharded else "whole"

    return pd.DataFrame([{
        "strategy": name, "params": part(s["shard"][0]), "grads": part(s["shard"][1]),
        "adam_state": part(s["shard"][2]), "ddp_buckets": s["buckets"],
        "collectives": " + ".join(f"{kind} ({per} B/param)" for kind, per in s["comm"]),
        "implemented_by": s["how"]} for name, s in strategies.items()])


def memory_table(models: dict[str, gpt.GPTConfig], memory_per_gpu, strategies,
                 gpus=(1, 2, 4, 8)) -> pd.DataFrame:
    """``memory_per_gpu(n_params, world, strategy)`` (bytes by part, with a 'total') tabulated
    in GiB for every model, strategy (names of ``strategies``) and GPU count."""
    import pandas as pd

    rows = []
    for label, cfg in models.items():
        n = params_of(cfg)
        for strategy in strategies:
            for world in gpus:
                gib = {f"{k}_gib": v / 2**30 for k, v in memory_per_gpu(n, world,
                                                                         strategy).items()}
                rows.append({"model": label, "params": n, "strategy": strategy,
                             "gpus": world, **gib})
    return pd.DataFrame(rows)


def comm_table(models: dict[str, gpt.GPTConfig], compute_ms: dict[str, float],
               link_gbps: float, comm_per_gpu, step_ms, strategies, gpus=(1, 2, 4, 8), *,
               strong: bool = False) -> pd.DataFrame:
    """``comm_per_gpu(n_params, world, strategy)`` bytes sent per GPU and step, their time at
    ``link_gbps``, and the step time (``step_ms(compute, bytes, link, overlap)``) and scaling
    efficiency this predicts with and without overlap. ``compute_ms``: one GPU's step; weak
    scaling (``strong=False``) keeps it per GPU, strong scaling divides it by the GPU count
    (the same global batch split N ways)."""
    import pandas as pd

    rows = []
    for label, cfg in models.items():
        n = params_of(cfg)
        for strategy in strategies:
            for world in gpus:
                sent = comm_per_gpu(n, world, strategy)
                c = compute_ms[label] / (world if strong else 1)
                serial, hidden = (step_ms(c, sent, link_gbps, o) for o in (False, True))
                rows.append({"model": label, "scaling": "strong" if strong else "weak",
                             "strategy": strategy, "gpus": world, "sent_gib": sent / 2**30,
                             "comm_ms": sent / (link_gbps * 1e9) * 1e3, "compute_ms": c,
                             "step_ms_no_overlap": serial, "step_ms_overlap": hidden,
                             "efficiency_no_overlap": c / serial,
                             "efficiency_overlap": c / hidden, "link_gbps": link_gbps})
    return pd.DataFrame(rows)


def efficiency_chart(table: pd.DataFrame, models: list[str],
                     strategies=("DDP", "FSDP2 (ZeRO-3)"), title: str = ""):
    """Predicted scaling efficiency against GPU count, one panel per model: for each strategy
    and each scaling in the table (weak: solid, strong: dashed) the band from no overlap to full
    overlap, its no-overlap edge drawn."""
    import matplotlib.pyplot as plt
    import pandas as pd

    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 3.6), squeeze=False)
    kinds = list(dict.fromkeys(table.get("scaling", pd.Series(["weak"] * len(table)))))
    for ax, label in zip(axes[0], models, strict=True):
        for i, strategy in enumerate(strategies):
            for kind in kinds:
                part = table[(table["model"] == label) & (table["strategy"] == strategy)
                             & (table.get("scaling", "weak") == kind)]
                style = "o-" if kind == "weak" else "s--"
                ax.plot(part["gpus"], 100 * part["efficiency_no_overlap"], style,
                        color=f"C{i}", label=f"{strategy}, {kind}, not overlapped")
                ax.fill_between(part["gpus"], 100 * part["efficiency_no_overlap"],
                                100 * part["efficiency_overlap"], color=f"C{i}",
                                alpha=0.15 if kind == "weak" else 0.08)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(table["gpus"].unique()), labels=sorted(table["gpus"].unique()))
        ax.set_ylim(0, 105)
        ax.set(xlabel="GPUs (weak: same batch per GPU; strong: same global batch)",
               ylabel="predicted scaling efficiency (%)", title=label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, title="band: up to full overlap", title_fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


# Datasheet NVLink bandwidth per GPU, both directions together, and where the figure is from.
NVLINK_GBPS = {"H200": (900.0, "NVIDIA H200 Tensor Core GPU datasheet (NVLink: 900 GB/s)"),
               "H100": (900.0, "NVIDIA H100 Tensor Core GPU datasheet (SXM, NVLink: 900 GB/s)"),
               "A100": (600.0, "NVIDIA A100 Tensor Core GPU datasheet (SXM, NVLink: 600 GB/s)")}


def datasheet_link(device_name: str | None) -> tuple[float, str]:
    """GB/s one GPU can send (half the datasheet's two-way NVLink figure) and the source; the
    H200's where the GPU is not in the table. The table's figures are the SXM boards': a PCIe
    card, whose GPUs talk over PCIe or an NVLink bridge, is not matched."""
    pcie = device_name is not None and ceilings.datasheet_match("PCIe", device_name)
    key = next((k for k in NVLINK_GBPS
                if device_name and not pcie and ceilings.datasheet_match(k, device_name)), None)
    both, source = NVLINK_GBPS[key or "H200"]
    where = "" if key else f" - not this machine's ({device_name or 'no GPU'}): the H200's"
    return both / 2, f"datasheet value: {source}, half of it per direction{where}"


def compute_from_05(saved: dict | None, device_name: str | None, tokens_per_step: int,
                    where: Path | str = "") -> tuple[float, str] | None:
    """Notebook 05's path-3 step time (ms) and its source (``where``: the file it was read
    from), from its table as ``results.save_table`` saved it - ``05_paths.json``'s rows and the
    environment they were measured in; None: notebook 05 did not run into this results folder -
    when it was measured on this device at ``tokens_per_step``; else None."""
    import pandas as pd

    table = pd.DataFrame((saved or {}).get("rows", []))
    if not {"path", "status", "step_ms", "tokens_per_s"} <= set(table.columns):
        return None
    row = table[(table["path"].astype(str) == "3") & (table["status"] == "ran")]
    measured_on = (saved.get("environment") or {}).get("gpu_name") or None
    if row.empty or measured_on != (device_name or None):
        return None
    ms, rate = float(row["step_ms"].iloc[0]), float(row["tokens_per_s"].iloc[0])
    if not math.isclose(rate * ms / 1e3, tokens_per_step, rel_tol=1e-6):
        return None
    return ms, (f"notebook 05's path 3, measured on {device_name or 'the CPU'}"
                + (f" ({where})" if where else ""))


# ------------------------------------------------------------------ tables of runs
def runs_table(runs: list[bench.Run]) -> pd.DataFrame:
    """One row per run: step time (median, IQR), tokens/s overall and per GPU, peak memory."""
    import pandas as pd

    rows = []
    for r in runs:
        t, world = r.timing, r.extra["world_size"]
        rows.append({"variant": r.extra["variant"], "world_size": world,
                     "step_ms": t.median_ms, "step_ms_iqr": t.iqr_ms, "q1_ms": t.q1_ms,
                     "q3_ms": t.q3_ms, "median_ms": t.median_ms, "tokens_per_s": r.tokens_per_s,
                     "tokens_per_s_per_gpu": r.tokens_per_s / world,
                     "peak_mem_gib": r.peak_mem_gib, "final_loss": r.final_loss,
                     "steps": len(r.losses)})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ Apex, mapped
# Each row: the legacy Apex symbol, the file (under the package root) that defines it, the
# names it must define there (a class's or function's keyword arguments after ':'), what it
# did, and the PyTorch counterpart(s) as importable dotted names.
APEX_MAP: list[dict] = [
    {"apex": "apex.parallel.DistributedDataParallel", "file": "apex/parallel/distributed.py",
     "defines": "DistributedDataParallel:message_size,delay_allreduce,"
                "gradient_predivide_factor,allreduce_always_fp32",
     "what_it_did": "wraps the model; broadcasts rank 0's weights, all-reduces the gradients "
                    "in buckets of message_size elements during backward, averages them",
     "pytorch": "torch.nn.parallel.DistributedDataParallel",
     "migration": "DDP(model, device_ids=[local_rank]); bucket_cap_mb sets the bucket size; "
                  "no_sync() for gradient accumulation; a communication hook replaces "
                  "gradient_predivide_factor; under autocast the grads are fp32 already"},
    {"apex": "apex.parallel.Reducer", "file": "apex/parallel/distributed.py",
     "defines": "Reducer", "what_it_did": "all-reduces the gradients when reduce() is called, "
     "no hooks, no overlap", "pytorch": "torch.distributed.all_reduce",
     "migration": "dist.all_reduce(p.grad) for each parameter (divide by the world size), or "
                  "DDP, which overlaps it with backward"},
    {"apex": "apex.parallel.SyncBatchNorm", "file": "apex/parallel/sync_batchnorm.py",
     "defines": "SyncBatchNorm", "what_it_did": "BatchNorm whose batch statistics are "
     "reduced over all ranks (a CUDA kernel in optimized_sync_batchnorm.py when built)",
     "pytorch": "torch.nn.SyncBatchNorm",
     "migration": "torch.nn.SyncBatchNorm(num_features, process_group=...)"},
    {"apex": "apex.parallel.convert_syncbn_model", "file": "apex/parallel/__init__.py",
     "defines": "convert_syncbn_model:process_group,channel_last",
     "what_it_did": "replaces every BatchNorm of a model by apex.parallel.SyncBatchNorm",
     "pytorch": "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
     "migration": "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP"},
    {"apex": "apex.parallel.create_syncbn_process_group", "file": "apex/parallel/__init__.py",
     "defines": "create_syncbn_process_group:group_size",
     "what_it_did": "groups of group_size ranks that share BatchNorm statistics",
     "pytorch": "torch.distributed.new_group",
     "migration": "group = dist.new_group(ranks=[...]); pass process_group=group"},
    {"apex": "python -m apex.parallel.multiproc", "file": "apex/parallel/multiproc.py",
     "defines": "", "what_it_did": "starts one process per visible GPU with --rank and "
     "--world-size arguments", "pytorch": "torch.distributed.run",
     "migration": "torchrun --standalone --nproc_per_node=N train.py; read RANK, LOCAL_RANK "
                  "and WORLD_SIZE from the environment"},
    {"apex": "apex.contrib.optimizers.distributed_fused_adam.DistributedFusedAdam",
     "file": "apex/contrib/optimizers/distributed_fused_adam.py",
     "defines": "DistributedFusedAdam:overlap_grad_sync,bucket_cap_mb,store_params,"
                "grad_sync_dtype,param_sync_dtype",
     "what_it_did": "ZeRO-2: Adam state and gradients sharded over the ranks, gradients "
                    "reduce-scattered in buckets during backward, a fused update of each "
                    "rank's shard, parameters all-gathered after it",
     "pytorch": "torch.distributed.fsdp.fully_shard, "
                "torch.distributed.optim.ZeroRedundancyOptimizer, torch.optim.AdamW",
     "migration": "fully_shard each block and the model, then AdamW(fused=True) on its "
                  "sharded parameters; or DDP + ZeroRedundancyOptimizer(params, "
                  "optimizer_class=torch.optim.AdamW, fused=True)"},
]


def legacy_apex_places() -> list[tuple[Path, str]]:
    """Where the legacy Apex source may be, in order: the legacy install (``build_apex.sh
    --legacy-amp``), ``$APEX_LEGACY_SRC`` (a local legacy source folder, as build_apex.sh reads
    it) and the source build_apex.sh staged for that install (``$APEX_WORKDIR/src/apex-legacy``,
    ``.apex/src/apex-legacy`` by default)."""
    places = [(machine.legacy_amp_dir(), "the legacy install")]
    if os.environ.get("APEX_LEGACY_SRC"):
        places.append((Path(os.environ["APEX_LEGACY_SRC"]), "APEX_LEGACY_SRC"))
    places.append((machine.apex_workdir() / "src" / "apex-legacy",
                   "the legacy source build_apex.sh staged"))
    return places


def legacy_apex_source() -> tuple[Path | None, str]:
    """The folder holding the legacy ``apex`` package (:func:`legacy_apex_places`, the first
    with apex/parallel/distributed.py) and what it is; (None, why not) when none has it."""
    places = legacy_apex_places()
    for root, what in places:
        if (root / "apex" / "parallel" / "distributed.py").is_file():
            return root, f"{what} ({root})"
    looked = "; ".join(f"{what} ({root})" for root, what in places)
    return None, (f"no legacy Apex source here: apex/parallel/distributed.py is in none of "
                  f"{looked} - ./build_apex.sh --legacy-amp stages it, or set APEX_LEGACY_SRC "
                  "to a legacy source folder")


def _parse(path: Path) -> ast.Module:
    """The syntax tree of a source file; its own warnings (old escape sequences) kept quiet."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _defined(tree: ast.Module, name: str) -> ast.ClassDef | ast.FunctionDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)
                 and n.name == name), None)


def _arguments(node: ast.ClassDef | ast.FunctionDef) -> set[str]:
    func = node if isinstance(node, ast.FunctionDef) else _defined(
        ast.Module(body=node.body, type_ignores=[]), "__init__")
    if func is None:
        return set()
    a = func.args
    return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}


def check_apex_symbol(root: Path, entry: dict) -> tuple[bool, str]:
    """Parse the entry's file under ``root`` (no import) and check what it must define."""
    path = root / entry["file"]
    if not path.is_file():
        return False, f"{entry['file']} is missing"
    if not entry["defines"]:
        return True, f"{entry['file']} exists"
    tree = _parse(path)
    name, _, args = entry["defines"].partition(":")
    node = _defined(tree, name)
    if node is None:
        return False, f"{name} is not defined in {entry['file']}"
    wanted = [a for a in args.split(",") if a]
    missing = sorted(set(wanted) - _arguments(node))
    if missing:
        return False, f"{name} in {entry['file']} lacks {', '.join(missing)}"
    kind = "class" if isinstance(node, ast.ClassDef) else "function"
    return True, f"{kind} {name} in {entry['file']}" + (
        f" with {', '.join(wanted)}" if wanted else "")


def deprecation_notes(root: Path) -> list[str]:
    """The deprecation messages written in the legacy apex/parallel sources."""
    notes = []
    for path in sorted((root / "apex" / "parallel").glob("*.py")):
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and "deprecated" in node.value and "removed" in node.value:
                notes.append(node.value.strip())
    return list(dict.fromkeys(notes))


def resolve(dotted: str) -> object | None:
    """The object a dotted name points to in this Python (module, then attributes), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def modern_apex_has_parallel() -> bool | None:
    """Whether the Apex installed here has apex/parallel (None: no Apex installed); looked up
    on disk, without importing Apex."""
    spec = importlib.util.find_spec("apex")
    if spec is None or not spec.submodule_search_locations or machine.wrong_apex():
        return None
    return any((Path(p) / "parallel").is_dir() for p in spec.submodule_search_locations)


def apex_table(root: Path | None) -> pd.DataFrame:
    """The migration map, each Apex row checked in the legacy source at ``root`` (None:
    unchecked) and each PyTorch counterpart resolved in this torch."""
    import pandas as pd

    rows = []
    for entry in APEX_MAP:
        ok, evidence = (check_apex_symbol(root, entry) if root is not None
                        else (None, "unchecked: no legacy source"))
        found = [resolve(name.strip()) is not None for name in entry["pytorch"].split(",")]
        rows.append({"apex": entry["apex"], "what_it_did": entry["what_it_did"],
                     "pytorch": entry["pytorch"], "migration": entry["migration"],
                     "apex_checked": ok, "apex_evidence": evidence,
                     "pytorch_found": all(found)})
    return pd.DataFrame(rows)


def has_argument(obj: object, name: str) -> bool:
    """True when callable ``obj`` takes an argument called ``name`` (inspect.signature)."""
    try:
        return name in inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return False


# ------------------------------------------------------------------ timing rounds
SETTLE_ROUNDS = 3  # the last rounds a settled cost must agree over


def round_overheads(rounds: dict[str, list[float]], baseline: str = "plain"
                    ) -> dict[str, list[float]]:
    """Each wrapper's step time over the baseline's in the same round, minus 1, round by round
    (``rounds``: name -> the median step time of each round, in ms)."""
    base = rounds[baseline]
    return {name: [a / b - 1 for a, b in zip(times, base, strict=True)]
            for name, times in rounds.items() if name != baseline}


def settled_each(rounds: dict[str, list[float]], baseline: str = "plain",
                 last: int = SETTLE_ROUNDS, tie: float = verdicts.TIE_FRACTION
                 ) -> dict[str, bool]:
    """Each wrapper's own flag: its per-round overhead (:func:`round_overheads`) has varied by
    at most ``tie`` (the tie rule's 3%) over the last ``last`` rounds."""
    if len(rounds[baseline]) < last:
        return dict.fromkeys((n for n in rounds if n != baseline), False)
    return {name: max(o[-last:]) - min(o[-last:]) <= tie
            for name, o in round_overheads(rounds, baseline).items()}


def settled(rounds: dict[str, list[float]], baseline: str = "plain",
            last: int = SETTLE_ROUNDS, tie: float = verdicts.TIE_FRACTION) -> bool:
    """The script's stop rule: True once every wrapper has settled (:func:`settled_each`)."""
    each = settled_each(rounds, baseline, last, tie)
    return len(rounds[baseline]) >= last and all(each.values())


def rounds_table(rounds: dict[str, list[float]], baseline: str = "plain") -> pd.DataFrame:
    """One row per wrapper, each with its own flags: its overhead over the rounds (median,
    quartiles, range), ``settled`` (its own last rounds within the tie rule),
    ``stable`` (:func:`verdicts.round_stability`: its rounds range within the spread limit of
    its median) and the verdict against the baseline in the same rounds
    (:func:`verdicts.rounds_table`: faster/slower only when every round agrees beyond the tie
    rule) with its compact ``label``; and the drifts of its step time and the baseline's
    (last round over first, minus 1)."""
    import pandas as pd

    base = rounds[baseline]
    done = settled_each(rounds, baseline)
    stability = verdicts.round_stability(rounds).set_index("candidate")
    pairs = verdicts.rounds_table(rounds, [(n, baseline) for n in rounds if n != baseline]
                                  ).set_index("candidate")
    rows = []
    for name, o in round_overheads(rounds, baseline).items():
        s = pd.Series(o)
        rows.append({"variant": name, "rounds": len(o), "overhead_pct": 100 * s.median(),
                     "q1_pct": 100 * s.quantile(0.25), "q3_pct": 100 * s.quantile(0.75),
                     "min_pct": 100 * s.min(), "max_pct": 100 * s.max(),
                     "settled": bool(done[name]),
                     "range_pct": float(stability.loc[name, "range_pct"]),
                     "stable": bool(stability.loc[name, "stable"]),
                     "verdict": pairs.loc[name, "verdict"], "label": pairs.loc[name, "label"],
                     "why": pairs.loc[name, "why"],
                     "own_drift_pct": 100 * (rounds[name][-1] / rounds[name][0] - 1),
                     "baseline_drift_pct": 100 * (base[-1] / base[0] - 1)})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ what Dynamo compiled
def dynamo_counts() -> dict[str, int]:
    """What Dynamo has done in this process so far: graphs compiled, frames it tried to compile
    and those it compiled, graph breaks, recompiles (guard failures) and the times it gave up on
    a frame at its recompile limit (the frame then runs eagerly)."""
    from torch._dynamo import utils as dynamo_utils

    counters = dynamo_utils.counters
    failures = getattr(dynamo_utils, "guard_failures", {})
    given_up = counters.get("unimplemented", {})
    return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
            "frames": int(counters["frames"].get("total", 0)),
            "frames_ok": int(counters["frames"].get("ok", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "recompiles": int(sum(len(v) for v in failures.values())),
            "limit_hits": int(sum(n for msg, n in given_up.items()
                                  if "recompile" in msg.lower() and "limit" in msg.lower()))}


def counts_since(before: dict[str, int], after: dict[str, int] | None = None) -> dict[str, int]:
    """:func:`dynamo_counts` now (or ``after``) minus ``before``: what one variant added."""
    after = dynamo_counts() if after is None else after
    return {k: after[k] - before.get(k, 0) for k in after}


# ------------------------------------------------------------------ what DDP allocates
def ddp_memory_growth(table: pd.DataFrame, buckets_gib: float, tol_gib: float = 0.02) -> dict:
    """DDP's allocation over the stages of the notebook's ``ddp_mem`` table (``stage``,
    ``{v}_allocated_vs_plain_gib`` and ``{v}_grads_vs_plain_gib`` for v in ddp, ddp+view, and
    ``ddp_rebuilt``), as data: what wrapping allocated (``wrap_gib``) beside the buckets on paper;
    the first stage with more than ``tol_gib`` on top (``grew_at``, None when none), how much
    (``more_gib``), whether it sits in the .grad tensors' storage (``in_grads``), whether that
    stage is the first after DDP rebuilt its buckets, and ddp+view's allocation there."""
    wrap = float(table["ddp_allocated_vs_plain_gib"].iloc[1])
    row = {"wrap_gib": wrap, "buckets_gib": buckets_gib, "grew_at": None,
           "more_gib": 0.0, "grads_gib": 0.0, "in_grads": None, "after_rebuild": False,
           "view_gib": None}
    extra = table["ddp_allocated_vs_plain_gib"] - wrap
    grown = table[extra > tol_gib]
    if grown.empty:
        return row
    at = int(grown.index[0])  # the first stage with more on top (a RangeIndex position)
    first = table.iloc[at]
    more, grads = float(extra.iloc[at]), float(first["ddp_grads_vs_plain_gib"])
    rebuilt = ("ddp_rebuilt" in table and bool(first["ddp_rebuilt"])
               and (at == 0 or not bool(table["ddp_rebuilt"].iloc[at - 1])))
    return {**row, "grew_at": str(first["stage"]), "more_gib": more, "grads_gib": grads,
            "in_grads": abs(grads - more) <= tol_gib, "after_rebuild": rebuilt,
            "view_gib": float(table["ddp+view_allocated_vs_plain_gib"].iloc[at])}


def pairs_table(table: pd.DataFrame, pairs: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """One row per (variant, its reference) of a :func:`runs_table`: both step times, the
    tie rule's verdict (:func:`verdicts.comparison_table`) with its ``label`` (``faster 1.40x``,
    ``tie``, ``slower 0.89x``), and the difference in peak memory (GiB)."""
    got = verdicts.comparison_table(table, pairs, key="variant")
    got["label"] = [verdicts.label(w, s) for w, s in zip(got["verdict"], got["speedup"],
                                                           strict=True)]
    mem = table.set_index("variant")["peak_mem_gib"]
    got["mem_vs_gib"] = [float(mem[a]) - float(mem[b]) for a, b in zip(got["variant"],
                                                                        got["vs"], strict=True)]
    return got


# ------------------------------------------------------------------ the script's instruments
# What notebook 07's training script calls around what it teaches: the variant records of its
# plan, memory marks, activation checkpointing's wrapper, the held-out loss, the checkpoint
# resume, Dynamo's counts and the interleaved timing rounds.
@dataclass(frozen=True)
class Variant:
    """One variant of the launch plan: what the script changes from plain training."""

    name: str  # the run's name in the results ("fsdp2+mp", "plain (repeat 1)")
    wrapper: str  # "plain" (one process only), "ddp" or "fsdp2"
    seed: int = 0  # initial weights and batches
    compile: bool = False  # torch.compile each block before it is wrapped
    ac: bool = False  # activation checkpointing on each block (:class:`Checkpointed`)
    bucket_view: bool = False  # DDP: gradient_as_bucket_view=True (no second copy of grads)
    mp: bool = False  # FSDP2: MixedPrecisionPolicy (bf16 gathers and compute, fp32 reduce)
    reshard: bool = True  # FSDP2: reshard_after_forward for the blocks


class Checkpointed(torch.nn.Module):
    """A block that keeps only its input for backward and recomputes the rest there."""

    def __init__(self, block: torch.nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block under ``torch.utils.checkpoint`` (non-reentrant)."""
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.block, x, use_reentrant=False)  # activation checkpointing


class MemoryMarks:
    """Memory at named stages of one variant, on a GPU (``taken``: name -> [bytes allocated
    now, at the peak so far, of the storage the .grad tensors live in (each storage once: with
    gradient_as_bucket_view that is DDP's buckets), whether DDP has rebuilt its buckets]); on a
    CPU nothing is recorded."""

    def __init__(self, device: torch.device):
        self.device = device
        self.taken: dict[str, list] = {}

    def take(self, name: str, model: torch.nn.Module) -> None:
        """Record stage ``name`` (FSDP2's sharded grads are not counted)."""
        from torch.distributed.tensor import DTensor

        grads = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes()
                 for g in (p.grad for p in model.parameters())
                 if g is not None and not isinstance(g, DTensor)}
        if self.device.type == "cuda":
            self.taken[name] = [torch.cuda.memory_allocated(self.device),
                                torch.cuda.max_memory_allocated(self.device),
                                sum(grads.values()),
                                bool(getattr(model, "_has_rebuilt_buckets", False))]


def fresh_dynamo() -> dict[str, int]:
    """Dynamo forgets what an earlier compiled variant built; returns its counts from here."""
    torch._dynamo.reset()
    return dynamo_counts()


def val_loss(model: torch.nn.Module, val_batches: gpt.BatchPlan, micro: int,
             amp: torch.dtype | None, device: torch.device) -> float:
    """The mean held-out loss, in chunks of ``micro`` sequences (equal: the mean of the means),
    eager even where blocks are compiled (no second compile); every rank the same batches."""
    with torch.no_grad(), torch.autocast(device.type, dtype=amp, enabled=amp is not None), \
            torch.compiler.set_stance("force_eager"):
        losses = torch.stack([model(xj, yj) for j in range(val_batches.steps)
                              for xj, yj in zip(*(t.split(micro) for t in val_batches.batch(j)),
                                                strict=True)])
    return float(losses.mean())


def save_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    path: Path | str) -> None:
    """Every rank writes its own shards of the model and of AdamW's state (DCP)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    state = {"model": get_model_state_dict(model),
             "optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id=path)


def load_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    path: Path | str) -> None:
    """Read each rank's shards into a model built the same way (DCP loads in place)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state = {"model": get_model_state_dict(model),
             "optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"], options=StateDictOptions(strict=True))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def resume(build, step, path: Path | str, at: int, steps: int) -> dict:
    """A fresh model from ``build()`` loads the checkpoint at ``path`` and trains steps ``at``
    to ``steps - 1`` with ``step(i, model, optimizer)``; returns the steps' losses (mean over
    the ranks) and the final weights' checksums. Rank 0 removes the checkpoint afterwards."""
    model, optimizer = build()
    load_checkpoint(model, optimizer, path)
    losses = torch.stack([step(i, model, optimizer) for i in range(at, steps)])
    dist.all_reduce(losses)  # the same steps the first model took after `at`
    record = {"from_step": at, "losses": (losses / dist.get_world_size()).tolist(),
              "checksums": checksums(full_params(model))}
    dist.barrier()  # every rank has read its shards: clean up
    if dist.get_rank() == 0:
        import shutil

        shutil.rmtree(path, ignore_errors=True)
    return record


def timing_rounds(steps: dict, rounds: int, round_steps: int,
                  device: torch.device) -> dict[str, list[float]]:
    """Each step function (name -> ``step(i)``) timed in turn, round after round, until their
    cost over the first settles (:func:`settled`) or ``rounds`` have run: name -> the median
    step time of each round, in ms."""
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            timed = bench.train(step, round_steps, device=device, warmup=1, label=name)
            times[name].append(timed.timing.median_ms)
        if settled(times):
            break
    return times
