"""The training paths of notebook 05 and the loop they share.

Every path trains the same GPT from the same initial weights on the same batches with the same
hyper-parameters; a :class:`TrainPath` names only what differs (norm class, optimizer, autocast,
TF32, torch.compile). :func:`run_path` trains one path and returns a :class:`PathRun` with its
step timings (``bench.benchmark``: CUDA events per step), losses, memory and a profiler
breakdown of where the step's time goes (:mod:`helpers.breakdown`).
"""

from __future__ import annotations

import gc
import math
import time
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from helpers import bench, breakdown, gpu, roofline
from helpers.corpus import BatchPlan, step_checksum
from helpers.fusion import sync
from helpers.gpt import GPT, GPTConfig, NormFactory


@dataclass(frozen=True)
class TrainPath:
    """One way of training the model: only these fields differ between paths."""

    key: str
    label: str
    norm: str  # "torch" (nn.LayerNorm), "apex" (FusedLayerNorm) or "apex_mixed" (MixedFused...)
    optimizer: str  # "adamw" (foreach), "adamw_fused" or "apex_fused_adam"
    amp: bool  # autocast to the device's low-precision dtype
    tf32: bool = False  # allow TF32 tensor-core matmuls for float32 tensors
    compile: bool = False  # torch.compile the model (forward, loss and backward)


PATHS: dict[str, TrainPath] = {p.key: p for p in (
    TrainPath("1", "FP32 vanilla", "torch", "adamw", amp=False),
    TrainPath("1b", "FP32 + TF32 matmuls", "torch", "adamw", amp=False, tf32=True),
    TrainPath("2", "Apex fused + torch.amp", "apex", "apex_fused_adam", amp=True),
    TrainPath("3", "Native fused + torch.amp", "torch", "adamw_fused", amp=True),
    TrainPath("4", "Native + torch.compile", "torch", "adamw_fused", amp=True, compile=True),
)}
APEX_EXTENSIONS = ("amp_C", "fused_layer_norm_cuda")


@dataclass(frozen=True)
class Hyper:
    """Hyper-parameters shared by every path (weight decay explicit: defaults differ)."""

    steps: int
    batch: int
    lr: float = 1e-3
    warmup: int = 10  # linear warm-up steps, then cosine decay to min_lr_ratio * lr
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1  # on matrices; biases, norms get 0.0 in every optimizer
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    clip: float = 1.0
    timing_warmup: int = 5  # first steps left out of the median step time
    profile_steps: int = 3  # extra steps traced by the profiler after training
    seed: int = 0

    @property
    def plan_steps(self) -> int:
        """Batches a plan needs: training, one untraced profiler warm-up, the traced steps."""
        return self.steps + (self.profile_steps + 1 if self.profile_steps else 0)


def lr_at(step: int, hp: Hyper) -> float:
    """Learning rate of ``step``: linear warm-up, cosine decay, then flat at the minimum."""
    if step < hp.warmup:
        return hp.lr * (step + 1) / hp.warmup
    progress = min(1.0, (step - hp.warmup) / max(1, hp.steps - hp.warmup))
    floor = hp.lr * hp.min_lr_ratio
    return floor + 0.5 * (hp.lr - floor) * (1.0 + math.cos(math.pi * progress))


