"""Notebook 02: the differences between torch AdamW and Apex FusedAdam that bite when switching,
each found by running both on tiny tensors rather than by reading documentation."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from helpers.optim_bench import APEX

if TYPE_CHECKING:
    import pandas as pd


def _probe(factory: Callable, device: torch.device | str) -> dict[str, str]:
    """Facts about one optimizer class, found by running it on tiny tensors."""
    def param(dtype: torch.dtype = torch.float32) -> nn.Parameter:
        p = nn.Parameter(torch.zeros(8, device=device, dtype=dtype))
        p.grad = torch.ones_like(p)
        return p

    facts = {"default weight_decay": str(factory([param()]).defaults["weight_decay"])}
    p = param()
    optimizer = factory([p])
    optimizer.step()
    where = "state[p]['step']" if "step" in optimizer.state[p] else "param_groups[i]['step']"
    facts["step counter kept in"] = where
    try:
        optimizer.zero_grad(set_to_none=True)
        facts["zero_grad(set_to_none=True)"] = f"works (grad is None: {p.grad is None})"
    except TypeError as exc:
        facts["zero_grad(set_to_none=True)"] = f"TypeError: {str(exc).splitlines()[0]}"
    b = param(torch.bfloat16)
    optimizer = factory([b])
    optimizer.step()
    facts["bf16 params: exp_avg dtype"] = str(optimizer.state[b]["exp_avg"].dtype).replace(
        "torch.", "")
    try:
        factory([param(torch.float16)], master_weights=True)
        facts["master_weights=True alone"] = "accepted"
    except TypeError:
        facts["master_weights=True alone"] = "no such argument"
    except RuntimeError as exc:
        facts["master_weights=True alone"] = f"RuntimeError: {str(exc).splitlines()[0]}"
    return facts


def gotchas(device: torch.device | str, *, apex: bool) -> pd.DataFrame:
    """torch AdamW next to Apex FusedAdam (when ``apex``), each fact measured by a probe."""
    import pandas as pd

    columns = {"torch AdamW": _probe(torch.optim.AdamW, device)}
    if apex:
        from apex.optimizers import FusedAdam

        columns[APEX] = _probe(FusedAdam, device)
    return pd.DataFrame(columns).rename_axis("question").reset_index()
