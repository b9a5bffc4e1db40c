"""Notebook 04's plumbing (nothing here is taught): the opt-level map, the seeded model and data
both processes train, what a run recorded (dtypes, loss scales), the overflow and dtype checks,
and the child process that runs the legacy ``apex.amp`` script the notebook writes.

Apex removed ``apex.amp`` in 2025, so the course installs the last commit that has it into its
own folder (``./build_apex.sh --legacy-only``). That folder must never shadow the modern Apex,
so the legacy script runs in a child process (:func:`launch`, through the course's one child
launcher, :mod:`helpers.launch`) with the folder first on its ``PYTHONPATH``. The script itself -
``amp.initialize``, ``amp.scale_loss`` and the O0-O3 loop - is a cell of the notebook; it uses
:class:`Child` to read its plan and write its JSON.

Longer than 400 lines because both sides of that child live here - the plan the notebook sends
and the records the script sends back - with the checks the notebook reads on them; split, the
two sides of one protocol would change apart.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import itertools
import json
import math
import os
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from helpers import bench, errors, run_profile
from helpers import launch as launcher
from helpers.settings import LEGACY_DIR_VAR

OPT_LEVELS = ("O0", "O1", "O2", "O3")

# ------------------------------------------------------------------ the migration map
REMOVAL = {"commit": "cb65b8ed", "pull_request": "NVIDIA/apex#1896", "date": "2025-05-08",
           "last_commit_with_amp": "e13873debc4699d39c6861074b9a3b2a02327f92"}

# Per opt level: what it cast, where the master weights lived, how the loss was scaled, and
# the torch.amp code that replaces it. ``options`` are the defaults the legacy
# ``apex.amp.frontend`` sets; the notebook compares them with what the legacy Apex reports.
MIGRATION: list[dict] = [
    {"opt_level": "O0",
     "what_it_cast": "nothing: fp32 weights and fp32 math (the baseline)",
     "master_weights": "none needed: the fp32 model weights",
     "loss_scaling": "none (static 1.0)",
     "torch_amp_today": "plain fp32 training: no autocast, no GradScaler",
     "options": {"cast_model_type": "float32", "patch_torch_functions": False,
                 "keep_batchnorm_fp32": None, "master_weights": False, "loss_scale": 1.0}},
    {"opt_level": "O1",
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
                 "loss_scale": "dynamic"}},
    {"opt_level": "O2",
     "what_it_cast": "the model itself to fp16 (BatchNorm kept fp32); inputs cast to fp16 "
                     "and outputs to fp32 by a patched forward",
     "master_weights": "fp32 copies inside the optimizer (amp swapped its param groups)",
     "loss_scaling": "dynamic (as O1)",
     "torch_amp_today": "same code as O1: the fp32 model's weights are the master copies "
                        "and autocast casts them per op; hand-written fp16 weights + fp32 "
                        "masters only where weight memory must shrink",
     "options": {"cast_model_type": "float16", "patch_torch_functions": False,
                 "keep_batchnorm_fp32": True, "master_weights": True,
                 "loss_scale": "dynamic"}},
    {"opt_level": "O3",
     "what_it_cast": "everything to fp16, BatchNorm included (pure fp16)",
     "master_weights": "none: the optimizer updates fp16 weights",
     "loss_scaling": "none (static 1.0)",
     "torch_amp_today": "no torch.amp equivalent on purpose; model.half() by hand if you "
                        "must, or bf16 weights with fp32 master copies",
     "options": {"cast_model_type": "float16", "patch_torch_functions": False,
                 "keep_batchnorm_fp32": False, "master_weights": False, "loss_scale": 1.0}},
]

# Compute capability per GPU generation (examples are common parts of that generation).
GPU_GENERATIONS: list[tuple[str, str, tuple[int, int]]] = [
    ("Volta", "V100", (7, 0)), ("Turing", "T4, RTX 20xx", (7, 5)),
    ("Ampere", "A100, A30", (8, 0)), ("Ampere", "A10, A40, RTX 30xx", (8, 6)),
    ("Ada Lovelace", "L4, L40S, RTX 40xx", (8, 9)), ("Hopper", "H100, H200", (9, 0)),
    ("Blackwell", "B200, GB200", (10, 0)), ("Blackwell", "RTX 50xx, RTX PRO 6000", (12, 0)),
]


def bf16_native(capability: tuple[int, int]) -> bool:
    """True when a GPU of this compute capability has bf16 tensor cores (8.0 or newer)."""
    return tuple(capability) >= (8, 0)


def migration_table():
    """The migration map as a pandas table (one row per opt level)."""
    import pandas as pd

    cols = ["opt_level", "what_it_cast", "master_weights", "loss_scaling", "torch_amp_today"]
    return pd.DataFrame([{c: row[c] for c in cols} for row in MIGRATION])


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
    for entry in MIGRATION:
        got = reported.get(entry["opt_level"])
        if got is None:
            continue
        for key, expected in entry["options"].items():
            rows.append({"opt_level": entry["opt_level"], "option": key, "map_says": expected,
                         "apex_set": got.get(key), "matches": got.get(key) == expected})
    return rows


def apex_amp_import() -> str:
    """What ``from apex import amp`` does in this process: 'ok (...)' or the one-line error."""
    try:
        apex = importlib.import_module("apex")
        from apex import amp  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return f"ok: apex.amp imports (from {apex.__file__})"


# ------------------------------------------------------------------ one model, one data set
@dataclass(frozen=True)
class TrainConfig:
    """Sizes and seeds of the notebook's training problem (an MLP classifier)."""

    steps: int = 100
    batch: int = 2048
    d_in: int = 1024
    hidden: int = 4096
    depth: int = 3          # hidden Linear layers (each followed by GELU)
    classes: int = 64
    pool: int = 16          # distinct batches; step k trains on batch k % pool
    lr: float = 1e-4        # Adam; 1e-3 makes this 4096-wide MLP jump on its first steps
    adam_eps: float = 1e-8  # Adam's eps (torch's default); pure fp16 (O3) needs a larger one
    seed: int = 0
    warmup_steps: int = 5   # first steps left out of the step-time median
    rounds: int = 5         # interleaved timing rounds (section 7)
    round_steps: int = 10   # timed steps per candidate and round (after 3 warm-up steps)

    @classmethod
    def smoke(cls) -> TrainConfig:
        """Tiny sizes for the CPU smoke run."""
        return cls(steps=30, batch=64, d_in=32, hidden=64, depth=2, classes=8, pool=4, lr=3e-3,
                   rounds=3, round_steps=4)

    def to_json(self) -> str:
        """The config as a JSON string (how the child process receives it)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        """Inverse of :meth:`to_json`."""
        return cls(**json.loads(text))


def make_model(cfg: TrainConfig) -> nn.Sequential:
    """Linear+GELU blocks, a LayerNorm and a classifier head; seeded, built in fp32 on the CPU."""
    torch.manual_seed(cfg.seed)
    layers: list[nn.Module] = [nn.Linear(cfg.d_in, cfg.hidden), nn.GELU()]
    for _ in range(cfg.depth - 1):
        layers += [nn.Linear(cfg.hidden, cfg.hidden), nn.GELU()]
    layers += [nn.LayerNorm(cfg.hidden), nn.Linear(cfg.hidden, cfg.classes)]
    return nn.Sequential(*layers)


def make_batches(cfg: TrainConfig, device: torch.device | str) -> list[tuple[torch.Tensor, ...]]:
    """``cfg.pool`` batches of Gaussian inputs labelled by a fixed random linear teacher."""
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    teacher = torch.randn(cfg.d_in, cfg.classes, generator=gen)
    batches = []
    for _ in range(cfg.pool):
        x = torch.randn(cfg.batch, cfg.d_in, generator=gen)
        batches.append((x.to(device), (x @ teacher).argmax(dim=1).to(device)))
    return batches


def first_linear(model: nn.Module) -> nn.Linear:
    """The model's first Linear layer, whose output dtype the runs report."""
    return next(m for m in model.modules() if isinstance(m, nn.Linear))


