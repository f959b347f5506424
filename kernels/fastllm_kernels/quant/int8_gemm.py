"""W8A16 GEMM: ``y = x (q * s)^T`` with int8 ``q [N, K]`` and one scale per output channel ``s [N]``.

The scale is constant along K, so it is applied once to the accumulator: the inner loop only
converts int8 to the activation dtype (exact) and feeds the tensor cores.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fastllm_kernels.quant.common import block_m, dot_precision, fused


@triton.jit
def _int8_gemm_kernel(
    x_ptr, q_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_qn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_mask = rows[:, None] < M
    col_mask = cols[:, None] < N
    x_ptrs = x_ptr + rows[:, None] * stride_xm + ks[None, :]
    q_ptrs = q_ptr + cols[:, None].to(tl.int64) * stride_qn + ks[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        x = tl.load(x_ptrs, mask=row_mask, other=0.0)
        q = tl.load(q_ptrs, mask=col_mask, other=0)
        acc += tl.dot(x, tl.trans(q.to(x.dtype)), input_precision=PRECISION)
        x_ptrs += BLOCK_K
        q_ptrs += BLOCK_K
    scale = tl.load(s_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = acc * scale[None, :]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=row_mask & (cols[None, :] < N))


def largest_block_k(k: int, largest: int) -> int:
    """The largest power of two up to ``largest`` dividing ``k``: the loop needs no K mask."""
    size = largest
    while size > 16 and k % size:
        size //= 2
    if k % size:
        raise ValueError(f"input features {k} must be a multiple of 16")
    return size


def int8_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, block_n: int = 32,
              block_k: int = 256, num_warps: int = 4, num_stages: int = 5) -> torch.Tensor:
    """The Triton kernel: ``x [M, K]`` (fp16/bf16/fp32, contiguous rows) -> ``[M, N]`` in x's dtype."""
    m, k = x.shape
    n = qweight.shape[0]
    x = x.contiguous()
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    bm = block_m(m)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, bm))
    _int8_gemm_kernel[grid](x, qweight, scales, y, m, n, k, x.stride(0), qweight.stride(0), y.stride(0),
                            BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=largest_block_k(k, block_k),
                            PRECISION=dot_precision(x.dtype), num_warps=num_warps, num_stages=num_stages)
    return y


def int8_gemm_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The same arithmetic in torch: int8 weights widened exactly, the scale applied to the output."""
    return F.linear(x, qweight.to(x.dtype)) * scales.to(x.dtype)


def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Fused kernel for decode-sized batches on the GPU, the torch path elsewhere."""
    return int8_gemm(x, qweight, scales) if fused(x) else int8_gemm_ref(x, qweight, scales)
