"""The GPT notebooks 05, 06 and 07 train, its data and its recipe: what they share and do not
teach (notebook 05's own readings are ``helpers.chapters.end_to_end``'s).

- the model: a small GPT-style decoder whose norm and attention are injected (token + position
  embeddings, pre-norm blocks of causal self-attention and a 4x GELU MLP, a final norm, an
  output head tied to the token embedding), GPT-2's initialisation, and its size arithmetic
  (parameter count, FLOPs per token for MFU). Notebook 05 shows the source before using it.
- the training recipe (:class:`Recipe`, chosen by ``coursetools/recipe_sweep.py``) and the full
  profile's batch for a GPU's memory (:func:`full_batch`).
- the data: a byte-level corpus that needs no download - the Python standard library's own
  ``.py`` sources, split by file (every 20th to validation) - and a :class:`BatchPlan` that
  draws every batch's offsets up front from one seeded generator, so every path sees the same
  batches in the same order, with a step-weighted checksum that proves it.
- running a path: :func:`train_path` (build, train, peak memory: the run record of 05 and 06),
  :func:`attempt` (one path run with its failures as one line), and the tables
  of runs the notebooks share: :func:`paths_table` (05, and 06 through its chapter),
  :func:`start_table` and :func:`unhealthy_start` (05 and 06).

Why this is over 500 lines, not the ~400 of a core module: everything left is used by at least
two of notebooks 05-07 (directly or through their chapter modules and
``coursetools/recipe_sweep.py``) or is a part of what is, and the model with its size
arithmetic (about 170 lines), the corpus with its batch plan and checksums (125) and the recipe
with the full batch (90) alone come to about 385; splitting them into modules of their own
would add to the core rather than take anything out of it.
"""

from __future__ import annotations

import gc
import hashlib
import math
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from helpers import bench, ceilings, errors

if TYPE_CHECKING:  # pandas is imported by the functions that make tables: a process that
    import pandas as pd  # only trains (a torchrun rank) does not pay for its import

# ------------------------------------------------------------------ the model
Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
NormFactory = Callable[[int], nn.Module]


def pad_vocab(vocab: int, multiple: int = 64) -> int:
    """Round the vocabulary up to a multiple (tensor-core friendly head shape)."""
    return multiple * math.ceil(vocab / multiple)


@dataclass(frozen=True)
class GPTConfig:
    """Model shape. ``vocab`` is the real vocabulary; the embedding uses ``padded_vocab`` rows."""

    n_layer: int = 12
    d_model: int = 768
    n_head: int = 12
    seq_len: int = 1024
    vocab: int = 256

    @property
    def padded_vocab(self) -> int:
        """The vocabulary padded to a multiple of 64."""
        return pad_vocab(self.vocab)

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_head


GPT2_SMALL = GPTConfig()
TINY = GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=64)