def dtype_name(dtype: torch.dtype | None) -> str:
    """'float16' for torch.float16; '' for None."""
    return str(dtype).replace("torch.", "") if dtype is not None else ""


# ------------------------------------------------------------------ what a run did
class Recorder:
    """Reads what a run does without changing it: the first Linear's output dtype, and the loss
    scale after every step (pass ``after_step`` to ``bench.train``; reading the scale waits for
    the GPU, outside the timed window)."""

    def __init__(self, model: nn.Module, scale: Callable[[], float] | None = None) -> None:
        self.model, self.scale = model, scale
        self.scales: list[float] = []
        self.activation: torch.dtype | None = None
        self._hook = first_linear(model).register_forward_hook(self._seen)

    def _seen(self, _module, _inputs, out) -> None:  # a forward hook must return None
        if self.activation is None:
            self.activation = out.dtype

    def after_step(self, _i: int, _loss: torch.Tensor) -> None:
        """Record the loss scale (when the run has one)."""
        if self.scale is not None:
            self.scales.append(float(self.scale()))

    def finish(self, run: bench.Run, peak: bench.Peak, optimizer: torch.optim.Optimizer, *,
               api: str, recipe: str) -> bench.Run:
        """Put the peak memory, the dtypes and the loss scales into ``run`` and return it."""
        self._hook.remove()
        run.peak_mem_gib = peak.gib
        run.extra.update(
            api=api, opt_level_or_recipe=recipe,
            param_dtype=dtype_name(next(self.model.parameters()).dtype),
            master_dtype=dtype_name(optimizer.param_groups[0]["params"][0].dtype),
            activation_dtype=dtype_name(self.activation), loss_scales=self.scales,
            loss_scale_final=self.scales[-1] if self.scales else math.nan)
        return run


def failed_run(label: str, api: str, recipe: str, error: str, device: str) -> bench.Run:
    """A run that did not happen, with its one-line reason."""
    return bench.Run(label, device, error=error,
                     extra={"api": api, "opt_level_or_recipe": recipe})


def scale_traces(runs: list[bench.Run]):
    """One row per run with a loss scale: where it started and ended, and at which steps it
    was halved (an overflow: that step was skipped) or grown."""
    import pandas as pd

    rows = []
    for r in runs:
        s = r.extra.get("loss_scales") or []
        if not s:
            continue
        rows.append({"run": r.label, "scale_first_step": s[0], "scale_final": s[-1],
                     "scale_min": min(s),
                     "halved_at_steps": [i for i in range(1, len(s)) if s[i] < s[i - 1]],
                     "grown_at_steps": [i for i in range(1, len(s)) if s[i] > s[i - 1]]})
    return pd.DataFrame(rows, columns=["run", "scale_first_step", "scale_final", "scale_min",
                                       "halved_at_steps", "grown_at_steps"])


O3_COLUMNS = ["run", "adam_eps", "eps_in_fp16", "outcome", "first_nonfinite_step",
              "highest_loss", "final_loss", "vs_fp32_pct"]