def amp_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CPUs and bf16 GPUs, fp16 (with GradScaler) on older GPUs."""
    if device.type == "cuda" and not gpu.bf16_supported():
        return torch.float16
    return torch.bfloat16


def skip_reason(path: TrainPath, device: torch.device) -> str | None:
    """Why ``path`` cannot (or should not) run here, as one sentence; None when it runs."""
    name = f"Path {path.key} ({path.label}) skipped:"
    if device.type != "cuda":
        if path.norm.startswith("apex") or path.optimizer == "apex_fused_adam":
            return f"{name} Apex's fused kernels need a CUDA GPU."
        if path.tf32:
            return f"{name} TF32 is a CUDA tensor-core mode; on the CPU it would repeat path 1."
        if path.compile:
            return (f"{name} compiling even the tiny model takes tens of seconds on a small CPU "
                    "(Inductor builds C++ kernels), beyond the smoke budget.")
    if path.norm.startswith("apex") or path.optimizer == "apex_fused_adam":
        status = gpu.apex_extension_status()
        absent = [ext for ext in APEX_EXTENSIONS if not status.get(ext)]
        if absent:
            return f"{name} needs Apex's extension(s) {', '.join(absent)} - {gpu.BUILD_HINT}."
    return None


def norm_factory(kind: str) -> NormFactory:
    """The norm class of a path."""
    if kind.startswith("apex"):
        # Apex's autocast helper still calls torch.cuda.amp's deprecated _cast; the FutureWarning
        # it prints on every run is about Apex's source, not about this course's code.
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"apex\._autocast_utils")
    if kind == "apex":
        from apex.normalization import FusedLayerNorm

        return FusedLayerNorm
    if kind == "apex_mixed":
        from apex.normalization import MixedFusedLayerNorm

        return MixedFusedLayerNorm
    if kind == "torch":
        return nn.LayerNorm
    raise ValueError(f"unknown norm '{kind}'")


def time_norms(kinds: tuple[str, ...], shape: tuple[int, int], device: torch.device,
               dtype: torch.dtype) -> list[bench.Timing]:
    """Forward + backward of each norm on a float32 input (the residual stream) under autocast,
    after checking each against ``nn.LayerNorm`` in float32."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape, device=device, generator=gen, requires_grad=True)
    grad = torch.randn(shape, device=device, generator=gen)
    grads = {torch.float32: grad, dtype: grad.to(dtype)}  # cast up front, outside the timing
    reference = nn.LayerNorm(shape[-1], device=device)(x.detach())
    timings = []
    for kind in kinds:
        norm = norm_factory(kind)(shape[-1]).to(device)
        with torch.autocast(device.type, dtype=dtype):
            torch.testing.assert_close(norm(x).float(), reference, rtol=0.02, atol=0.05)

        def fwd_bwd(norm=norm):
            with torch.autocast(device.type, dtype=dtype):
                out = norm(x)
            out.backward(grads[out.dtype])

        timing = bench.benchmark(fwd_bwd, label=kind, warmup=5, repeats=30, device=device)
        with torch.autocast(device.type, dtype=dtype):
            timing.meta["out_dtype"] = str(norm(x).dtype).replace("torch.", "")
        timings.append(timing)
    return timings


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay on matrices (dim >= 2, the tied embedding included), none on biases and norms."""
    params = list({id(p): p for p in model.parameters()}.values())
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def make_optimizer(kind: str, model: nn.Module, hp: Hyper) -> torch.optim.Optimizer:
    """AdamW three ways, with identical hyper-parameters."""
    groups = param_groups(model, hp.weight_decay)
    common = {"lr": hp.lr, "betas": hp.betas, "eps": hp.eps, "weight_decay": hp.weight_decay}
    if kind == "adamw":
        return torch.optim.AdamW(groups, **common)  # default: foreach on CUDA
    if kind == "adamw_fused":
        return torch.optim.AdamW(groups, fused=True, **common)
    if kind == "apex_fused_adam":
        from apex.optimizers import FusedAdam

        return FusedAdam(groups, adam_w_mode=True, **common)
    raise ValueError(f"unknown optimizer '{kind}'")


@dataclass
class Experiment:
    """What every path shares: model shape, hyper-parameters, initial weights and batches."""

    cfg: GPTConfig
    hp: Hyper
    init_state: dict[str, torch.Tensor]
    plan: BatchPlan  # hp.plan_steps training batches, on the device
    val_plan: BatchPlan  # fixed validation batches
    device: torch.device

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one optimizer step."""
        return self.hp.batch * self.cfg.seq_len


@dataclass
class PathRun:
    """The outcome of one path."""

    path: TrainPath
    skipped: str | None = None
    timing: bench.Timing | None = None
    losses: list[float] = field(default_factory=list)
    val_loss: float = math.nan
    peak_mem_gib: float = math.nan
    first_step_s: float = math.nan
    compile_s: float = math.nan
    wall_s: float = math.nan
    checksum: int = 0
    breakdown: dict = field(default_factory=dict)

    @property
    def final_train_loss(self) -> float:
        """Mean training loss of the last 10 steps (one step's loss is noisy)."""
        tail = self.losses[-10:]
        return sum(tail) / len(tail) if tail else math.nan

    def __str__(self) -> str:
        if self.skipped:
            return self.skipped
        memory = "" if math.isnan(self.peak_mem_gib) else f", peak {self.peak_mem_gib:.1f} GiB"
        extra = f", compile {self.compile_s:.1f} s" if self.path.compile else ""
        return (f"path {self.path.key} ({self.path.label}): {self.timing.median_ms:.1f} ms/step "
                f"(IQR {self.timing.iqr_ms:.2f}), train loss {self.final_train_loss:.3f}, "
                f"val loss {self.val_loss:.3f}{memory}, wall {self.wall_s:.1f} s{extra}")


def _build(path: TrainPath, exp: Experiment) -> nn.Module:
    with exp.device:
        model = GPT(exp.cfg, norm=norm_factory(path.norm), attention="sdpa")
    model.load_state_dict(exp.init_state)
    return model


