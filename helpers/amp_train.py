"""Training loops for notebook 04: one small model, one data set, one loop, and the torch.amp
recipes that replace apex.amp's opt levels. The legacy child process (``legacy_amp_run``) builds
its model, data and loop from the same functions, so every run sees identical data and seeds."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from helpers import bench


@dataclass(frozen=True)
class TrainConfig:
    """Sizes and seeds of the notebook's training problem (an MLP classifier)."""

    steps: int = 100
    batch: int = 2048
    d_in: int = 1024
    hidden: int = 4096
    depth: int = 3          # hidden Linear layers (each followed by GELU)
    classes: int = 64
    pool: int = 16          # distinct batches, cycled through
    lr: float = 1e-4        # Adam; 1e-3 makes this 4096-wide MLP jump on its first steps
    adam_eps: float = 1e-8  # Adam's eps (torch's default); pure fp16 (O3) needs a larger one
    seed: int = 0
    warmup_steps: int = 5   # first steps left out of the step-time median

    @classmethod
    def smoke(cls) -> TrainConfig:
        """Tiny sizes for the CPU smoke run."""
        return cls(steps=30, batch=64, d_in=32, hidden=64, depth=2, classes=8, pool=4, lr=3e-3)

    def to_json(self) -> str:
        """The config as a JSON string (how the child process receives it)."""
        return json.dumps(dataclasses.asdict(self))

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