def o3_table(runs: list[bench.Run], base: bench.Run, tolerance: float,
             eps: dict[str, float]):
    """One row per pure-fp16 run (``eps``: label -> its Adam eps): the eps as fp16 stores it and
    its ``outcome`` - 'non-finite' (from ``first_nonfinite_step``), 'did not learn', or
    'within tolerance' / 'outside tolerance' of ``base``'s (fp32) final loss (``tolerance``, a
    fraction)."""
    import pandas as pd

    rows = []
    for r in runs:
        e = eps.get(r.label, math.nan)
        gap = (r.final_loss - base.final_loss) / base.final_loss if r.finite else math.nan
        if not r.finite:
            outcome = "non-finite"
        elif not r.learned:
            outcome = "did not learn"
        else:
            outcome = "within tolerance" if abs(gap) <= tolerance else "outside tolerance"
        finite = [v for v in r.losses if math.isfinite(v)]
        rows.append({"run": r.label, "adam_eps": e, "eps_in_fp16": float(torch.tensor(e).half()),
                     "outcome": outcome, "first_nonfinite_step": r.first_nonfinite_step,
                     "highest_loss": max(finite, default=math.nan),
                     "final_loss": r.final_loss if r.finite else math.nan,
                     "vs_fp32_pct": 100 * gap})
    return pd.DataFrame(rows, columns=O3_COLUMNS)


# ------------------------------------------------------------------ step times
ROUND_WARMUP = 3  # untimed steps per candidate and round


def stepper(build: Callable[[], tuple], step: Callable, batches) -> Callable[[], object]:
    """A fresh ``(model, optimizer, scaler) = build()`` and a zero-argument call that trains its
    next step with ``step`` on the next batch of the pool (what interleaved rounds time)."""
    model, optimizer, scaler = build()
    seen = iter(range(1 << 62))
    return lambda: step(model, optimizer, scaler, *batches[next(seen) % len(batches)])


def rounds_of(candidates: dict[str, Callable[[], contextlib.AbstractContextManager]], *,
              rounds: int, repeats: int, device: torch.device | str,
              warmup: int = ROUND_WARMUP, discard: int = 1
              ) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Time candidates that cannot live side by side (one ``amp.initialize`` at a time) in
    interleaved rounds: each round enters every candidate's context (a fresh run, yielding a
    zero-argument step) in an order rotated by one place, times ``repeats`` steps after
    ``warmup`` with :func:`helpers.bench.benchmark` and leaves it; the first ``discard`` rounds
    are not kept (as :func:`helpers.bench.interleaved`). Returns name -> each kept round's
    median (ms), and name -> the one-line error of a candidate that failed (then dropped)."""
    names = list(candidates)
    out: dict[str, list[float]] = {n: [] for n in names}
    failed: dict[str, str] = {}
    for k in range(discard + rounds):
        shift = k % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            if name in failed:
                continue
            try:
                with candidates[name]() as step:
                    ms = bench.benchmark(step, label=name, warmup=warmup, repeats=repeats,
                                         flush=False, device=device).median_ms
                if k >= discard:
                    out[name].append(ms)
            except Exception as exc:
                failed[name] = errors.one_line(exc, 300)
    return {n: ms for n, ms in out.items() if n not in failed}, failed


def across_processes(a: list[float], b: list[float], *, tie: float | None = None
                     ) -> tuple[str, str]:
    """The verdict of ``a`` against ``b`` timed in rounds of two different processes, where no
    round of one has a partner round of the other: 'faster' only when ``a``'s slowest round
    beats ``b``'s fastest by more than ``tie``, 'slower' the other way round, else 'cannot
    tell apart' (a wide spread of either's rounds makes them overlap)."""
    from helpers import verdicts

    tie = verdicts.TIE_FRACTION if tie is None else tie
    if not a or not b or min(a) <= 0 or min(b) <= 0:
        raise ValueError("each process needs at least one positive round median")
    if max(a) * (1 + tie) < min(b):
        return "faster", "every round of one process beat every round of the other"
    if min(a) > max(b) * (1 + tie):
        return "slower", "every round of one process lost to every round of the other"
    return verdicts.TIE_WORD, "the two processes' rounds overlap or differ by under 3%"


SPEED_COLUMNS = ["candidate", "vs", "process", "candidate_ms", "vs_ms", "speedup",
                 "speedup_min", "speedup_max", "rounds", "verdict", "why", "label"]


def speed_table(kernel: dict[str, list[float]], child: dict[str, list[float]], base: str,
                pairs: list[tuple[str, str]]):
    """Section 7's table from each process's interleaved rounds (name -> each round's median,
    ms): the fastest of ``kernel`` (:func:`helpers.verdicts.fastest_by_rounds`) against
    ``base``, then each (candidate, vs) pair. A pair timed in the same process is read round by
    round (:func:`helpers.verdicts.rounds_table`); a pair across the two processes only by the
    rounds' ranges (:func:`across_processes`). ``label`` is the compact verdict."""
    import pandas as pd

    from helpers import verdicts

    wanted = []
    if kernel and base in kernel and len(kernel) > 1:
        best = verdicts.fastest_by_rounds({n: ms for n, ms in kernel.items() if n != base})[0]
        wanted.append((best, base))
    wanted += [p for p in pairs if p not in wanted]
    rows = []
    for a, b in wanted:
        for where, rounds in (("this kernel", kernel), ("child", child)):
            if a in rounds and b in rounds:
                row = verdicts.rounds_table(rounds, [(a, b)]).iloc[0].to_dict()
                rows.append({**row, "process": where})
                break
        else:
            ra, rb = kernel.get(a) or child.get(a), kernel.get(b) or child.get(b)
            if not ra or not rb:
                continue
            word, why = across_processes(ra, rb)
            speedup = statistics.median(rb) / statistics.median(ra)
            rows.append({"candidate": a, "vs": b, "process": "across",
                         "candidate_ms": statistics.median(ra), "vs_ms": statistics.median(rb),
                         "speedup": speedup, "speedup_min": min(rb) / max(ra),
                         "speedup_max": max(rb) / min(ra), "rounds": min(len(ra), len(rb)),
                         "verdict": word, "why": why, "label": verdicts.label(word, speedup)})
    return pd.DataFrame(rows, columns=SPEED_COLUMNS)


