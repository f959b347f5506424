"""Launch shapes shared by the dequantize-GEMM kernels.

Decode is memory-bound: every packed weight byte is read once, by one program that owns
``BLOCK_N`` output columns for all (at most ``MAX_FUSED_M``) rows of ``x``. Small ``BLOCK_N``
gives enough programs to fill the GPU at batch 1; the tensor cores take the (padded) rows.
Larger batches are compute-bound: they dequantize the weight once and use the BLAS matmul.
"""

from __future__ import annotations

import torch

from fastllm_kernels.host_math import next_power_of_2

MAX_FUSED_M = 64


def fused(x: torch.Tensor) -> bool:
    """Whether ``x [M, K]`` goes through the fused dequantize-GEMM kernel (else dequantize + matmul):
    decode-sized batches on the GPU, K whole 32-bit words of codes."""
    return x.is_cuda and x.shape[0] <= MAX_FUSED_M and x.shape[1] % 8 == 0


def block_m(m: int) -> int:
    """Rows per program: the tensor cores need at least 16."""
    return max(16, next_power_of_2(m))


def dot_precision(dtype: torch.dtype) -> str:
    """float32 activations keep full precision; half types ignore the setting."""
    return "ieee" if dtype == torch.float32 else "tf32"