def make_optimizer(params, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Plain ``torch.optim.Adam`` (the legacy Python-only Apex cannot use FusedAdam)."""
    return torch.optim.Adam(params, lr=cfg.lr, eps=cfg.adam_eps)


def first_linear(model: nn.Module) -> nn.Linear:
    """The model's first Linear layer, whose output dtype the runs report."""
    return next(m for m in model.modules() if isinstance(m, nn.Linear))


# ------------------------------------------------------------------ the torch.amp recipes
def step_fp32(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def step_autocast_fp16(model, optimizer, scaler, x, y):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()   # backward of loss * scale
    scaler.step(optimizer)          # unscale grads; skip the step if any is inf/NaN
    scaler.update()                 # halve the scale after an overflow, grow it slowly
    return loss


def step_autocast_bf16(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()                 # bf16 has fp32's exponent range: no loss scaling
    optimizer.step()
    return loss


def step_master_weights(model, masters, optimizer, scaler, x, y):
    # O2's recipe by hand: fp16 model weights, fp32 master copies owned by the optimizer.
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x.half()).float(), y)
    scaler.scale(loss).backward()   # fp16 grads on the fp16 model
    for p, m in zip(model.parameters(), masters, strict=True):
        m.grad = p.grad.float()     # fp32 master grads (still scaled)
    scaler.step(optimizer)          # unscale, check for inf/NaN, update the fp32 masters
    scaler.update()
    with torch.no_grad():
        for p, m in zip(model.parameters(), masters, strict=True):
            p.copy_(m)              # masters -> fp16 model weights
    return loss


@dataclass(frozen=True)
class Recipe:
    """One torch.amp training recipe and the legacy opt level it replaces."""

    name: str
    replaces: str
    summary: str
    needs_bf16: bool = False


RECIPES: dict[str, Recipe] = {r.name: r for r in [
    Recipe("fp32", "O0", "fp32 weights and math, no scaler"),
    Recipe("autocast_fp16", "O1 (and O2)", "fp32 weights, autocast(float16), GradScaler"),
    Recipe("autocast_bf16", "O1 (and O2), bf16", "fp32 weights, autocast(bfloat16), no scaler",
           needs_bf16=True),
    Recipe("fp16_master_weights", "O2", "fp16 weights, fp32 master copies, GradScaler"),
]}


@dataclass
class Built:
    """A model ready to train: its step function, loss-scale reader and master weights."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    scale: Callable[[], float] | None = None
    masters: Callable[[], list[torch.Tensor]] = list  # separate fp32 master copies, if any

    def params(self) -> list[torch.Tensor]:
        """Model parameters plus any master copies: what a skipped step must leave unchanged."""
        return list(self.model.parameters()) + list(self.masters())


def build_recipe(name: str, cfg: TrainConfig, device: torch.device | str) -> Built:
    """Model, optimizer and step function of one torch.amp recipe, on ``device``."""
    device = torch.device(device)
    model = make_model(cfg).to(device)
    if name == "fp16_master_weights":
        masters = [p.detach().clone().float().requires_grad_() for p in model.parameters()]
        model.half()
        optimizer = make_optimizer(masters, cfg)
        scaler = torch.amp.GradScaler(device.type)
        return Built(model, optimizer,
                     lambda x, y: step_master_weights(model, masters, optimizer, scaler, x, y),
                     scaler.get_scale, lambda: masters)
    optimizer = make_optimizer(model.parameters(), cfg)
    if name == "fp32":
        return Built(model, optimizer, lambda x, y: step_fp32(model, optimizer, x, y))
    if name == "autocast_fp16":
        scaler = torch.amp.GradScaler(device.type)
        return Built(model, optimizer,
                     lambda x, y: step_autocast_fp16(model, optimizer, scaler, x, y),
                     scaler.get_scale)
    if name == "autocast_bf16":
        return Built(model, optimizer, lambda x, y: step_autocast_bf16(model, optimizer, x, y))
    raise KeyError(f"unknown recipe '{name}': use one of {', '.join(RECIPES)}")


# ------------------------------------------------------------------ measuring a run
LEARNED_DROP = 0.10  # a run has learned when its final loss is 10% or more below its first


@dataclass
class RunResult:
    """Everything one training run reports; JSON-friendly so the child process can send it."""

    run: str
    api: str
    opt_level_or_recipe: str
    device: str
    losses: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    loss_scales: list[float] = field(default_factory=list)
    param_dtype: str = ""
    master_dtype: str = ""
    activation_dtype: str = ""
    peak_mem_mib: float | None = None
    warmup_steps: int = 5
    error: str = ""

    @property
    def ok(self) -> bool:
        """True when the run completed (its numbers may still be non-finite)."""
        return not self.error and bool(self.losses)

    def status(self) -> str:
        """'ran N steps' or 'FAILED: <one-line error>'."""
        return f"ran {len(self.losses)} steps" if self.ok else f"FAILED: {self.error}"

    @property
    def finite(self) -> bool:
        """True when every recorded loss is finite."""
        return self.ok and all(math.isfinite(v) for v in self.losses)

    @property
    def first_nonfinite_step(self) -> int | None:
        """Index of the first inf/NaN loss, or None."""
        return next((i for i, v in enumerate(self.losses) if not math.isfinite(v)), None)

    def _tail(self, head: bool) -> float:
        k = max(1, len(self.losses) // 10)
        part = self.losses[:k] if head else self.losses[-k:]
        return sum(part) / len(part) if part else float("nan")

    @property
    def initial_loss(self) -> float:
        """Mean loss over the first tenth of the steps."""
        return self._tail(head=True)

    @property
    def final_loss(self) -> float:
        """Mean loss over the last tenth of the steps (NaN if any of them is not finite)."""
        return self._tail(head=False)

    @property
    def decreasing(self) -> bool:
        """True when the last tenth's mean loss is below the first tenth's and at least
        ``LEARNED_DROP`` below the loss of the first step (taken before any update): a run that
        jumps up on its first updates and falls back to about where it started has not
        learned."""
        return (self.finite and self.final_loss < self.initial_loss
                and self.final_loss <= (1 - LEARNED_DROP) * self.losses[0])

    @property
    def timing(self) -> bench.Timing | None:
        """Per-step times after the warm-up steps, as a :class:`bench.Timing`."""
        samples = self.step_ms[self.warmup_steps:] or self.step_ms
        return bench.Timing(self.run, samples, self.device) if samples else None

    def row(self) -> dict:
        """One row of the notebook's ``04_runs`` table."""
        t = self.timing
        return {
            "run": self.run, "api": self.api, "opt_level_or_recipe": self.opt_level_or_recipe,
            "step_ms": t.median_ms if t else float("nan"),
            "step_iqr_ms": t.iqr_ms if t else float("nan"),
            "step_q1_ms": t.q1_ms if t else float("nan"),
            "step_q3_ms": t.q3_ms if t else float("nan"),
            "final_loss": self.final_loss if self.ok else float("nan"),
            "param_dtype": self.param_dtype, "master_dtype": self.master_dtype,
            "activation_dtype": self.activation_dtype,
            "peak_mem_mib": self.peak_mem_mib if self.peak_mem_mib is not None else float("nan"),
            "loss_scale_final": self.loss_scales[-1] if self.loss_scales else float("nan"),
            "finite": self.finite, "decreasing": self.decreasing,
            "first_nonfinite_step": self.first_nonfinite_step,
            "steps": len(self.losses), "device": self.device, "error": self.error,
        }

    def to_dict(self) -> dict:
        """Plain dict for JSON."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunResult:
        """Inverse of :meth:`to_dict` (unknown keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def dtype_name(dtype: torch.dtype | None) -> str:
    """'float16' for torch.float16; '' for None."""
    return str(dtype).replace("torch.", "") if dtype is not None else ""


def _warm_blas(device: torch.device) -> None:
    """One small Linear forward and backward in fp32 and fp16: cuBLAS and cuBLASLt allocate
    their workspaces (32 MiB each on Hopper) through PyTorch's allocator on first use and keep
    them, so without this the first measured run would count them as its own memory."""
    for dtype in (torch.float32, torch.float16):
        w = torch.ones(16, 16, device=device, dtype=dtype, requires_grad=True)
        x = torch.ones(16, 16, device=device, dtype=dtype)
        F.linear(x, w, w[0].detach()).sum().backward()


@contextlib.contextmanager
def peak_memory(device: torch.device) -> Iterator[dict]:
    """Yields a dict whose ``mib`` is set on exit to the peak GPU memory the body allocated
    above what was allocated when it began (None on the CPU)."""
    out: dict = {"mib": None}
    if device.type != "cuda":
        yield out
        return
    # A previous run may still hold memory in reference cycles (legacy amp binds methods to its
    # optimizer): freed only when the cyclic collector runs, possibly in the middle of this run.
    gc.collect()
    _warm_blas(device)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    yield out
    torch.cuda.synchronize(device)
    out["mib"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20


def train(built: Built, batches, result: RunResult, *, steps: int) -> RunResult:
    """Run ``steps`` steps of ``built.step`` over ``batches`` and fill ``result``: losses, step
    times, loss scales and dtypes. The loss is read after each step, outside the timed window,
    so every step starts on an idle GPU and its time includes launching its kernels."""
    device = batches[0][0].device
    seen: dict[str, torch.dtype] = {}

    def record_dtype(_module, _inputs, out) -> None:  # a forward hook must return None
        seen.setdefault("act", out.dtype)

    hook = first_linear(built.model).register_forward_hook(record_dtype)
    timer = bench.StepTimer(device)
    try:
        for i in range(steps):
            x, y = batches[i % len(batches)]
            with timer.step():
                loss = built.step(x, y)
            result.losses.append(float(loss.detach().float().item()))
            if built.scale is not None:
                result.loss_scales.append(float(built.scale()))
    finally:
        hook.remove()
    result.step_ms = timer.samples_ms()
    result.param_dtype = dtype_name(next(built.model.parameters()).dtype)
    result.master_dtype = dtype_name(built.optimizer.param_groups[0]["params"][0].dtype)
    result.activation_dtype = dtype_name(seen.get("act"))
    return result


def run_recipe(name: str, cfg: TrainConfig, batches, *, run: str | None = None) -> RunResult:
    """Build and train one torch.amp recipe; the peak memory covers model, optimizer and steps."""
    device = batches[0][0].device
    result = RunResult(run or f"torch.amp {name}", "torch.amp", name, device.type,
                       warmup_steps=cfg.warmup_steps)
    try:
        with peak_memory(device) as mem:
            train(build_recipe(name, cfg, device), batches, result, steps=cfg.steps)
        result.peak_mem_mib = mem["mib"]
    except torch.cuda.OutOfMemoryError:
        result.error = OOM_MESSAGE
    return result


OOM_MESSAGE = ("out of GPU memory at these sizes: give TrainConfig a smaller batch or hidden "
               "in section 3 (or free the GPU) and run again")


def runs_table(results: list[RunResult]):
    """The ``04_runs`` table: one row per run."""
    import pandas as pd

    return pd.DataFrame([r.row() for r in results])


def step_times(results: list[RunResult]):
    """Median and quartiles of the step time per run (warm-up steps left out), in the columns
    :func:`helpers.fusion.compare_rows` and :func:`helpers.fusion.fastest_text` read: run,
    median_ms, q1_ms, q3_ms. Runs without step times are left out."""
    import pandas as pd

    rows = [{"run": r.run, "median_ms": t.median_ms, "q1_ms": t.q1_ms, "q3_ms": t.q3_ms}
            for r in results if (t := r.timing) is not None]
    return pd.DataFrame(rows, columns=["run", "median_ms", "q1_ms", "q3_ms"])


def loss_curves(results: list[RunResult]):
    """Long-form losses (run, step, loss) of the runs that produced any, for plotting."""
    import pandas as pd

    rows = [{"run": r.run, "step": i, "loss": v}
            for r in results if r.losses for i, v in enumerate(r.losses)]
    return pd.DataFrame(rows, columns=["run", "step", "loss"])


def scale_traces(results: list[RunResult]):
    """One row per run with a loss scale: where it started and ended, and at which steps it
    was halved (an overflow: the step was skipped) or grown."""
    import pandas as pd

    rows = []
    for r in results:
        s = r.loss_scales
        if not s:
            continue
        rows.append({
            "run": r.run, "scale_first_step": s[0], "scale_final": s[-1], "scale_min": min(s),
            "halved_at_steps": [i for i in range(1, len(s)) if s[i] < s[i - 1]],
            "grown_at_steps": [i for i in range(1, len(s)) if s[i] > s[i - 1]],
        })
    return pd.DataFrame(rows, columns=["run", "scale_first_step", "scale_final", "scale_min",
                                       "halved_at_steps", "grown_at_steps"])