RUNS_COLUMNS = ["run", "step_ms", "step_iqr_ms", "final_loss", "vs_fp32_pct", "param_dtype",
                "master_dtype", "activation_dtype", "peak_mem_gib", "scale_halvings", "learned",
                "within_tolerance", "asserted"]


def runs_table(runs: list[bench.Run], base: bench.Run, tolerance: float,
               unchecked: tuple[str, ...] = ()):
    """One row per run that ran: its median step time and IQR, its final loss and the
    difference to ``base`` (fp32) in percent, its dtypes and peak memory, how often its loss
    scale was halved (each halving skipped a step), learned, whether it ended within
    ``tolerance`` (a fraction) of fp32's final loss, and whether the notebook asserts that
    (not for recipes whose name starts with one of ``unchecked``)."""
    import pandas as pd

    rows = []
    for r in runs:
        if not r.ok:
            continue
        row = r.row()
        diff = r.final_loss - base.final_loss
        scales = r.extra.get("loss_scales") or []
        rows.append({**{c: row.get(c, math.nan) for c in RUNS_COLUMNS},
                     "vs_fp32_pct": 100 * diff / base.final_loss,
                     "scale_halvings": sum(b < a for a, b in itertools.pairwise(scales)),
                     "within_tolerance": bool(r.finite and abs(diff)
                                              <= tolerance * base.final_loss),
                     "asserted": not str(r.extra.get("opt_level_or_recipe", ""))
                     .startswith(unchecked)})
    return pd.DataFrame(rows, columns=RUNS_COLUMNS)


LEVELS_COLUMNS = ["opt_level", "torch_amp_recipe", "apex_options_match", "torch_restored",
                  "legacy_trained", "recipe_trained", "recipe_vs_legacy", "overflow_skipped"]


def levels_table(runs, speed, overflow, levels: dict[str, dict], replaced_by: dict[str, str]):
    """The summary, one row per opt level: the torch.amp recipe that replaces it
    (``replaced_by``: level -> run label), whether the legacy Apex set the options of the map
    and restored torch after it (``levels``: the child's reports), whether the level and its
    recipe trained (``runs``: :func:`runs_table`; learned and within the tolerance), the
    recipe's speed label against the level (``speed``: :func:`speed_table`) and whether the
    level skipped the forced overflow step (``overflow``: rows of :func:`overflow_probe`).
    None where it was not measured here."""
    import pandas as pd

    trained = {r.run: bool(r.learned and r.within_tolerance) for r in runs.itertuples()}
    labels = {(r.candidate, r.vs): r.label for r in speed.itertuples()}
    skipped = {}
    for r in overflow.to_dict(orient="records"):
        if not r.get("error") and "params_unchanged" in r:
            skipped[r["run"]] = bool(r["params_unchanged"] and r["scale_halved"]
                                     and r["next_step_updates"])
    rows = []
    for entry in MIGRATION:
        level = entry["opt_level"]
        legacy, recipe = f"apex.amp {level}", replaced_by.get(level)
        info = levels.get(level, {})
        got = info.get("options")
        rows.append({"opt_level": level, "torch_amp_recipe": recipe,
                     "apex_options_match": (all(got.get(k) == v for k, v
                                                in entry["options"].items()) if got else None),
                     "torch_restored": info.get("restored"),
                     "legacy_trained": trained.get(legacy),
                     "recipe_trained": trained.get(recipe),
                     "recipe_vs_legacy": labels.get((recipe, legacy)),
                     "overflow_skipped": skipped.get(legacy)})
    return pd.DataFrame(rows, columns=LEVELS_COLUMNS)


# ------------------------------------------------------------------ checks
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


def overflow_probe(step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], model: nn.Module,
                   optimizer: torch.optim.Optimizer, scale: Callable[[], float] | None,
                   batches, *, warm: int = 3) -> dict:
    """Train ``warm`` steps of ``step(x, y)``, then force an inf into the first Linear's weight
    gradient for one step and report the loss scale before/after and whether that step changed
    any parameter (the model's and the optimizer's, i.e. master copies). One more clean step
    checks that training resumes."""
    if scale is None:
        raise ValueError("overflow_probe needs a run with a loss scaler")
    params = list(model.parameters()) + [p for g in optimizer.param_groups for p in g["params"]]
    inject = InfGradOnce()
    handle = first_linear(model).weight.register_hook(inject)
    try:
        for i in range(warm):
            step(*batches[i % len(batches)])
        before = [t.detach().clone() for t in params]
        scale_before = float(scale())
        inject.armed = True
        step(*batches[warm % len(batches)])
        scale_after = float(scale())
        unchanged = all(torch.equal(a, b) for a, b in zip(before, params, strict=True))
        step(*batches[(warm + 1) % len(batches)])
        resumed = any(not torch.equal(a, b) for a, b in zip(before, params, strict=True))
    finally:
        handle.remove()
    return {"inf_injected": inject.fired, "loss_scale_before": scale_before,
            "loss_scale_after": scale_after, "scale_halved": scale_after == scale_before / 2,
            "params_unchanged": unchanged, "next_step_updates": resumed}


