"""FP8 weights (e4m3, one scale per output channel) with 16-bit activations (W8A16) for decode.

At a few rows, quantizing the activations per token and calling ``torch._scaled_mm`` costs
several launches for a product that only streams the weight. Here the e4m3 bytes are widened
in registers (exact in fp16/bf16/fp32) inside ``weight_gemm``'s kernels, as int8 codes are; the
scale is applied to the accumulator. Large batches keep W8A8 (``quantize_fp8_rows`` + FP8
tensor cores), chosen by the caller.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fastllm_kernels.host_math import next_power_of_2
from fastllm_kernels.quant.common import fused
from fastllm_kernels.quant.weight_gemm import Tiling, WeightFormat, weight_gemm

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
FP8_WEIGHTS = WeightFormat(four_bit=False, fp8=True)
MAX_FUSED_FEATURES = 1 << 15  # one row per program, held whole in registers


def fp8_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
             tiling: Tiling | None = None) -> torch.Tensor:
    """The Triton kernel: ``x [M, K]`` -> ``[M, N]`` in x's dtype; ``weight`` e4m3 ``[N, K]``,
    ``weight_scale [N]``."""
    return weight_gemm(x, weight, weight_scale, None, None, FP8_WEIGHTS, tiling)


def fp8_gemm_ref(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """The same arithmetic in torch: e4m3 widened exactly, the scale applied to the output."""
    return F.linear(x, weight.to(x.dtype)) * weight_scale.to(x.dtype)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """W8A16: the fused kernel for decode-sized batches on the GPU, the torch path elsewhere."""
    return fp8_gemm(x, weight, weight_scale) if fused(x) else fp8_gemm_ref(x, weight, weight_scale)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, K, stride_xm, stride_qm, FP8_MAX: tl.constexpr,
                          BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + row * stride_xm + ks, mask=ks < K, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) / FP8_MAX, 1e-12)
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * stride_qm + ks, q.to(q_ptr.dtype.element_ty), mask=ks < K)
    tl.store(scale_ptr + row, scale)


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[R, K]`` -> (e4m3 ``[R, K]``, float32 scale ``[R, 1]``), each row scaled to fill the range:
    on CUDA one launch reading x once (the torch expression makes eight passes over fp32 copies)."""
    if not x.is_cuda or x.shape[1] > MAX_FUSED_FEATURES:
        return quantize_fp8_rows_ref(x)
    return quantize_fp8_rows_triton(x)


def quantize_fp8_rows_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, k = x.shape
    x = x.contiguous()
    q = torch.empty((rows, k), dtype=FP8, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    block_k = next_power_of_2(k)
    _quantize_rows_kernel[(rows,)](x, q, scale, k, x.stride(0), q.stride(0), FP8_MAX=FP8_MAX, BLOCK_K=block_k,
                                   num_warps=min(16, max(4, block_k // 1024)))
    return q, scale


def quantize_fp8_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale
