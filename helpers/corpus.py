"""A byte-level text corpus that needs no download: the Python standard library's own sources.

Files are the ``.py`` sources under ``sysconfig.get_paths()["stdlib"]`` (installed packages and
test suites left out, so the corpus does not depend on what else is installed), in sorted order,
read as raw bytes (vocabulary 256) up to a size cap. Every 20th file goes to validation: a stride
rather than the alphabetical tail, so both splits hold the same mix of modules. Batches come from
a :class:`BatchPlan` - all random offsets drawn up front from one seeded generator - so every
training path sees the same batches in the same order.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

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
