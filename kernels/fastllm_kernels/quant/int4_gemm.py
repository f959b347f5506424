"""4-bit GEMMs: ``y = x W^T`` with W stored as two 4-bit codes per byte and a scale per group.

Packing (``pack_int4``): ``qweight [N, K/2]`` uint8, byte ``j`` of a row holds input channel
``2j`` in its low nibble and ``2j + 1`` in its high nibble. Groups run along K.

* int4 (affine, group-wise): ``W[n, k] = (q - zeros[n, g]) * scales[n, g]``, ``g = k // group``.
* nf4 (codebook, block-wise absmax): ``W[n, k] = NF4[q] * absmax[n, g]``.

One kernel serves both. A program owns ``BLOCK_N`` output columns and walks K one group
slice at a time, so the group's scale is one value per column: the codes are unpacked and
interleaved in registers, turned into small exact values (``q - z``, or the NF4 value gathered
from the 16-entry codebook held in registers: on an H100 2x faster than a tree of selects and
6x faster than a lookup in memory), go through the tensor cores, and the scale is applied to
each slice's partial sums.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fastllm_kernels.quant.common import block_m, dot_precision, fused

# QLoRA's NormalFloat4: quantiles of N(0, 1) scaled to [-1, 1], with an exact zero.
NF4_CODES = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)


@triton.jit
def _four_bit_gemm_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, code_ptr, y_ptr, M, N, K,
    stride_xm, stride_qn, stride_sn, stride_ym,
    GROUP: tl.constexpr, NF4: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows[:, None] < M
    col_in = cols < N
    x_ptrs = x_ptr + rows[:, None] * stride_xm + tl.arange(0, BLOCK_K)[None, :]
    q_ptrs = q_ptr + cols[:, None].to(tl.int64) * stride_qn + tl.arange(0, BLOCK_K // 2)[None, :]
    s_ptrs = s_ptr + cols.to(tl.int64) * stride_sn
    z_ptrs = z_ptr + cols.to(tl.int64) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if NF4:
        codebook = tl.load(code_ptr + tl.arange(0, 16))
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptrs, mask=row_mask, other=0.0)
        packed = tl.load(q_ptrs, mask=col_in[:, None], other=0)
        codes = tl.join(packed & 0xF, packed >> 4).reshape(BLOCK_N, BLOCK_K)
        group = k0 // GROUP
        if NF4:
            flat = codes.reshape(BLOCK_N * BLOCK_K).to(tl.int32)
            w = tl.gather(codebook, flat, 0).reshape(BLOCK_N, BLOCK_K).to(x.dtype)
        else:
            zero = tl.load(z_ptrs + group, mask=col_in, other=0.0).to(x.dtype)
            w = codes.to(x.dtype) - zero[:, None]
        scale = tl.load(s_ptrs + group, mask=col_in, other=0.0).to(tl.float32)
        acc += tl.dot(x, tl.trans(w), input_precision=PRECISION) * scale[None, :]
        x_ptrs += BLOCK_K
        q_ptrs += BLOCK_K // 2
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_mask & col_in[None, :])


@functools.lru_cache(maxsize=None)
def nf4_codebook(device: torch.device) -> torch.Tensor:
    return torch.tensor(NF4_CODES, dtype=torch.float32, device=device)


def _launch(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
            group_size: int, nf4: bool, block_n: int, num_warps: int, num_stages: int) -> torch.Tensor:
    m, k = x.shape
    n = qweight.shape[0]
    if k != 2 * qweight.shape[1] or k % group_size or group_size < 16 or group_size & (group_size - 1):
        raise ValueError(f"x has {k} features; qweight {tuple(qweight.shape)}, group {group_size} "
                         "(a power of two from 16 dividing K)")
    x = x.contiguous()
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    bm = block_m(m)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, bm))
    _four_bit_gemm_kernel[grid](
        x, qweight, scales, zeros, nf4_codebook(x.device), y, m, n, k,
        x.stride(0), qweight.stride(0), scales.stride(0), y.stride(0),
        GROUP=group_size, NF4=nf4, BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=min(group_size, 128),
        PRECISION=dot_precision(x.dtype), num_warps=num_warps, num_stages=num_stages)
    return y


def int4_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
              group_size: int, block_n: int = 32, num_warps: int = 4, num_stages: int = 5) -> torch.Tensor:
    """Affine int4, Triton: ``scales``/``zeros`` ``[N, K / group_size]`` (zeros integer-valued)."""
    return _launch(x, qweight, scales, zeros, group_size, False, block_n, num_warps, num_stages)


def nf4_gemm(x: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor, block_size: int,
             block_n: int = 32, num_warps: int = 4, num_stages: int = 5) -> torch.Tensor:
    """NF4, Triton: ``absmax [N, K / block_size]``."""
    return _launch(x, qweight, absmax, absmax, block_size, True, block_n, num_warps, num_stages)


# ---- layout and torch references -------------------------------------------------------------
def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` codes in 0..15 -> ``[N, K/2]`` uint8 (even channel low nibble)."""
    codes = codes.to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """``[N, K/2]`` uint8 -> ``[N, K]`` uint8 codes."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                    group_size: int, dtype: torch.dtype) -> torch.Tensor:
    q = unpack_int4(qweight).float().unflatten(1, (-1, group_size))
    w = (q - zeros.float()[..., None]) * scales.float()[..., None]
    return w.flatten(1).to(dtype)


def dequantize_nf4(qweight: torch.Tensor, absmax: torch.Tensor, block_size: int,
                   dtype: torch.dtype) -> torch.Tensor:
    codes = nf4_codebook(qweight.device)[unpack_int4(qweight).long()].unflatten(1, (-1, block_size))
    return (codes * absmax.float()[..., None]).flatten(1).to(dtype)


def int4_gemm_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                  group_size: int) -> torch.Tensor:
    return F.linear(x, dequantize_int4(qweight, scales, zeros, group_size, x.dtype))


def nf4_gemm_ref(x: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor, block_size: int) -> torch.Tensor:
    return F.linear(x, dequantize_nf4(qweight, absmax, block_size, x.dtype))


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                group_size: int) -> torch.Tensor:
    """Fused kernel for decode-sized batches on the GPU, dequantize + matmul elsewhere."""
    if fused(x):
        return int4_gemm(x, qweight, scales, zeros, group_size)
    return int4_gemm_ref(x, qweight, scales, zeros, group_size)


def nf4_linear(x: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor, block_size: int) -> torch.Tensor:
    if fused(x):
        return nf4_gemm(x, qweight, absmax, block_size)
    return nf4_gemm_ref(x, qweight, absmax, block_size)
