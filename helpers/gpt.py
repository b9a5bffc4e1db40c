"""A small GPT-style decoder whose norm and attention are injected, plus its size arithmetic.

Token + position embeddings, pre-norm blocks (causal self-attention, then a 4x GELU MLP), a final
norm and an output head tied to the token embedding (one matrix, used twice). The norm class and
the attention function are arguments, so training paths differ only where they are meant to.
Initialisation follows GPT-2: normal(0, 0.02) everywhere, residual output projections scaled by
1/sqrt(2 * n_layer), biases zero, norms one/zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

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

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
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


def score_matrix_bytes(cfg: GPTConfig, batch: int, bytes_per_element: int = 4) -> int:
    """Size of one layer's attention score matrix, batch x heads x T x T, as written-out
    attention (:func:`manual_attention`) materialises it; the flash and memory-efficient kernels
    behind :func:`sdpa_attention` work through it in tiles and never hold it whole."""
    return batch * cfg.n_head * cfg.seq_len * cfg.seq_len * bytes_per_element


def flops_per_token(cfg: GPTConfig, *, include_head: bool = True) -> int:
    """Training FLOPs per token: 6 N + 6 L d T.

    6 N: forward (2 N) plus backward (4 N) of every parameter matmul, N = non-embedding
    parameters plus, with ``include_head``, the tied head's d x V matmul (it runs even though its
    matrix is the embedding). 6 L d T: the attention scores (QK^T) and weighted sum (AV), 12 L d T
    for full attention, of which the causal mask leaves half - the half flash attention computes.
    """
    n = non_embedding_params(cfg) + (cfg.d_model * cfg.padded_vocab if include_head else 0)
    return 6 * n + 6 * cfg.n_layer * cfg.d_model * cfg.seq_len