def manual_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention written out: scores, a -inf mask above the diagonal, softmax, weights."""
    seq = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return weights.to(v.dtype) @ v


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention through PyTorch's fused kernels (flash / memory-efficient / math)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


ATTENTION: dict[str, Attention] = {"manual": manual_attention, "sdpa": sdpa_attention}


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused QKV projection."""

    def __init__(self, cfg: GPTConfig, attention: Attention):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.attention = attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4)
        y = self.attention(q, k, v)  # (b, heads, t, head_dim)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    """Linear 4x up, GELU (tanh approximation, as GPT-2), linear down."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: GPTConfig, norm: NormFactory, attention: Attention):
        super().__init__()
        self.ln1 = norm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg, attention)
        self.ln2 = norm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The decoder. ``forward(idx)`` gives logits; ``forward(idx, targets)`` gives the mean loss."""

    def __init__(self, cfg: GPTConfig, norm: NormFactory = nn.LayerNorm,
                 attention: Attention | str = "sdpa"):
        super().__init__()
        self.cfg = cfg
        attn = ATTENTION[attention] if isinstance(attention, str) else attention
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, norm, attn) for _ in range(cfg.n_layer))
        self.ln_f = norm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.padded_vocab, bias=False)
        self.head.weight = self.wte.weight  # tied: the head reuses the token embedding matrix
        self.reset_parameters()

    def tie_weights(self) -> None:
        """Make the head share the token embedding's matrix again: ``to_empty`` (after building
        on the meta device) gives every module its own new tensor, which unties them."""
        self.head.weight = self.wte.weight

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 initialisation (std 0.02; residual projections std 0.02 / sqrt(2 * n_layer))."""
        resid_std = 0.02 / math.sqrt(2 * self.cfg.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = resid_std if name.endswith(("attn.proj", "mlp.proj")) else 0.02
                nn.init.normal_(module.weight, 0.0, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, 0.02)
            elif getattr(module, "weight", None) is not None and module.weight.dim() == 1:
                nn.init.ones_(module.weight)  # norms, whatever their class
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """The final norm's output, (batch, seq_len, d_model): what the head turns into logits
        (a loss that fuses the head with the cross-entropy starts here: notebook 08)."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.head(self.hidden(idx))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def non_embedding_params(cfg: GPTConfig) -> int:
    """Parameters outside the embeddings: L * (12 d^2 + 13 d) + 2 d (the final norm)."""
    d = cfg.d_model
    return cfg.n_layer * (12 * d * d + 13 * d) + 2 * d


def embedding_params(cfg: GPTConfig) -> int:
    """Token table (shared with the head) plus position table."""
    return cfg.padded_vocab * cfg.d_model + cfg.seq_len * cfg.d_model


def count_params(model: nn.Module) -> int:
    """Distinct parameters of a module (a tied matrix counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def flops_per_token(cfg: GPTConfig, *, include_head: bool = True) -> int:
    """Training FLOPs per token: 6 N + 6 L d T.

    6 N: forward (2 N) plus backward (4 N) of every parameter matmul, N = non-embedding
    parameters plus, with ``include_head``, the tied head's d x V matmul (it runs even though its
    matrix is the embedding). 6 L d T: the attention scores (QK^T) and weighted sum (AV), 12 L d T
    for full attention, of which the causal mask leaves half - the half flash attention computes.
    """
    n = non_embedding_params(cfg) + (cfg.d_model * cfg.padded_vocab if include_head else 0)
    return 6 * n + 6 * cfg.n_layer * cfg.d_model * cfg.seq_len


# ------------------------------------------------ the training recipe and the full batch
# Notebook 05 writes this recipe out in its cells (its schedule and parameter groups are the
# lesson there); notebooks 06 and 07 use this copy, and tests/test_gpt.py checks that the two
# compute the same thing. The peak rate and the warm-up were chosen by measurement:
# coursetools/recipe_sweep.py trained the full profile's GPT (80 steps of 32 x 1024 bytes) with
# 16 pairs on an H200, each twice with the same seed; the README's "Choosing the training
# recipe" holds its table (reports/recipe/recipe_sweep.csv). A warm-up of 60 of the 80
# steps to 3e-4 had the lowest validation loss of the pairs whose loss never climbed back above
# step 0's; the steps warm up over the same share of a shorter run.
PEAK_LR = 3e-4
WARMUP_FRACTION = 0.75
# The smoke profile's tiny model (2 layers, width 64) learns too little in 24 steps at 3e-4 to
# pass the "learned" check (8.7% below step 0; 3e-3 gives 39%): its own rate, not a finding.
SMOKE_PEAK_LR = 3e-3


@dataclass(frozen=True)
class Recipe:
    """The course's optimizer settings and schedule: AdamW (betas 0.9/0.95, weight decay 0.1 on
    matrices only), clipping at 1.0, a linear warm-up to ``lr`` over ``warmup`` steps, then a
    cosine decay to ``final_fraction`` of it at step ``steps``."""

    steps: int
    lr: float = PEAK_LR
    warmup: int = 1
    final_fraction: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.warmup < self.steps:
            raise ValueError(f"the warm-up ({self.warmup} steps) must be at least 1 and shorter "
                             f"than the run ({self.steps} steps): lower it or train longer")

    @classmethod
    def scaled(cls, steps: int, lr: float = PEAK_LR, **changes) -> Recipe:
        """The recipe for a run of ``steps`` steps: warm-up over ``WARMUP_FRACTION`` of them."""
        return cls(steps=steps, lr=lr, warmup=max(1, round(WARMUP_FRACTION * steps)), **changes)

    @property
    def hp(self) -> dict:
        """The optimizer's keyword arguments (every optimizer of a comparison gets these)."""
        return dict(lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)

    def lr_at(self, i: int) -> float:
        """Linear warm-up over ``warmup`` steps, cosine decay to the final rate at ``steps``."""
        if i < self.warmup:
            return self.lr * (i + 1) / self.warmup
        progress = min(1.0, (i - self.warmup) / max(1, self.steps - self.warmup))
        low = self.final_fraction
        return self.lr * (low + (1 - low) / 2 * (1.0 + math.cos(math.pi * progress)))

    def param_groups(self, model: nn.Module) -> list[dict]:
        """Decay on matrices (dim >= 2, the tied embedding once), none on biases and norms."""
        params = list({id(p): p for p in model.parameters()}.values())
        return [{"params": [p for p in params if p.dim() >= 2],
                 "weight_decay": self.weight_decay},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


# The full profile's batch and the peak memory it was measured with: notebook 05's FP32 path
# (its largest) peaked at 19.6 GiB with 32 sequences of 1024 bytes on the H200 reference run
# (reports/h200/), of which about 1.4 GiB are weights, gradients and Adam state; the rest grows
# with the batch.
FULL_BATCH = 32
PEAK_FIXED_GIB, PEAK_PER_SEQUENCE_GIB = 1.4, (19.6 - 1.4) / 32


def full_batch(usable_gib: float | None, headroom: float = 0.85) -> tuple[int, str]:
    """The full profile's sequences per step for a GPU with ``usable_gib`` of memory, and one
    line saying why: 32, halved until the FP32 path's predicted peak fits in ``headroom`` of
    the memory (16 on a 16 GB card)."""
    batch = FULL_BATCH
    if usable_gib is None:
        return batch, f"batch {batch} sequences (the full profile's)"
    predicted = PEAK_FIXED_GIB + PEAK_PER_SEQUENCE_GIB * batch
    while batch > 1 and predicted > headroom * usable_gib:
        batch //= 2
        predicted = PEAK_FIXED_GIB + PEAK_PER_SEQUENCE_GIB * batch
    why = ("the full profile's" if batch == FULL_BATCH else
           f"halved from {FULL_BATCH} to fit this GPU")
    return batch, (f"batch {batch} sequences ({why}: notebook 05's FP32 path, its largest run, "
                   f"is predicted to peak at {predicted:.1f} GiB of the {usable_gib:.1f} GiB "
                   "this process may use)")


# ------------------------------------------------------------------ the data
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests",
                           "idle_test"})
VAL_STRIDE = 20  # file i goes to validation when i % VAL_STRIDE == VAL_STRIDE - 1


def stdlib_root() -> Path:
    """The standard library folder of the running Python."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path | None = None, cap_bytes: int | None = None) -> list[Path]:
    """Sorted ``.py`` files under ``root``, skipping excluded folders, up to ``cap_bytes`` total."""
    root = root or stdlib_root()
    files = sorted(p for p in root.rglob("*.py")
                   if p.is_file() and not EXCLUDED_DIRS.intersection(p.relative_to(root).parts))
    if cap_bytes is None:
        return files
    kept, total = [], 0
    for path in files:
        size = path.stat().st_size
        if total + size > cap_bytes and kept:
            break
        kept.append(path)
        total += size
    return kept


@dataclass
class Corpus:
    """Train and validation token streams (uint8 bytes) and where they came from."""

    train: torch.Tensor
    val: torch.Tensor
    train_files: list[str]
    val_files: list[str]
    root: str

    def describe(self) -> str:
        """One line: sizes and source."""
        return (f"{len(self.train_files)} train files ({self.train.numel() / 1e6:.2f} MB), "
                f"{len(self.val_files)} validation files ({self.val.numel() / 1e6:.2f} MB) "
                f"from {self.root}")


def _concat(paths: list[Path]) -> torch.Tensor:
    data = b"\n".join(p.read_bytes() for p in paths)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def load_corpus(cap_mb: float = 16.0, root: Path | None = None) -> Corpus:
    """Read the corpus (deterministic for a given Python installation) and split it by file."""
    root = root or stdlib_root()
    files = source_files(root, int(cap_mb * 2**20))
    if len(files) < VAL_STRIDE:
        raise RuntimeError(f"only {len(files)} .py files under {root} within {cap_mb} MB; the "
                           f"split needs at least {VAL_STRIDE}: raise cap_mb (or check that this "
                           "is a full Python installation)")
    val = [p for i, p in enumerate(files) if i % VAL_STRIDE == VAL_STRIDE - 1]
    train = [p for i, p in enumerate(files) if i % VAL_STRIDE != VAL_STRIDE - 1]
    rel = [str(p.relative_to(root)) for p in train], [str(p.relative_to(root)) for p in val]
    return Corpus(_concat(train), _concat(val), rel[0], rel[1], str(root))


@dataclass
class BatchPlan:
    """Every batch's start offsets, fixed up front: ``offsets[step]`` holds ``batch`` offsets."""

    data: torch.Tensor
    offsets: torch.Tensor
    seq_len: int

    @classmethod
    def draw(cls, data: torch.Tensor, *, steps: int, batch: int, seq_len: int,
             seed: int) -> BatchPlan:
        """Draw ``steps`` x ``batch`` offsets from a generator seeded with ``seed``."""
        if data.numel() <= seq_len + 1:
            raise ValueError(f"corpus of {data.numel()} bytes is too short for seq_len {seq_len}")
        gen = torch.Generator().manual_seed(seed)
        offsets = torch.randint(0, data.numel() - seq_len - 1, (steps, batch), generator=gen)
        return cls(data, offsets, seq_len)

    @property
    def steps(self) -> int:
        """How many batches the plan holds."""
        return self.offsets.shape[0]

    def to(self, device: torch.device | str) -> BatchPlan:
        """The same plan with data and offsets on ``device`` (batches then gather there)."""
        return BatchPlan(self.data.to(device), self.offsets.to(device), self.seq_len)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-byte targets of batch ``step``, as int64 (batch, seq_len) tensors."""
        span = torch.arange(self.seq_len + 1, device=self.data.device)
        chunk = self.data[self.offsets[step].unsqueeze(1) + span].long()
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()

    def fingerprint(self) -> str:
        """A short hash of the offsets: equal fingerprints mean identical batches in order."""
        digest = hashlib.sha256(self.offsets.cpu().numpy().tobytes())
        digest.update(str((self.seq_len, self.data.numel())).encode())
        return digest.hexdigest()[:16]


def token_checksum(x: torch.Tensor) -> torch.Tensor:
    """An order-sensitive checksum of one batch (a device tensor; no synchronisation).

    Token k (flattened, from 0) is weighted by (k + 1) mod 9973, so moving tokens within the
    batch changes the sum. int64 throughout: with byte tokens (< 256) a batch of n tokens sums to
    at most 255 * 9972 * n, about 2.5e12 for a million tokens - far from int64's 9.2e18."""
    weights = torch.arange(1, x.numel() + 1, device=x.device, dtype=torch.int64) % 9973
    return (x.flatten().long() * weights).sum()


def step_checksum(x: torch.Tensor, step: int) -> torch.Tensor:
    """:func:`token_checksum` of the batch trained at ``step`` (from 0), weighted by ``step + 1``.

    Summed over a run, the weights make the total depend on which batch came at which step, so
    equal totals mean the same batches in the same order (a plain sum would not see two batches
    swapped). Exact in int64 as long as 255 * 9972 * n * S (S + 1) / 2 (S steps of n tokens)
    stays under 9.2e18: the full profile's 83 batches of 32,768 tokens stay below 3e14, and
    a million tokens per step would allow about 2,700 steps."""
    return token_checksum(x) * (step + 1)


# ------------------------------------------------------------------ running and measuring a path
def attempt(fn: Callable[[], bench.Run], label: str, device: torch.device | str, *,
            compile_fix: str | None = None) -> bench.Run:
    """``fn()``, with out of GPU memory - and, given ``compile_fix``, a failing torch.compile -
    turned into a :class:`bench.Run` whose ``error`` is one sentence, so later paths still run.
    Any other error of an eager path is a bug and propagates."""
    device = torch.device(device)
    try:
        if compile_fix is None:
            return fn()
        with errors.compile_guard(compile_fix):
            return fn()
    except torch.OutOfMemoryError as exc:
        return bench.Run(label, device.type, error=(
            f"out of GPU memory ({errors.one_line(exc, 100)}): set a smaller batch_size in the "
            "parameters cell"))
    except errors.CompileFailed as exc:
        return bench.Run(label, device.type, error=str(exc))
    finally:
        if compile_fix is not None:
            torch._dynamo.reset()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def train_path(build: Callable[[], tuple[Callable[[int], torch.Tensor], dict]], steps: int, *,
               device: torch.device | str, warmup: int, label: str,
               progress: Callable | None = None, compiled: bool = False,
               finish: Callable[[bench.Run, dict], None] | None = None) -> bench.Run:
    """One path's run record: ``build()`` inside :func:`bench.peak_memory` returns the path's
    training step and its parts (model, optimizer, ...); :func:`bench.train` trains it for
    ``steps`` steps; then the peak memory, with ``compiled`` the compile time (step 0 beyond a
    median step: ``extra['compile_s']``), and ``finish(run, parts)`` adds what the notebook
    measures after training (validation loss, a profile, one more step's memory)."""
    with bench.peak_memory(device) as peak:
        step, parts = build()
        run = bench.train(step, steps, device=device, warmup=warmup, label=label,
                          progress=progress)
    run.peak_mem_gib = peak.gib
    if finish is not None:
        finish(run, parts)
    if compiled:  # step 0 compiled (or met compiled blocks): what it took beyond a step
        run.extra["compile_s"] = max(0.0, run.first_step_s - run.timing.median_ms / 1e3)
    return run


# ------------------------------------------------------------------ tables of runs
def paths_table(runs: dict[str, bench.Run], labels: dict[str, str], *, flops_per_token: float,
                peak_tflops: float, baseline: str | None = None) -> pd.DataFrame:
    """One row per path of ``labels`` (a path that did not run keeps a row saying why).

    ``speedup_vs_fp32`` is the step time of the path ``baseline`` (notebook 05 passes its FP32
    path; the column keeps that name in its saved table) over each path's; NaN where no
    ``baseline`` is given or it did not run."""
    import pandas as pd

    rows = []
    for key, label in labels.items():
        run = runs.get(key)
        row = {"path": key, "label": label}
        if run is None:
            row["status"] = "not run on this machine"
        elif not run.ok:
            row["status"] = run.status()
        else:
            t, tokens_per_s = run.timing, run.tokens_per_s
            row.update(status="ran", step_ms=t.median_ms, step_ms_iqr=t.iqr_ms,
                       step_ms_q1=t.q1_ms, step_ms_q3=t.q3_ms, tokens_per_s=tokens_per_s,
                       mfu=ceilings.mfu(flops_per_token, tokens_per_s, peak_tflops),
                       peak_mem_gib=run.peak_mem_gib, final_train_loss=run.final_loss,
                       final_val_loss=run.extra.get("val_loss", math.nan),
                       compile_s=run.extra.get("compile_s", math.nan),
                       first_step_s=run.first_step_s, wall_s=run.wall_s, steps=len(run.losses),
                       learned=run.learned, batch_checksum=str(run.extra.get("checksum", "")))
        rows.append(row)
    table = pd.DataFrame(rows)
    for column in ("step_ms", "tokens_per_s", "mfu", "peak_mem_gib", "final_val_loss"):
        if column not in table:
            table[column] = math.nan
    base = table.loc[(table["path"] == baseline) & (table["status"] == "ran"), "step_ms"]
    table["speedup_vs_fp32"] = (float(base.iloc[0]) if len(base) else math.nan) / table["step_ms"]
    return table


def start_table(runs: dict[str, bench.Run], first: int = 8) -> pd.DataFrame:
    """The first ``first`` steps of every run that completed, one row per run: each step's loss
    and, when the run recorded them (``extra['grad_norms']``), its gradient norm before
    clipping, as 'loss (norm)'."""
    import pandas as pd

    rows = {}
    for key, run in runs.items():
        if not run.ok:
            continue
        norms = run.extra.get("grad_norms") or [math.nan] * len(run.losses)
        rows[key] = {f"step {i}": f"{loss:.2f}" + ("" if math.isnan(norm) else f" ({norm:.1f})")
                     for i, (loss, norm) in enumerate(zip(run.losses[:first], norms[:first],
                                                          strict=False))}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("run")


def unhealthy_start(runs: dict[str, bench.Run]) -> str:
    """'' when no completed run's loss after step 0 climbed above its step-0 loss; else one
    CHECK sentence naming the runs, their worst step and the usual fix."""
    bad = []
    for key, run in runs.items():
        if run.ok and len(run.losses) > 1:
            worst = max(range(1, len(run.losses)), key=lambda i: run.losses[i])
            if run.losses[worst] > run.losses[0]:
                bad.append(f"{key} (step {worst}: {run.losses[worst]:.3f} > step 0's "
                           f"{run.losses[0]:.3f})")
    if not bad:
        return ""
    return ("CHECK: unhealthy start - the loss climbed above its step-0 value in "
            f"{', '.join(bad)}: the learning rate rises too fast for this model; lower lr or "
            "warm up over more steps (the README's recipe sweep shows where the start breaks).")