def gradient_representability(cfg: TrainConfig, batch, device: torch.device | str,
                              scales: tuple[float, ...] = (1.0, 2.0**16)) -> list[dict]:
    """Fresh fp32 model, one fp32 backward: the share of non-zero gradient values that become 0
    (underflow) or inf (overflow) when cast to fp16 after multiplying by each loss scale, and
    when cast to bf16 unscaled."""
    model = make_model(cfg).to(device)
    x, y = batch
    F.cross_entropy(model(x), y).backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    nonzero = grads != 0
    n = max(int(nonzero.sum()), 1)
    rows = []
    for dtype, scale in [(torch.float16, s) for s in scales] + [(torch.bfloat16, 1.0)]:
        cast = (grads * scale).to(dtype)
        rows.append({"format": dtype_name(dtype), "loss_scale": scale,
                     "underflow_pct": 100.0 * int(((cast == 0) & nonzero).sum()) / n,
                     "overflow_pct": 100.0 * int(torch.isinf(cast).sum()) / n,
                     "grad_abs_median": float(grads[nonzero].abs().median())})
    return rows


def _probe_ops() -> dict[str, Callable]:
    """Matmuls take fp32 inputs (weights are fp32); the pointwise, reduction and loss ops take
    a half-precision activation ``h``, as a previous matmul would produce it."""
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
    for name, fn in _probe_ops().items():
        with context() if context is not None else contextlib.nullcontext():
            try:
                out[name] = dtype_name(fn(a, w, h, y).dtype)
            except Exception as exc:  # an op the backend lacks in this dtype
                out[name] = f"error: {type(exc).__name__}"
    return out


# ------------------------------------------------------------------ the child's side
# Compiled modules of a modern Apex build that the legacy Python code would pick up from
# site-packages (amp_C for loss scaling; apex_C and syncbn are imported by apex.parallel).
# apex_C and syncbn stay hidden (legacy amp does not use them); amp_C is let through only
# when :func:`fused_kernel_check` finds every kernel legacy amp calls in it, with results
# equal to PyTorch's; otherwise it is hidden too and legacy amp uses its Python fallback.
COMPILED_APEX_MODULES = ("amp_C", "apex_C", "syncbn")
CHUNK_SIZE = 2048 * 32  # what legacy amp's multi_tensor_applier passes to every kernel


def legacy_kernel_calls(apex_dir: Path | str) -> list[str]:
    """The ``amp_C.<name>`` kernels the legacy ``apex/amp`` and ``apex/multi_tensor_apply``
    code refers to, read from its source (``apex_dir``: the legacy package's folder)."""
    import ast

    names = set()
    for sub in ("amp", "multi_tensor_apply"):
        for path in sorted((Path(apex_dir) / sub).rglob("*.py")):
            try:
                tree = ast.parse(path.read_text(errors="replace"))
            except SyntaxError:
                continue
            names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                      and isinstance(node.value, ast.Name) and node.value.id == "amp_C"}
    return sorted(names)


def _worst(diff: torch.Tensor) -> float:
    """The largest absolute difference, inf where an element was never written (NaN)."""
    return float(torch.nan_to_num(diff.abs(), nan=math.inf).max())


def _kernel_errors(amp_c, device: torch.device, calls: list[str]) -> dict[str, float]:
    """Each scaler kernel of ``amp_c`` run as legacy amp runs it, on fp16 and on fp32 gradients
    (one dtype per tensor list, as amp's scaler groups them: the kernels read a list as its
    first tensor's dtype), against PyTorch: name -> largest absolute difference (for the l2
    norm, a tenth of the relative one: its sum runs in another order); outputs start as NaN, so
    an element the kernel does not write shows; an inf must set the overflow flag."""
    gen = torch.Generator().manual_seed(0)
    sizes = (1000, 3, 70_000)  # one tensor longer than a chunk
    noop = torch.zeros(1, dtype=torch.int, device=device)
    out = {"multi_tensor_scale": 0.0, "multi_tensor_axpby": 0.0}

    def nan_like(n: int) -> torch.Tensor:
        return torch.full((n,), float("nan"), device=device)

    for dtype in (torch.float16, torch.float32):
        grads = [(torch.randn(n, generator=gen) * 1e3).to(device, dtype) for n in sizes]
        stashed = [torch.randn(n, generator=gen).to(device) for n in sizes]
        masters = [nan_like(n) for n in sizes]
        amp_c.multi_tensor_scale(CHUNK_SIZE, noop, [grads, masters], 1 / 2**16)
        out["multi_tensor_scale"] = max(out["multi_tensor_scale"], *(
            _worst(m - g.float() / 2**16) for m, g in zip(masters, grads, strict=True)))
        masters = [nan_like(n) for n in sizes]
        amp_c.multi_tensor_axpby(CHUNK_SIZE, noop, [grads, stashed, masters], 1 / 2**16, 1.0, 0)
        out["multi_tensor_axpby"] = max(out["multi_tensor_axpby"], *(
            _worst(m - (g.float() / 2**16 + s))
            for m, g, s in zip(masters, grads, stashed, strict=True)))
    if "multi_tensor_l2norm" in calls:  # relative: a sum in another order
        stashed = [torch.randn(n, generator=gen).to(device) for n in sizes]
        norm = amp_c.multi_tensor_l2norm(CHUNK_SIZE, noop, [stashed], False)[0]
        want = torch.linalg.vector_norm(torch.cat(stashed))
        out["multi_tensor_l2norm"] = float((norm.float().reshape(()) - want).abs() / want) / 10
    if int(noop.item()) != 0:
        raise RuntimeError("the overflow flag was set on finite gradients")
    grads = [(torch.randn(n, generator=gen)).to(device, torch.float16) for n in sizes]
    grads[2][5] = float("inf")
    amp_c.multi_tensor_scale(CHUNK_SIZE, noop, [grads, [nan_like(n) for n in sizes]], 1.0)
    if int(noop.item()) == 0:
        raise RuntimeError("multi_tensor_scale did not flag an inf gradient")
    return out


