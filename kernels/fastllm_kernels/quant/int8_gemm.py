"""W8A16 GEMM: ``y = x (q * s)^T`` with int8 ``q [N, K]`` and one scale per output channel ``s [N]``.

The scale is constant along K, so it is applied once to the accumulator: the inner loop only
widens int8 codes (exact) and multiplies. The kernel is ``weight_gemm``'s, shared by every format.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fastllm_kernels.quant.common import fused
from fastllm_kernels.quant.weight_gemm import Tiling, WeightFormat, weight_gemm

INT8 = WeightFormat(four_bit=False)


def int8_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
              tiling: Tiling | None = None) -> torch.Tensor:
    """The Triton kernel: ``x [M, K]`` (fp16/bf16/fp32) -> ``[M, N]`` in x's dtype."""
    return weight_gemm(x, qweight, scales, None, None, INT8, tiling)


def int8_gemm_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The same arithmetic in torch: int8 weights widened exactly, the scale applied to the output."""
    return F.linear(x, qweight.to(x.dtype)) * scales.to(x.dtype)


def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Fused kernel for decode-sized batches on the GPU, the torch path elsewhere."""
    return int8_gemm(x, qweight, scales) if fused(x) else int8_gemm_ref(x, qweight, scales)
