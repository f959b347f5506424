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
    for moe in model.modules():
        if not isinstance(moe, FusedMoE):
            continue
        for name in ("w13", "w2"):
            weight = getattr(moe, name).data
            experts, rows, cols = weight.shape
            codes, scales, *zeros = quantize_rows(weight.reshape(experts * rows, cols), group_size_for(cols, group_size))
            setattr(moe, name, _frozen(pack_int4(codes).view(experts, rows, cols // 2)))
            setattr(moe, f"{name}_scale", _frozen(scales.float().view(experts, rows, -1)))
            if book is None:
                setattr(moe, f"{name}_zero", _frozen(zeros[0].float().view(experts, rows, -1)))
        if book is not None:
            moe.book = _frozen(torch.tensor(book, dtype=torch.float32, device=moe.w13.device))


def _frozen(tensor: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(tensor, requires_grad=False)


def expect_four_bit_experts(model: nn.Module, group_size: int, book: Optional[tuple[float, ...]] = None) -> None:
    """Every ``FusedMoE`` of ``model`` ready to load 4-bit experts from a pre-quantized checkpoint:
    the layout ``quantize_four_bit_experts`` leaves (codes, scales, and zeros or the code ``book``)."""
    for moe in model.modules():
        if not isinstance(moe, FusedMoE):
            continue
        for name in ("w13", "w2"):
            experts, rows, cols = getattr(moe, name).shape
            groups = cols // group_size_for(cols, group_size)
            moe.expect_checkpoint_tensor(name, (experts, rows, cols // 2), torch.uint8)
            moe.expect_checkpoint_tensor(f"{name}_scale", (experts, rows, groups), torch.float32)
            if book is None:
                moe.expect_checkpoint_tensor(f"{name}_zero", (experts, rows, groups), torch.float32)
        if book is not None:
            moe.book = _frozen(torch.tensor(book, dtype=torch.float32, device=moe.w13.device))
