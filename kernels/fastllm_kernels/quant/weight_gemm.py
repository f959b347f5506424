"""One split-K kernel family for every weight-only format: ``y = x W^T``, W dequantized in registers.

Decode streams each weight byte once, so the kernels are judged by weight bytes per second.
A 4096x4096 layer cut only along N gives ~128 programs for 132 SMs: too few loads in flight.
The grid is cut along K too (``SPLIT_K``); every program writes its fp32 partial sums to a
workspace, and the last program of a tile to arrive (an atomic counter) adds the partials in
split order and stores the output: one launch, deterministic, no zeroed buffer. The counters
reset themselves, so the kernels replay inside CUDA graphs.

Formats (constexpr flags), weights ``q`` rows-first ``[N, K / codes per byte]``:

* int8 / fp8-e4m3: one code a byte, one scale per output channel applied after the K loop.
* int4: two codes a byte (``pack_int4``), ``(q - zero) * scale`` per group of K.
* nf4: two codes a byte, ``NF4[q] * absmax`` per block of K.

Two loops share the dequantize step: ``_gemv_kernel`` (one row of x, CUDA-core FMAs, wide
row-contiguous loads) and ``_gemm_kernel`` (2..64 rows, tensor cores, x padded to 16 rows).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fastllm_kernels.quant.common import block_m, dot_precision


@dataclass(frozen=True)
class WeightFormat:
    """How ``q`` holds the codes and how the scales map onto K (``group`` 0: one scale per row)."""

    four_bit: bool
    fp8: bool = False
    nf4: bool = False
    has_zero: bool = False
    group: int = 0


@triton.jit
def _code_values(packed, codebook, FOUR_BIT: tl.constexpr, FP8: tl.constexpr, NF4: tl.constexpr,
                 ROWS: tl.constexpr, COLS: tl.constexpr, dtype: tl.constexpr):
    """A packed tile -> ``[ROWS, COLS]`` exact small values: the code (int8, fp8, int4 0..15) or the
    NF4 value from the 16-entry code book held in registers. Scales and zeros come later.
    e4m3 arrives as bytes, so masked lanes read 0 (a NaN-free zero) and the cast is a bitcast."""
    if FP8:
        values = packed.to(tl.float8e4nv, bitcast=True).to(dtype)
    elif FOUR_BIT:
        codes = tl.join(packed & 0xF, packed >> 4).reshape(ROWS, COLS)
        if NF4:
            values = tl.gather(codebook, codes.reshape(ROWS * COLS).to(tl.int32), 0).reshape(ROWS, COLS).to(dtype)
        else:
            values = codes.to(dtype)
    else:
        values = packed.to(dtype)
    return values  # one return: the compiler types every return statement, live or not


@triton.jit
def _write_output(acc, rows, cols, M, N, y_ptr, stride_ym, ws_ptr, lock_ptr, tile, pid_k,
                  SPLIT_K: tl.constexpr):
    """Store ``acc [R, C]`` (fp32), or, split along K, park it and let the last split add them all."""
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    y_ptrs = y_ptr + rows[:, None] * stride_ym + cols[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        ws_ptrs = ws_ptr + rows[:, None] * N + cols[None, :]
        tl.store(ws_ptrs + pid_k * M * N, acc, mask=mask)
        tl.debug_barrier()  # every thread's partials are out before the release below
        arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros_like(acc)
            for split in range(SPLIT_K):
                total += tl.load(ws_ptrs + split * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(lock_ptr + tile, 0)


@triton.jit
def _gemv_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, code_ptr, y_ptr, ws_ptr, lock_ptr, N, K, stride_qn, stride_sn,
    ITERS: tl.constexpr, GROUP: tl.constexpr, FOUR_BIT: tl.constexpr, FP8: tl.constexpr, NF4: tl.constexpr,
    HAS_ZERO: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SUB: tl.constexpr, EVEN_K: tl.constexpr,
):
    """``x [1, K]``: a program owns ``BLOCK_N`` rows of W and ``ITERS`` slices of ``BLOCK_K``.
    8-bit products accumulate element-wise and are summed once at the end; 4-bit ones are summed
    per scale group (``SUB`` inputs, one scale) each slice, the zero point as ``z * sum(x)``."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    PACK: tl.constexpr = 2 if FOUR_BIT else 1
    SUBS: tl.constexpr = BLOCK_K // SUB
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < N
    ks = tl.arange(0, BLOCK_K)
    kb = tl.arange(0, BLOCK_K // PACK)
    q_rows = q_ptr + cols[:, None].to(tl.int64) * stride_qn
    if NF4:
        codebook = tl.load(code_ptr + tl.arange(0, 16))
    else:
        codebook = None
    acc = tl.zeros((BLOCK_N, SUBS if FOUR_BIT else BLOCK_K), dtype=tl.float32)
    for i in range(ITERS):
        k0 = (pid_k * ITERS + i) * BLOCK_K
        if EVEN_K:
            x = tl.load(x_ptr + k0 + ks).to(tl.float32)
            packed = tl.load(q_rows + k0 // PACK + kb[None, :], mask=col_in[:, None], other=0)
        else:
            x = tl.load(x_ptr + k0 + ks, mask=k0 + ks < K, other=0.0).to(tl.float32)
            packed = tl.load(q_rows + k0 // PACK + kb[None, :],
                             mask=col_in[:, None] & (k0 // PACK + kb < K // PACK)[None, :], other=0)
        w = _code_values(packed, codebook, FOUR_BIT, FP8, NF4, BLOCK_N, BLOCK_K, tl.float32)
        if FOUR_BIT:
            part = tl.sum(tl.reshape(w * x[None, :], (BLOCK_N, SUBS, SUB)), axis=2)
            sub_k = k0 + tl.arange(0, SUBS) * SUB
            meta = cols[:, None].to(tl.int64) * stride_sn + (sub_k // GROUP)[None, :]
            meta_mask = col_in[:, None] & (sub_k < K)[None, :]
            if HAS_ZERO:
                zero = tl.load(z_ptr + meta, mask=meta_mask, other=0.0).to(tl.float32)
                part -= zero * tl.sum(tl.reshape(x, (SUBS, SUB)), axis=1)[None, :]
            acc += part * tl.load(s_ptr + meta, mask=meta_mask, other=0.0).to(tl.float32)
        else:
            acc += w * x[None, :]
    out = tl.sum(acc, axis=1)
    if not FOUR_BIT:
        out *= tl.load(s_ptr + cols, mask=col_in, other=0.0).to(tl.float32)
    _write_output(out[None, :], tl.arange(0, 1), cols, 1, N, y_ptr, 0, ws_ptr, lock_ptr, pid_n, pid_k, SPLIT_K)


@triton.jit
def _gemm_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, code_ptr, y_ptr, ws_ptr, lock_ptr, M, N, K,
    stride_xm, stride_qn, stride_sn, stride_ym,
    ITERS: tl.constexpr, GROUP: tl.constexpr, FOUR_BIT: tl.constexpr, FP8: tl.constexpr, NF4: tl.constexpr,
    HAS_ZERO: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
):
    """``x [M, K]``, M > 1: tiles of small exact weight values in x's dtype go through the tensor
    cores; a 4-bit slice (``BLOCK_K`` divides the group) has one scale per column, applied to
    the slice's partial product."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    PACK: tl.constexpr = 2 if FOUR_BIT else 1
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < N
    ks = tl.arange(0, BLOCK_K)
    kb = tl.arange(0, BLOCK_K // PACK)
    x_rows = x_ptr + rows[:, None] * stride_xm
    q_rows = q_ptr + cols[:, None].to(tl.int64) * stride_qn
    meta_rows = cols.to(tl.int64) * stride_sn
    if NF4:
        codebook = tl.load(code_ptr + tl.arange(0, 16))
    else:
        codebook = None
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(ITERS):
        k0 = (pid_k * ITERS + i) * BLOCK_K
        if EVEN_K:
            x = tl.load(x_rows + k0 + ks[None, :], mask=rows[:, None] < M, other=0.0)
            packed = tl.load(q_rows + k0 // PACK + kb[None, :], mask=col_in[:, None], other=0)
        else:
            x = tl.load(x_rows + k0 + ks[None, :], mask=(rows[:, None] < M) & (k0 + ks < K)[None, :], other=0.0)
            packed = tl.load(q_rows + k0 // PACK + kb[None, :],
                             mask=col_in[:, None] & (k0 // PACK + kb < K // PACK)[None, :], other=0)
        w = _code_values(packed, codebook, FOUR_BIT, FP8, NF4, BLOCK_N, BLOCK_K, x.dtype)
        if FOUR_BIT:
            group = tl.minimum(k0, K - 1) // GROUP  # a slice past K (uneven splits) reads x = 0
            if HAS_ZERO:
                w -= tl.load(z_ptr + meta_rows + group, mask=col_in, other=0.0).to(x.dtype)[:, None]
            scale = tl.load(s_ptr + meta_rows + group, mask=col_in, other=0.0).to(tl.float32)
            acc += tl.dot(x, tl.trans(w), input_precision=PRECISION) * scale[None, :]
        else:
            acc += tl.dot(x, tl.trans(w), input_precision=PRECISION)
    if not FOUR_BIT:
        acc *= tl.load(s_ptr + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
    tile = pid_m * tl.num_programs(0) + pid_n
    _write_output(acc, rows, cols, M, N, y_ptr, stride_ym, ws_ptr, lock_ptr, tile, pid_k, SPLIT_K)


# ---- launch -----------------------------------------------------------------------------------
WORKSPACE_FLOATS = 1 << 22  # fp32 partial sums of one launch: split_k * M * N at most
TILE_COUNTERS = 1 << 16
PROGRAMS_PER_SM = 4  # enough loads in flight to cover HBM latency on an H100


@dataclass(frozen=True)
class Tiling:
    """Launch settings of one call; ``split_k`` None: enough programs for ``PROGRAMS_PER_SM``."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int | None = None


def default_tiling(m: int, fmt: WeightFormat) -> Tiling:
    """One row: thin row tiles, 16-byte loads 512 bytes (8-bit) or 256 bytes (4-bit) along each
    weight row. More rows: 32 columns, one K slice within a 4-bit group for the tensor cores."""
    if m == 1:
        return Tiling(16, 512) if fmt.four_bit else Tiling(8, 512)
    return Tiling(32, min(fmt.group, 128) if fmt.four_bit else 128, num_stages=4)


@functools.lru_cache(maxsize=None)
def _scratch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per device: the partial-sum workspace and the arrival counters (zero between launches)."""
    return (torch.empty(WORKSPACE_FLOATS, dtype=torch.float32, device=device),
            torch.zeros(TILE_COUNTERS, dtype=torch.int32, device=device))


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def split_k_for(tiles: int, iters: int, m: int, n: int, device: torch.device) -> int:
    """Splits of K that bring ``tiles`` programs up to ``PROGRAMS_PER_SM`` per SM."""
    split = min(triton.cdiv(PROGRAMS_PER_SM * _num_sms(device), tiles), iters, WORKSPACE_FLOATS // (m * n))
    return max(split, 1)


def weight_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                codebook: torch.Tensor | None, fmt: WeightFormat, tiling: Tiling | None = None) -> torch.Tensor:
    """``x [M, K]`` (fp16/bf16/fp32) -> ``[M, N]`` in x's dtype. ``qweight [N, K / codes per byte]``
    with contiguous rows; ``scales`` ``[N]`` (8-bit) or ``[N, K / group]`` (4-bit), as ``zeros``."""
    m, k = x.shape
    n = qweight.shape[0]
    pack = 2 if fmt.four_bit else 1
    if k != pack * qweight.shape[1] or qweight.stride(1) != 1:
        raise ValueError(f"x has {k} features; qweight {tuple(qweight.shape)} holds {pack} code(s) a byte")
    if fmt.four_bit and (k % fmt.group or fmt.group < 16 or fmt.group & (fmt.group - 1)):
        raise ValueError(f"group {fmt.group} must be a power of two from 16 dividing {k} input features")
    x = x.contiguous()
    tiling = tiling or default_tiling(m, fmt)
    block_k = min(tiling.block_k, max(32, triton.next_power_of_2(k)))
    if m > 1 and fmt.four_bit:
        block_k = min(block_k, fmt.group)  # one scale per column and slice
    bm = 1 if m == 1 else block_m(m)
    n_tiles, m_tiles, iters = triton.cdiv(n, tiling.block_n), triton.cdiv(m, bm), triton.cdiv(k, block_k)
    split = tiling.split_k or split_k_for(n_tiles * m_tiles, iters, m, n, x.device)
    if split * m * n > WORKSPACE_FLOATS or n_tiles * m_tiles > TILE_COUNTERS:
        split = 1
    per_split = triton.cdiv(iters, split)
    split = triton.cdiv(iters, per_split)  # no split left without a slice
    even_k = k % block_k == 0 and iters % split == 0
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    workspace, counters = _scratch(x.device)
    zeros = scales if zeros is None else zeros
    codebook = scales if codebook is None else codebook
    meta_stride = scales.stride(0) if fmt.four_bit else 1
    if fmt.fp8:
        qweight = qweight.view(torch.uint8)
    common = dict(GROUP=max(fmt.group, 1), FOUR_BIT=fmt.four_bit, FP8=fmt.fp8, NF4=fmt.nf4, HAS_ZERO=fmt.has_zero,
                  SPLIT_K=split, BLOCK_N=tiling.block_n, BLOCK_K=block_k, EVEN_K=even_k, ITERS=per_split,
                  num_warps=tiling.num_warps, num_stages=tiling.num_stages)
    if m == 1:
        _gemv_kernel[(n_tiles, split)](
            x, qweight, scales, zeros, codebook, y, workspace, counters, n, k, qweight.stride(0), meta_stride,
            SUB=min(max(fmt.group, 1), block_k) if fmt.four_bit else block_k, **common)
    else:
        _gemm_kernel[(n_tiles, split, m_tiles)](
            x, qweight, scales, zeros, codebook, y, workspace, counters, m, n, k,
            x.stride(0), qweight.stride(0), meta_stride, y.stride(0), BLOCK_M=bm,
            PRECISION=dot_precision(x.dtype), **common)
    return y