def fused_kernel_check(apex_dir: Path | str, device: torch.device | str) -> dict:
    """Can the legacy amp run on the modern build's ``amp_C``? The kernels its source calls
    (:func:`legacy_kernel_calls`) must all exist there, and the scaler's kernels must give
    PyTorch's results (:func:`_kernel_errors`); ``ok`` and, when not, ``why`` in one line."""
    device = torch.device(device)
    result: dict = {"ok": False, "calls": legacy_kernel_calls(apex_dir), "missing": [],
                    "max_abs_error": {}, "why": ""}
    try:
        amp_c = importlib.import_module("amp_C")
    except Exception as exc:
        result["why"] = f"the modern amp_C does not import: {errors.one_line(exc, 200)}"
        return result
    result["missing"] = [n for n in result["calls"] if not hasattr(amp_c, n)]
    if result["missing"]:
        result["why"] = f"the modern amp_C lacks {', '.join(result['missing'])}"
        return result
    if device.type != "cuda":
        result["why"] = "the fused kernels need a CUDA GPU"
        return result
    try:
        result["max_abs_error"] = _kernel_errors(amp_c, device, result["calls"])
    except Exception as exc:
        result["why"] = f"a kernel call failed: {errors.one_line(exc, 200)}"
        return result
    worst = max(result["max_abs_error"].values(), default=0.0)
    result["ok"] = worst <= 1e-6
    if not result["ok"]:
        result["why"] = f"the kernels differ from PyTorch by up to {worst:.3g}"
    return result


def _originals() -> dict[str, object]:
    return {"F.linear": F.linear, "F.softmax": F.softmax, "torch.matmul": torch.matmul,
            "Tensor.__matmul__": torch.Tensor.__matmul__, "Tensor.sum": torch.Tensor.sum}


ORIGINALS = _originals()  # taken when this module is imported, before apex.amp patches them


def reset_amp() -> bool:
    """Undo what ``amp.initialize`` left in the process (O1's patches of torch functions, the
    loss scalers, the options) so the next opt level starts clean; True when the patched
    functions are the originals again."""
    from apex import amp

    state = amp._amp_state
    handle = getattr(state, "handle", None)
    for mod, name, fn in reversed(getattr(handle, "_all_wrappers", [])):
        if isinstance(mod, dict):
            mod[name] = fn
        else:
            setattr(mod, name, fn)
    if handle is not None:
        handle._all_wrappers = []
        del state.handle
    sys.modules["apex.amp.amp"]._DECORATOR_HANDLE = None
    state.loss_scalers = []
    if hasattr(state, "opt_properties"):
        del state.opt_properties
    return all(_originals()[k] is v for k, v in ORIGINALS.items())


def jsonable_options(options: dict) -> dict:
    """amp's options with dtypes written by name."""
    return {k: (dtype_name(v) if isinstance(v, torch.dtype) else v) for k, v in options.items()}


def warnings_table(levels: dict[str, dict]):
    """The distinct warnings the legacy Apex raised over all levels (``levels``: the child's
    reports), each cut to its first sentence, sorted: one column, ``warning``."""
    import pandas as pd

    cut = {(m.group(1) if (m := re.match(r"(.+?[.!?])(?=\s|$)", w.strip())) else w.strip())
           for info in levels.values() for w in info.get("warnings", [])}
    return pd.DataFrame({"warning": sorted(cut)})


class _HideModules(importlib.abc.MetaPathFinder):
    """Makes ``import NAME`` fail for the given top-level names."""

    def __init__(self, names: tuple[str, ...]):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.names:
            raise ImportError(f"{fullname} is hidden: the legacy apex.amp runs Python-only")
        return None


def fused_label(opt_level: str) -> str:
    """The name of a legacy run with the modern build's fused kernels, e.g. 'O1 fused'."""
    return f"{opt_level} fused"


def o3_label(eps: float) -> str:
    """The name of an O3 run with Adam's eps raised to ``eps``, e.g. 'O3 eps=0.001'."""
    return f"O3 eps={eps:g}"


def check_eps(values) -> tuple[float, ...]:
    """``o3_eps`` as a tuple of floats in (0, 1); one float becomes a one-value tuple."""
    if isinstance(values, int | float):
        values = (values,)
    try:
        values = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise errors.CourseError(f"o3_eps = {values!r} is not a number or a tuple of numbers: "
                                  "write e.g. o3_eps = (1e-4, 1e-3).") from None
    bad = [v for v in values if not 0 < v < 1]
    if bad:
        raise errors.CourseError(f"o3_eps must hold Adam eps values between 0 and 1, not "
                                  f"{bad}: write e.g. o3_eps = (1e-4, 1e-3).")
    return values


def plan_problem(plan: dict) -> str:
    """'' when the child can run ``plan``, else the one sentence why not: an unknown opt level,
    an eps outside (0, 1)."""
    bad = [lvl for key in ("levels", "overflow_levels", "fused_levels", "timed_levels")
           for lvl in plan.get(key, []) if lvl not in OPT_LEVELS]
    if bad:
        return f"unknown opt level {', '.join(bad)}: use {', '.join(OPT_LEVELS)}"
    try:
        check_eps(plan.get("o3_eps", []))
    except errors.CourseError as exc:
        return str(exc)
    return ""


