"""Routed experts (``FusedMoE``'s stacked ``w13``/``w2``) in a weight-only 4-bit format.

Each expert's rows are quantized as a linear layer's weight is (the same fit, no input
loudness: no calibration pass reaches the experts), then stored as fastllm-kernels' grouped
expert kernel reads them: codes two a byte, float32 scales ``[E, rows, K / group]``, and
zeros of that shape (int4) or the layer's 16-value code ``book`` (nf4). At decode only the
routed experts' packed bytes move.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
from fastllm_kernels.quant import pack_int4

from fastllm.layers.fused_moe import FusedMoE

from fastllm_quant.common import group_size_for

RowQuantizer = Callable[[torch.Tensor, int], tuple[torch.Tensor, ...]]
"""``[N, K]`` float, group size -> (codes 0..15 ``[N, K]``, scales ``[N, K/group]``[, zeros])."""


def quantize_four_bit_experts(model: nn.Module, quantize_rows: RowQuantizer, group_size: int,
                              book: Optional[tuple[float, ...]] = None) -> None:
    """Every ``FusedMoE`` of ``model`` in place: ``quantize_rows`` returns zeros (int4) unless a
    code ``book`` (nf4) gives the values."""
    for moe in _moe_layers(model, book):
        for name in ("w13", "w2"):
            weight = getattr(moe, name).data
            experts, rows, cols = weight.shape
            codes, scales, *zeros = quantize_rows(weight.reshape(experts * rows, cols), group_size_for(cols, group_size))
            moe.set_expert_tensor(name, pack_int4(codes).view(experts, rows, cols // 2))
            moe.set_expert_tensor(f"{name}_scale", scales.float().view(experts, rows, -1))
            if book is None:
                moe.set_expert_tensor(f"{name}_zero", zeros[0].float().view(experts, rows, -1))


def empty_four_bit_experts(model: nn.Module, group_size: int, book: Optional[tuple[float, ...]] = None) -> None:
    """``quantize_four_bit_experts``'s layout, unfilled: what a saved model's experts load into."""
    for moe in _moe_layers(model, book):
        for name in ("w13", "w2"):
            experts, rows, cols = getattr(moe, name).shape
            device = getattr(moe, name).device
            moe.set_expert_tensor(name, torch.empty(experts, rows, cols // 2, dtype=torch.uint8, device=device))
            groups = (experts, rows, cols // group_size_for(cols, group_size))
            moe.set_expert_tensor(f"{name}_scale", torch.empty(groups, device=device))
            if book is None:
                moe.set_expert_tensor(f"{name}_zero", torch.empty(groups, device=device))


def _moe_layers(model: nn.Module, book: Optional[tuple[float, ...]]) -> list[FusedMoE]:
    """The model's ``FusedMoE`` layers, each given the format's code ``book`` (nf4) first."""
    layers = [module for module in model.modules() if isinstance(module, FusedMoE)]
    for moe in layers if book is not None else []:
        moe.set_expert_tensor("book", torch.tensor(book, dtype=torch.float32, device=moe.w13.device))
    return layers