def _train(path: TrainPath, exp: Experiment) -> PathRun:
    dev, hp = exp.device, exp.hp
    dtype = amp_dtype(dev)
    model = _build(path, exp)
    optimizer = make_optimizer(path.optimizer, model, hp)
    scaler = torch.amp.GradScaler(dev.type, enabled=path.amp and dtype == torch.float16)
    runner = torch.compile(model) if path.compile else model
    losses = torch.zeros(exp.plan.steps, device=dev)
    checksum = torch.zeros((), dtype=torch.int64, device=dev)
    counter = [0]

    def autocast():
        return torch.autocast(dev.type, dtype=dtype, enabled=path.amp)

    def step() -> None:
        i = counter[0]
        x, y = exp.plan.batch(i)
        checksum.add_(step_checksum(x, i))  # weighted by step: the order of batches counts
        for group in optimizer.param_groups:
            group["lr"] = lr_at(i, hp)
        with autocast():
            loss = runner(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), hp.clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()  # None-ing grads: torch's default, Apex's set_grad_none=True
        losses[i] = loss.detach()
        counter[0] = i + 1

    sync(dev)
    start = time.perf_counter()
    step()  # the first step carries one-off costs: compilation, cuBLAS set-up, allocations
    sync(dev)
    first = time.perf_counter() - start
    timing = bench.benchmark(step, label=path.key, warmup=max(0, hp.timing_warmup - 1),
                             repeats=hp.steps - hp.timing_warmup, flush=False, device=dev)
    sync(dev)
    run = PathRun(path, timing=timing, wall_s=time.perf_counter() - start, first_step_s=first)
    if path.compile:
        run.compile_s = max(0.0, first - timing.median_ms / 1e3)
    if dev.type == "cuda":
        run.peak_mem_gib = torch.cuda.max_memory_allocated(dev) / 2**30
    run.losses = losses[:hp.steps].tolist()
    run.checksum = int(checksum.item())
    with torch.no_grad(), autocast():  # the eager module: no recompilation for inference
        vals = [model(*exp.val_plan.batch(i)) for i in range(exp.val_plan.steps)]
    run.val_loss = float(torch.stack(vals).float().mean())
    if hp.profile_steps:
        run.breakdown = breakdown.profile_steps(step, hp.profile_steps, dev)
    return run


def _first_line(exc: BaseException) -> str:
    """The first line of an error message (joined with the next when it only introduces it, as
    in Dynamo's "backend='inductor' raised:"), cut to 200 characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    first = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return first if len(first) <= 200 else first[:197] + "..."


def run_path(path: TrainPath, exp: Experiment) -> PathRun:
    """Train ``path`` (TF32 set as the path says). Out of memory, or a failing torch.compile on
    a compiled path, marks it skipped in one sentence instead of stopping the notebook."""
    reason = skip_reason(path, exp.device)
    if reason:
        return PathRun(path, skipped=reason)
    if exp.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(exp.device)
    run = None
    try:
        with roofline.tf32(path.tf32):
            run = _train(path, exp)
    except torch.OutOfMemoryError:
        run = PathRun(path, skipped=(
            f"Path {path.key} ({path.label}) skipped: out of GPU memory at batch {exp.hp.batch} x "
            f"{exp.cfg.seq_len} tokens - set a smaller batch_size in the parameters cell."))
    except Exception as exc:  # only a compiled path turns any other error into a skip
        if not path.compile:
            raise
        run = PathRun(path, skipped=(
            f"Path {path.key} ({path.label}) skipped: torch.compile failed: {_first_line(exc)}; "
            f"it needs a C compiler and Triton (or skip path {path.key})."))
    finally:
        if path.compile:
            torch._dynamo.reset()
        gc.collect()
        if exp.device.type == "cuda":
            torch.cuda.empty_cache()
    return run


def initial_state(cfg: GPTConfig, seed: int) -> dict[str, torch.Tensor]:
    """Build the model once on the CPU (seeded) and keep a copy of its weights for every path."""
    torch.manual_seed(seed)
    return {k: v.clone() for k, v in GPT(cfg).state_dict().items()}


def check_hyper(hp: Hyper) -> None:
    """Raise a one-sentence ValueError when the step counts leave no step to time."""
    if hp.timing_warmup < 1:
        raise ValueError(
            f"timing_warmup ({hp.timing_warmup}) must be at least 1: the first step, which carries "
            "one-off costs, always runs apart from the timing - set timing_warmup to 1 or more.")
    if hp.steps <= hp.timing_warmup:
        raise ValueError(
            f"steps ({hp.steps}) must be larger than timing_warmup ({hp.timing_warmup}): the first "
            f"timing_warmup steps are left out of the step time, so set steps to "
            f"{hp.timing_warmup + 1} or more in the parameters cell (or lower timing_warmup).")


def make_experiment(cfg: GPTConfig, hp: Hyper, train_data: torch.Tensor, val_data: torch.Tensor,
                    device: torch.device, eval_batches: int,
                    init_state: dict[str, torch.Tensor] | None = None) -> Experiment:
    """Initial weights (given, or built here), the training batch plan, fixed validation batches.

    Checks the hyper-parameters first (:func:`check_hyper`), before anything is trained."""
    check_hyper(hp)
    plan = BatchPlan.draw(train_data, steps=hp.plan_steps, batch=hp.batch, seq_len=cfg.seq_len,
                          seed=hp.seed)
    val = BatchPlan.draw(val_data, steps=eval_batches, batch=hp.batch, seq_len=cfg.seq_len,
                         seed=hp.seed + 1)
    state = init_state if init_state is not None else initial_state(cfg, hp.seed)
    return Experiment(cfg, hp, state, plan.to(device), val.to(device), device)