class Child:
    """The legacy script's side: the plan the launcher passed, amp's import, one level at a
    time (warnings and failures caught, amp reset), and the JSON written at the end."""

    def __init__(self, plan: dict, out: Path) -> None:
        self.cfg = TrainConfig(**plan["config"])
        self.device = torch.device(plan.get("device", "cpu"))
        self.levels = list(plan.get("levels", []))
        self.o3_eps = [float(e) for e in plan.get("o3_eps", [])]
        self.overflow_levels = list(plan.get("overflow_levels", []))
        self.fused_levels = list(plan.get("fused_levels", []))
        self.timed_levels = list(plan.get("timed_levels", []))
        self.fused_ok = False
        self.out = out
        self.start = time.perf_counter()
        self.import_error = ""
        self.payload: dict = {"meta": {"python": sys.version.split()[0],
                                       "torch": torch.__version__, "device": self.device.type,
                                       "plan": plan, "pid": os.getpid()},
                              "runs": [], "overflow": [], "levels": {}, "import_error": "",
                              "rounds": {}, "round_errors": {}}

    @classmethod
    def from_argv(cls, argv: list[str] | None = None) -> Child:
        """Read ``--plan JSON --out PATH`` (what :func:`launch` passes); refuse, with exit
        status 2, unknown levels and bad eps values."""
        plan, out = launcher.read_plan(argv, description="the legacy apex.amp script of "
                                       "notebook 04", check=plan_problem)
        if torch.cuda.is_available():
            run_profile.cap_gpu_memory()  # the cap holds in the child too
        return cls(plan, out)

    @property
    def wants_legacy(self) -> bool:
        """True when the plan asks for any legacy run."""
        return bool(self.levels or self.o3_eps or self.overflow_levels or self.fused_levels
                    or self.timed_levels)

    def _check_fused(self) -> None:
        """Before apex is imported: may the legacy amp use the modern ``amp_C``? Recorded in
        ``meta["fused_check"]``; only asked when the plan has fused runs."""
        spec = importlib.util.find_spec("apex") if self.fused_levels else None
        if spec is None or not spec.submodule_search_locations:
            return
        check = fused_kernel_check(list(spec.submodule_search_locations)[0], self.device)
        self.fused_ok = bool(check["ok"])
        self.payload["meta"]["fused_check"] = check

    def import_legacy_amp(self):
        """``apex.amp`` from the legacy install, or None with the one-line reason recorded for
        every planned level. apex_C and syncbn are hidden; amp_C too unless
        :func:`fused_kernel_check` passed (then :meth:`fused_kernels` switches it per run)."""
        try:
            self._check_fused()
            hidden = COMPILED_APEX_MODULES[1:] if self.fused_ok else COMPILED_APEX_MODULES
            sys.meta_path.insert(0, _HideModules(hidden))
            import apex
            from apex import amp
            from apex.multi_tensor_apply import multi_tensor_applier

            where = str(Path(apex.__file__).resolve().parent)
            legacy_dir = os.environ.get(LEGACY_DIR_VAR)
            if legacy_dir and not where.startswith(str(Path(legacy_dir).resolve()) + os.sep):
                raise ImportError(f"apex was imported from {where}, not from the legacy "
                                  f"install {legacy_dir}; put that folder first on PYTHONPATH")
            self.payload["meta"].update(apex_path=where,
                                        fused_kernels=bool(multi_tensor_applier.available))
            self.fused_kernels(False)  # the plain runs as before: the Python fallback
            return amp
        except Exception as exc:
            self.import_error = self.payload["import_error"] = errors.one_line(exc, 300)
            return None

    def fused_kernels(self, on: bool) -> bool:
        """Let the legacy amp built next use the fused kernels (``on`` and the check passed)
        or its Python fallback: legacy amp reads ``MultiTensorApply.available`` when a run is
        built and at every step, so set it before ``amp.initialize``; returns the setting."""
        from apex.multi_tensor_apply import multi_tensor_applier

        kind = type(multi_tensor_applier)
        kind.available = bool(on and self.fused_ok)
        if not kind.available and not hasattr(kind, "import_err"):
            kind.import_err = ImportError("the fused kernels are switched off for this run")
        return kind.available

    @staticmethod
    def fused_in_use() -> bool:
        """True when the run just built scales its gradients with the fused kernels."""
        from apex.multi_tensor_apply import multi_tensor_applier

        scaler = sys.modules.get("apex.amp.scaler")
        return bool(multi_tensor_applier.available) and bool(
            getattr(getattr(scaler, "LossScaler", None), "has_fused_kernel", True))

    def legacy_runs(self) -> Iterator[tuple[str, str, float, bool]]:
        """(label, opt level, Adam eps, fused kernels) of every planned legacy run: O0-O3 as
        asked (without the fused kernels), O3 once per ``o3_eps``, then the ``fused_levels``
        with them (only when the check passed). After a failed import, each is recorded as
        failed instead."""
        plan = [(lvl, lvl, self.cfg.adam_eps, False) for lvl in self.levels]
        plan += [(o3_label(e), "O3", e, False) for e in self.o3_eps]
        if self.fused_ok or self.import_error:
            plan += [(fused_label(lvl), lvl, self.cfg.adam_eps, True)
                     for lvl in self.fused_levels]
        for label, level, eps, fused in plan:
            if self.import_error:
                self.runs_append(failed_run(f"apex.amp {label}", "apex.amp (legacy)", label,
                                            self.import_error, self.device.type))
            else:
                yield label, level, eps, fused

    def time_rounds(self, build: Callable[[str], tuple], step: Callable) -> None:
        """Section 7's step times: each of ``timed_levels`` (and, when the check passed, each
        of ``fused_levels`` with the fused kernels) built fresh with ``build(opt_level)`` once
        per round, ``step(model, optimizer, x, y)`` timed in interleaved rounds
        (:func:`rounds_of`), amp reset after each; into ``payload["rounds"]``."""
        if self.import_error:
            return
        wanted = [(lvl, False) for lvl in self.timed_levels]
        wanted += [(lvl, True) for lvl in self.fused_levels if self.fused_ok]
        batches = make_batches(self.cfg, self.device)

        def candidate(level: str, fused: bool):
            @contextlib.contextmanager
            def fresh():
                self.fused_kernels(fused)
                try:
                    model, optimizer = build(level)
                    yield stepper(lambda: (model, optimizer, None),
                                  lambda m, o, _s, x, y: step(m, o, x, y), batches)
                finally:
                    reset_amp()
            return fresh

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rounds, failed = rounds_of(
                {f"apex.amp {fused_label(lvl) if fused else lvl}": candidate(lvl, fused)
                 for lvl, fused in wanted},
                rounds=self.cfg.rounds, repeats=self.cfg.round_steps, device=self.device)
        self.payload["rounds"], self.payload["round_errors"] = rounds, failed

    def overflow_runs(self) -> Iterator[str]:
        """The opt levels to force an overflow under (none after a failed import)."""
        for level in self.overflow_levels:
            if self.import_error:
                self.payload["overflow"].append({"run": f"apex.amp {level}",
                                                 "error": self.import_error})
            else:
                yield level

    def runs_append(self, run: bench.Run) -> None:
        """Add a finished run to the JSON."""
        self.payload["runs"].append(run.to_dict())

    @contextlib.contextmanager
    def level(self, label: str, opt_level: str, eps: float, fused: bool = False
              ) -> Iterator[dict]:
        """One legacy run, with or without the fused kernels: yields a dict for what amp
        reported (put the run under ``"run"``); warnings are recorded, a failure becomes a
        one-line failed run, amp is reset after."""
        info: dict = {"opt_level": opt_level, "adam_eps": eps}
        self.fused_kernels(fused)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield info
                info["fused_kernels"] = self.fused_in_use()
            except torch.cuda.OutOfMemoryError:
                info["error"] = ("out of GPU memory at these sizes: give TrainConfig a smaller "
                                 "batch or hidden in section 3 (or free the GPU)")
            except Exception as exc:
                info["error"] = errors.one_line(exc, 300)
            finally:
                info["restored"] = reset_amp()
        run = info.pop("run", None)
        if run is None or "error" in info:
            run = failed_run(f"apex.amp {label}", "apex.amp (legacy)", label,
                             info.get("error", "the script recorded no run"), self.device.type)
        run.extra["fused_kernels"] = info.get("fused_kernels", False)
        self.runs_append(run)
        info["warnings"] = sorted({f"{w.category.__name__}: "
                                   f"{(str(w.message).strip().splitlines() or [''])[0][:500]}"
                                   for w in caught})
        self.payload["levels"][label] = info

    @contextlib.contextmanager
    def overflow(self, opt_level: str) -> Iterator[dict]:
        """One overflow probe: yields its row; a failure becomes the row's one-line error."""
        row = {"run": f"apex.amp {opt_level}", "api": "apex.amp (legacy)",
               "opt_level_or_recipe": opt_level}
        self.fused_kernels(False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                yield row
            except Exception as exc:
                row["error"] = errors.one_line(exc, 300)
            finally:
                reset_amp()
        self.payload["overflow"].append(row)

    def write(self) -> None:
        """Write the JSON result (atomically) for the notebook to read."""
        self.payload["meta"]["seconds"] = time.perf_counter() - self.start
        launcher.write_result(self.out, self.payload)


# ------------------------------------------------------------------ the notebook's side
PAST_LIMIT = ("the child process ran past {timeout:.0f} s and was stopped with every process it "
              "started (raise legacy_timeout_s in the parameters cell)")


def launch(script: Path | str, cfg: TrainConfig, out: Path | str, *,
           levels: tuple[str, ...] = (), o3_eps: tuple[float, ...] = (),
           overflow_levels: tuple[str, ...] = (), fused_levels: tuple[str, ...] = (),
           timed_levels: tuple[str, ...] = (), legacy_dir: Path | str | None = None,
           device: str | None = None, timeout: float = 600) -> dict:
    """Run ``script`` in a child process (:mod:`helpers.launch`) and return its JSON payload
    plus ``returncode``, ``seconds``, ``stdout`` and ``error``: '' or, when it failed, one
    sentence with its last error (then ``stderr_tail`` holds the last 20 lines it wrote to
    stderr). ``legacy_dir`` goes first on its PYTHONPATH (only when legacy runs are asked for),
    the checkout second."""
    want_legacy = bool(levels or o3_eps or overflow_levels or fused_levels or timed_levels) \
        and legacy_dir is not None
    changes = {LEGACY_DIR_VAR: str(legacy_dir) if want_legacy else None}
    if not torch.cuda.is_available():
        # On the CPU this process's idle OpenMP threads keep spinning on the same cores for a
        # while; a single-threaded child does not stall on them at its barriers.
        changes["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    env = launcher.child_env(*([legacy_dir] if want_legacy else []), **changes)
    plan = {"config": asdict(cfg), "levels": list(levels), "o3_eps": list(o3_eps),
            "overflow_levels": list(overflow_levels), "fused_levels": list(fused_levels),
            "timed_levels": list(timed_levels),
            "device": device or ("cuda" if torch.cuda.is_available() else "cpu")}
    child = launcher.run(launcher.python(script), plan, out, timeout=timeout, env=env,
                         past_limit=PAST_LIMIT)
    payload = dict(child.payload) if child.ok else {"runs": []}
    payload.update(returncode=child.returncode, seconds=child.seconds, error=child.error,
                   stdout=child.stdout)
    if not child.ok:
        payload["stderr_tail"] = [ln for ln in child.stderr.splitlines() if ln.strip()][-20:]
    return payload


def runs_of(payload: dict) -> list[bench.Run]:
    """The payload's runs as :class:`bench.Run` objects."""
    return [bench.Run.from_dict(r) for r in payload.get("runs", [])]
