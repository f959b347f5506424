"""Unquantized linear layers: one row of x through ``weight_gemm``'s GEMV, more rows through BLAS.

At batch 1 a decode step is a chain of short kernels, and each GEMV's weight stream starts
only when the kernel before it ends. The GEMV is launched dependent (``pdl``): its first slice
of W is in flight while the norm or attention before it finishes, which a BLAS call cannot do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fastllm_kernels.quant.weight_gemm import WeightFormat, weight_gemm

DENSE = WeightFormat(four_bit=False, dense=True)


def gemv_applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """One row of 16-bit x against W of its dtype on the GPU, contiguous rows of whole 16-byte
    runs, no bias (BLAS adds it in its epilogue; here it would be one launch more)."""
    return (x.is_cuda and bias is None and x.dtype in (torch.float16, torch.bfloat16) and weight.dtype == x.dtype
            and x.numel() == x.shape[-1] and weight.shape[1] % 8 == 0 and weight.stride(1) == 1)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``."""
    if not gemv_applies(x, weight, bias):
        return F.linear(x, weight, bias)
    y = weight_gemm(x.reshape(1, -1), weight, None, None, None, DENSE)
    return y.view(*x.shape[:-1], weight.shape[0])
