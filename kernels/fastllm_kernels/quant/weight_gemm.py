"""One split-K kernel family for every weight-only format: ``y = x W^T``, W dequantized in registers.

Decode streams each weight byte once, so the kernels are judged by weight bytes per second.
A 4096x4096 layer cut only along N gives ~128 programs for 132 SMs: too few loads in flight.
The grid is cut along K too (``SPLIT_K``); the splits meet again in the same launch
(``fastllm_kernels.split_k``: the last program of a tile to arrive adds the partials in order).

Formats (constexpr flags), weights ``q`` rows-first ``[N, K / codes per byte]``:

* int8 / fp8-e4m3: one code a byte, one scale per output channel applied after the K loop.
* int4: two codes a byte (``pack_int4``), ``(q - zero) * scale`` per group of K.
* nf4: two codes a byte, ``NF4[q] * absmax`` per block of K.
* dense: the 16-bit float weights themselves (no scale), so an unquantized layer at batch 1
  gets the same dependent launch: its first slice loads under the previous kernel.

``_gemv_kernel`` (one row of x) is the decode kernel: small programs read ``q`` as 32-bit
words and turn codes into floats with magic numbers (``dequant``), no integer-to-float
conversion, each code paired with its strided column of x, FMAs on the CUDA cores. nf4 codes
are looked up, two a load, in a shared-memory table (``nf4_pairs``) by programs of 2-4 warps.
``expert_gemv`` runs the same GEMV for a mixture-of-experts decode step: the (token, expert) pairs
along one more grid axis, each with its expert's W; the gate/up SiLU or the k pairs' weighted sum
in the epilogue.
``_gemm_kernel`` (2..64 rows) reads bytes through shared memory into the tensor cores' operand
layout and makes the codes x's dtype there (magic numbers in 16 bits, no I2F either).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from fastllm_kernels.device import compiled_nvidia, multiprocessors, resident_blocks
from fastllm_kernels.host_math import cdiv, next_power_of_2
from fastllm_kernels.pdl import pdl_launch, wait_for_inputs
from fastllm_kernels.quant.common import block_m, dot_precision
from fastllm_kernels.quant.dequant import MAGIC, code_value, columns, nf4_value, small_code_value
from fastllm_kernels.quant.nf4_pairs import fill_table, pair_values
from fastllm_kernels.split_k import TILE_COUNTERS, WORKSPACE_FLOATS, scratch, write_split_output


@dataclass(frozen=True)
class WeightFormat:
    """How ``q`` holds the codes and how the scales map onto K (``group`` 0: one scale per row)."""

    four_bit: bool
    fp8: bool = False
    nf4: bool = False
    dense: bool = False
    has_zero: bool = False
    group: int = 0


@triton.jit
def _gemv_units(q_rows, k0, K, CODES: tl.constexpr, EVEN_K: tl.constexpr, MASK_UNITS: tl.constexpr):
    """``[BLOCK_N, LANES * UNITS]`` units of the slice at ``k0`` (zeros past K), masked in runs of
    ``MASK_UNITS`` (a lane's units, where K ends on a lane's boundary: one vector load each)."""
    if EVEN_K:
        units = tl.load(q_rows + k0 // CODES)
    else:
        run = tl.arange(0, q_rows.shape[1]) // MASK_UNITS * MASK_UNITS
        units = tl.load(q_rows + k0 // CODES, mask=(k0 // CODES + run < K // CODES)[None, :], other=0)
    return units


@triton.jit
def _gemv_slice(acc, units, k0, x_ptr, x_run, s_ptr, z_ptr, book, rows, lane, K, stride_sn, magic,
                GROUP: tl.constexpr, BITS: tl.constexpr, FP8: tl.constexpr, NF4: tl.constexpr, NF4_TABLE: tl.constexpr,
                HAS_ZERO: tl.constexpr, UNITS: tl.constexpr, LANE_K: tl.constexpr, EVEN_K: tl.constexpr,
                DENSE: tl.constexpr):
    """``acc [BLOCK_N, LANES]`` plus the products of one slice of W (``units``, loaded) at ``k0``."""
    CODES: tl.constexpr = 1 if FP8 or DENSE else 32 // BITS
    tile = tl.reshape(units, (units.shape[0], units.shape[1] // UNITS, UNITS))
    if DENSE:
        by_unit = columns(tile.to(tl.float32), UNITS)
    elif FP8:
        by_unit = columns(tile.to(tl.float8e4nv, bitcast=True).to(tl.float32), UNITS)
    elif BITS == 8:
        by_unit = columns(tile.to(tl.uint32, bitcast=True) ^ 0x80808080, UNITS)
    else:
        by_unit = columns(tile.to(tl.uint32, bitcast=True), UNITS)
    if BITS == 4:
        part = tl.zeros(acc.shape, dtype=tl.float32)
    else:
        part = acc  # 8-bit: one chain over the whole K range, scaled at the end
    x_sum = tl.zeros((acc.shape[1],), dtype=tl.float32)
    for run in tl.static_range(LANE_K // 8):
        if EVEN_K:
            x = tl.load(x_ptr + k0 + run * 8 + x_run)
        else:
            x = tl.load(x_ptr + k0 + run * 8 + x_run, mask=k0 + run * 8 + x_run < K, other=0.0)
        xs = columns(x.to(tl.float32), 8)
        if NF4_TABLE:  # a run is one word
            pairs = pair_values(by_unit[run], book)
        for e in tl.static_range(8):
            if FP8 or DENSE:
                value = by_unit[run * 8 + e]
            elif NF4_TABLE:
                value = pairs[e]
            elif NF4:
                value = nf4_value(book, by_unit[(run * 8 + e) // CODES], (run * 8 + e) % CODES)
            else:
                value = code_value(by_unit[(run * 8 + e) // CODES], (run * 8 + e) % CODES, BITS, magic)
            part += value * xs[e][None, :]
            if HAS_ZERO:
                x_sum += xs[e]
    if BITS == 4:
        group = tl.minimum(k0 + lane * LANE_K, K - 1) // GROUP  # lanes past K read x = 0
        meta = rows[:, None] * stride_sn + group[None, :]
        if HAS_ZERO:
            part -= tl.load(z_ptr + meta).to(tl.float32) * x_sum[None, :]
        acc += part * tl.load(s_ptr + meta).to(tl.float32)
    else:
        acc = part
    return acc


@triton.jit
def _gemv_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, code_ptr, y_ptr, ws_ptr, lock_ptr, ids_ptr, route_ptr, addend_ptr, M, N, K, stride_qn,
    stride_sn, stride_qe, stride_se, stride_xr, stride_ym, magic,
    ITERS: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr, FP8: tl.constexpr, NF4: tl.constexpr,
    NF4_TABLE: tl.constexpr, HAS_ZERO: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, UNITS: tl.constexpr, EVEN_K: tl.constexpr, MASK_UNITS: tl.constexpr, PREFETCH: tl.constexpr,
    PRELOAD: tl.constexpr, DENSE: tl.constexpr, PDL: tl.constexpr, EXPERTS: tl.constexpr, IDS_READY: tl.constexpr,
    ROWS_PER_X: tl.constexpr, SUM_PAIRS: tl.constexpr, WEIGHTED: tl.constexpr, GATED: tl.constexpr,
    HAS_ADDEND: tl.constexpr,
):
    """``x [1, K]``: a program owns ``BLOCK_N`` rows of W and ``ITERS`` slices of ``BLOCK_K``
    inputs. Lane ``l`` reads units ``[l * UNITS, (l + 1) * UNITS)`` of every row (one 16-byte
    load a row) and the x they pair with as 16-byte runs, one ``[LANES, 8]`` load a run; with
    several warps the lanes run on through them along K. Both tiles have one contiguous dim and
    one other, so Triton (3.6 to 3.9) lays them out the same way (lanes along the lane dim, the
    rest in registers): no shuffles, no shared memory but the nf4 pair table (``NF4_TABLE``).
    Code ``p`` of unit ``u`` meets x column ``u * CODES + p`` of the lane's runs. Each lane and
    row sums its products in one FMA chain; 4-bit sums (one scale group: ``UNITS`` words at most a
    group) are scaled every slice, the zero point as ``z * sum(x)``; 8-bit ones at the end.
    Launched dependent (``PDL``), the first slice of W is on its way before the previous kernel
    ends; with ``PRELOAD`` (``ITERS`` <= 4) every slice of the program's share is, and after the
    wait only x's loads and the math are left.

    ``EXPERTS`` (mixture-of-experts decode, one launch for a few (token, expert) pairs): grid axis 2
    is the pair, W ``[E, N, K]`` its expert's (``ids``), x its token's row (``ROWS_PER_X`` pairs a
    row: k) or its own. ``IDS_READY``: the ids and routing weights were written two launches back or
    earlier, so the expert, the first slice of its W and the pair's weight load before the wait, as a
    dense layer's W does (8-bit rows' scales load there too, not after the sums). Output row:
    the pair's, or with ``SUM_PAIRS`` (k) its token's, the k pairs' partials (times their routing
    weights: ``WEIGHTED``) summed in slot order like K splits. ``GATED`` (no K split): W holds N
    gate rows, then N up rows; a program takes ``BLOCK_N / 2`` of each and stores ``silu(gate) * up``.
    ``HAS_ADDEND``: ``addend`` (laid out as y) joins each output row's float32 sum."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pair = tl.program_id(2)
    WAIT_FIRST: tl.constexpr = EXPERTS and not IDS_READY
    if WAIT_FIRST:
        wait_for_inputs(PDL)
    if EXPERTS:
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        q_ptr += expert * stride_qe
        s_ptr += expert * stride_se
        z_ptr += expert * stride_se
        x_ptr += (pair // ROWS_PER_X).to(tl.int64) * stride_xr
    CODES: tl.constexpr = 1 if FP8 or DENSE else 32 // BITS
    LANE_K: tl.constexpr = UNITS * CODES  # inputs of one lane and row per slice
    LANES: tl.constexpr = BLOCK_K // LANE_K
    if GATED:  # rows j < BLOCK_N / 2: gate rows; the rest the up rows of the same columns
        cols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N) % (BLOCK_N // 2)
        rows = tl.minimum(cols, N - 1).to(tl.int64) + (tl.arange(0, BLOCK_N) >= BLOCK_N // 2) * N
    else:
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = tl.minimum(cols, N - 1).to(tl.int64)  # rows past N read row N - 1: loads need no mask
    lane = tl.arange(0, LANES)
    q_rows = q_ptr + rows[:, None] * stride_qn + tl.arange(0, LANES * UNITS)[None, :]
    x_run = lane[:, None] * LANE_K + tl.arange(0, 8)[None, :]
    acc = tl.zeros((BLOCK_N, LANES), dtype=tl.float32)
    first = pid_k * ITERS * BLOCK_K
    units = _gemv_units(q_rows, first, K, CODES, EVEN_K, MASK_UNITS)
    units1 = _gemv_units(q_rows, first + BLOCK_K, K, CODES, EVEN_K, MASK_UNITS) if PRELOAD and ITERS > 1 else units
    units2 = _gemv_units(q_rows, first + 2 * BLOCK_K, K, CODES, EVEN_K, MASK_UNITS) if PRELOAD and ITERS > 2 else units
    units3 = _gemv_units(q_rows, first + 3 * BLOCK_K, K, CODES, EVEN_K, MASK_UNITS) if PRELOAD and ITERS > 3 else units
    if NF4_TABLE:  # under the first slice's loads
        book = fill_table(pid_n, acc)
    else:
        book = tl.load(code_ptr + tl.arange(0, 16)) if NF4 else None
    # the epilogue's factors: the rows' scales (constant) and the pair's routing weight (ready with its id)
    scale = tl.load(s_ptr + rows).to(tl.float32) if BITS == 8 and not DENSE else None
    route = tl.load(route_ptr + pair).to(tl.float32) if WEIGHTED else None
    if not WAIT_FIRST:
        wait_for_inputs(PDL)  # the first slice of W needed no wait; x does
    if PRELOAD:
        for i in tl.static_range(ITERS):
            share = units if i == 0 else units1 if i == 1 else units2 if i == 2 else units3
            acc = _gemv_slice(acc, share, first + i * BLOCK_K, x_ptr, x_run, s_ptr, z_ptr, book, rows,
                              lane, K, stride_sn, magic, GROUP, BITS, FP8, NF4, NF4_TABLE, HAS_ZERO, UNITS, LANE_K,
                              EVEN_K, DENSE)
    elif PREFETCH:  # each slice's loads go out before the previous slice's math
        for i in range(ITERS):
            ahead = (pid_k * ITERS + tl.minimum(i + 1, ITERS - 1)) * BLOCK_K  # the last slice reloads itself
            next_units = _gemv_units(q_rows, ahead, K, CODES, EVEN_K, MASK_UNITS)
            acc = _gemv_slice(acc, units, (pid_k * ITERS + i) * BLOCK_K, x_ptr, x_run, s_ptr, z_ptr, book, rows,
                              lane, K, stride_sn, magic, GROUP, BITS, FP8, NF4, NF4_TABLE, HAS_ZERO, UNITS, LANE_K,
                              EVEN_K, DENSE)
            units = next_units
    else:
        acc = _gemv_slice(acc, units, first, x_ptr, x_run, s_ptr, z_ptr, book, rows,
                          lane, K, stride_sn, magic, GROUP, BITS, FP8, NF4, NF4_TABLE, HAS_ZERO, UNITS, LANE_K,
                          EVEN_K, DENSE)
        for i in range(1, ITERS):
            k0 = (pid_k * ITERS + i) * BLOCK_K
            units = _gemv_units(q_rows, k0, K, CODES, EVEN_K, MASK_UNITS)
            acc = _gemv_slice(acc, units, k0, x_ptr, x_run, s_ptr, z_ptr, book, rows,
                              lane, K, stride_sn, magic, GROUP, BITS, FP8, NF4, NF4_TABLE, HAS_ZERO, UNITS, LANE_K,
                              EVEN_K, DENSE)
    out = tl.sum(acc, axis=1)
    if BITS == 8 and not DENSE:
        out *= scale
    if WEIGHTED:
        out *= route
    if GATED:
        gate, up = tl.split(tl.permute(tl.reshape(out, (2, BLOCK_N // 2)), (1, 0)))
        out = gate / (1.0 + tl.exp(-gate)) * up
        cols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    row = pair // SUM_PAIRS
    write_split_output(out[None, :], row + tl.arange(0, 1), cols, M, N, y_ptr, stride_ym, ws_ptr, lock_ptr,
                       row * tl.num_programs(0) + pid_n, pair % SUM_PAIRS * SPLIT_K + pid_k, SUM_PAIRS * SPLIT_K,
                       addend_ptr, HAS_ADDEND)


@triton.jit(do_not_specialize=["M"])  # the step's row count: one variant whatever it is, none compiled mid-run
def _gemm_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, code_ptr, y_ptr, ws_ptr, lock_ptr, M, N, K,
    stride_xm, stride_qn, stride_sn, stride_ym,
    ITERS: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr, FP8: tl.constexpr, NF4: tl.constexpr,
    HAS_ZERO: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr, DENSE: tl.constexpr, PDL: tl.constexpr,
):
    """``x [M, K]``, M > 1: tiles of small exact weight values in x's dtype go through the tensor
    cores; a 4-bit slice (``BLOCK_K`` divides the group) has one scale per column, applied to
    the slice's partial product (groups narrower than a slice: each weight). Bytes, not words: a byte's two codes are adjacent in K, so
    Triton loads the packed tile from shared memory straight into the dot-operand layout and
    every step after the load runs there, in registers (SASS: no second trip through shared
    memory, which 8 codes a word would force)."""
    wait_for_inputs(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    PACK: tl.constexpr = 2 if BITS == 4 else 1
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < N
    ks = tl.arange(0, BLOCK_K)
    kb = tl.arange(0, BLOCK_K // PACK)
    x_rows = x_ptr + rows[:, None] * stride_xm
    q_rows = q_ptr + cols[:, None].to(tl.int64) * stride_qn
    meta_rows = cols.to(tl.int64) * stride_sn
    if NF4:
        book = tl.load(code_ptr + tl.arange(0, 16))
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
        if FP8:
            w = packed.to(tl.float8e4nv, bitcast=True).to(x.dtype)
        elif BITS == 8 or DENSE:
            w = packed.to(x.dtype)  # Triton widens int8 with byte permutes and a magic number, no I2F
        else:
            codes = tl.reshape(tl.join(packed & 0xF, packed >> 4), (BLOCK_N, BLOCK_K))
            if NF4:
                w = tl.reshape(tl.gather(book, tl.reshape(codes, (BLOCK_N * BLOCK_K,)).to(tl.int32), 0),
                               (BLOCK_N, BLOCK_K)).to(x.dtype)
            else:
                w = small_code_value(codes, x.dtype)
        if BITS == 4 and GROUP < BLOCK_K:  # several groups a slice: scale the weights themselves
            meta = meta_rows[:, None] + (tl.minimum(k0 + ks, K - 1) // GROUP)[None, :]
            if HAS_ZERO:
                w -= tl.load(z_ptr + meta, mask=col_in[:, None], other=0.0).to(x.dtype)
            scale = tl.load(s_ptr + meta, mask=col_in[:, None], other=0.0).to(tl.float32)
            acc += tl.dot(x, tl.trans((w.to(tl.float32) * scale).to(x.dtype)), input_precision=PRECISION)
        elif BITS == 4:
            group = tl.minimum(k0, K - 1) // GROUP  # a slice past K (uneven splits) reads x = 0
            if HAS_ZERO:
                w -= tl.load(z_ptr + meta_rows + group, mask=col_in, other=0.0).to(x.dtype)[:, None]
            scale = tl.load(s_ptr + meta_rows + group, mask=col_in, other=0.0).to(tl.float32)
            acc += tl.dot(x, tl.trans(w), input_precision=PRECISION) * scale[None, :]
        else:
            acc += tl.dot(x, tl.trans(w), input_precision=PRECISION)
    if BITS == 8 and not DENSE:
        acc *= tl.load(s_ptr + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
    tile = pid_m * tl.num_programs(0) + pid_n
    write_split_output(acc, rows, cols, M, N, y_ptr, stride_ym, ws_ptr, lock_ptr, tile, pid_k, SPLIT_K)


# ---- launch -----------------------------------------------------------------------------------
MIN_DOT_K = 32
"""The tensor-core kernel's narrowest K slice: on the H100 (Triton 3.6), 16-wide fp16 slices of
4-bit codes made wrong products; groups of 16 are scaled in the weights (two groups a slice)."""
SMALL_FP8_LAYER = 16 << 20  # e4m3 bytes below which a one-row GEMV takes two-warp programs
PROGRAMS_PER_SM = {1: 12, 4: 4}  # by num_warps: resident programs that keep enough loads in flight
PRELOAD_SLICES, PRELOAD_BYTES = 4, 384
"""A one-row program of 8-bit codes whose share of W is at most this many slices and bytes a thread
loads all of it before the wait (``PRELOAD``), under the previous kernel; the two-warp e4m3 tile's three
slices compile for sm_90 without spills. 4-bit codes and 16-bit weights widen into many more registers
and keep their one slice ahead; so do the routed experts (``pairs`` > 1), whose thousands of programs
are never all resident: more registers a program left fewer loads in flight. Register counts and
timings: ``benchmarks/RESULTS.md``."""


@dataclass(frozen=True)
class Tiling:
    """Launch settings of one call; ``split_k`` None: enough programs for ``PROGRAMS_PER_SM``.
    ``num_stages`` pipelines the tensor-core kernel's loads through shared memory; in the one-row
    kernel, above 1, each slice's loads go out before the previous slice's math (in registers)."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int | None = None


def uses_pair_table(fmt: WeightFormat, x_dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the one-row kernel looks nf4 codes up two at a time in the float16 pair table
    (``nf4_pairs``): 16-bit activations on an NVIDIA GPU; float32 ones keep the exact code book."""
    return fmt.nf4 and x_dtype != torch.float32 and compiled_nvidia(device)


def default_tiling(m: int, n: int, k: int, fmt: WeightFormat, x_dtype: torch.dtype, device: torch.device) -> Tiling:
    """One row: one-warp programs of 4 rows, 16 bytes of every row a lane and slice; int4
    loads the next slice ahead (chosen by ``benchmarks/quant_gemm.py --sweep``). Dense 16-bit
    weights: programs of 8 rows, 32 bytes of every row a lane and slice, none ahead (the sweep's
    best on every attention, MLP and LM-head shape of Llama-3-8B, Qwen3-30B-A3B and
    ERNIE-4.5-21B-A3B, or within 1% of it). e4m3 layers under 16 MiB (the attention and shared
    experts of the MoE models): two-warp programs of 8 rows, 16 bytes of every row a lane and
    slice, twice the bytes in flight a program; larger ones (Llama-3-8B's) keep one-warp programs
    of 4 rows. nf4 with the
    pair table (K of 2048 or more): programs of 2-4 warps share one table, their lanes spread
    along K (a slice of 1024 inputs a warp), 8 rows, the next slice loaded ahead (chosen by
    timing whole decodes: one-layer timings did not predict them). More rows: 32 columns, one
    K slice within a 4-bit group for the tensor cores. Figures: ``benchmarks/RESULTS.md``."""
    if m == 1:
        if k >= 2048 and uses_pair_table(fmt, x_dtype, device):
            warps = min(4, next_power_of_2(k) // 1024)
            return Tiling(8, 1024 * warps, num_warps=warps, num_stages=2)
        if fmt.dense:
            return Tiling(8, 512, num_warps=1, num_stages=1)
        if fmt.fp8 and n * k < SMALL_FP8_LAYER:
            return Tiling(8, 1024, num_warps=2, num_stages=1)
        ahead = fmt.four_bit and not fmt.nf4
        return Tiling(4, 1024 if fmt.four_bit else 512, num_warps=1, num_stages=2 if ahead else 1)
    return Tiling(32, min(fmt.group, 128) if fmt.four_bit else 128, num_stages=4)


def lane_units(fmt: WeightFormat) -> int:
    """Units (32-bit words, or e4m3 bytes) a GEMV lane reads per row and slice: 16 bytes, or one
    4-bit group of 16 codes (a lane's sum has one scale)."""
    if fmt.fp8:
        return 16
    if fmt.dense:
        return 8
    return min(4, fmt.group // 8) if fmt.four_bit else 4


def split_k_for(tiles: int, iters: int, m: int, n: int, num_warps: int, device: torch.device) -> int:
    """Splits of K that bring ``tiles`` programs up to ``PROGRAMS_PER_SM`` per SM (one-warp GEMV
    programs hold 70-130 registers a thread: 16 or more fit an SM). GEMV programs of several warps
    (the nf4 pair table) split only while every split still fills the SMs: a split that leaves
    most places empty costs its epilogue and buys no more loads in flight."""
    num_sms = multiprocessors(device) if device.type == "cuda" else 4
    programs = PROGRAMS_PER_SM.get(num_warps, 4) * num_sms
    wanted = programs // tiles if m == 1 and num_warps > 1 else cdiv(programs, tiles)
    return max(min(wanted, iters, WORKSPACE_FLOATS // (m * n)), 1)


@dataclass(frozen=True)
class Launch:
    """One call's kernel, grid and compile-time arguments: what ``weight_gemm`` runs and what an
    offline compile (``benchmarks/quant_gemm_sass.py``) inspects."""

    kernel: triton.runtime.JITFunction
    grid: tuple[int, ...]
    constexprs: dict[str, int | bool | str]


@functools.lru_cache(maxsize=4096)
def plan(m: int, n: int, k: int, fmt: WeightFormat, tiling: Tiling | None, x_dtype: torch.dtype,
         device: torch.device, pairs: int = 1, whole_k: bool = False) -> Launch:
    """Slice sizes, K splits and grid of ``[m, k] x [n, k]^T`` in ``fmt`` (cached: a decode step
    asks for the same few shapes over and over); ``pairs`` > 1 (one row): that many such products
    in one launch (``expert_gemv``), split as one layer of ``pairs * n`` rows; ``whole_k``: no K
    split."""
    tiling = tiling or default_tiling(m, n, k, fmt, x_dtype, device)
    if m == 1:
        lane_k = lane_units(fmt) * (1 if fmt.fp8 or fmt.dense else 8 if fmt.four_bit else 4)
        block_k = max(lane_k, min(tiling.block_k, next_power_of_2(k)))
    else:
        block_k = min(tiling.block_k, max(MIN_DOT_K, next_power_of_2(k)))
        if fmt.four_bit:  # one scale per column and slice where the group allows
            block_k = min(block_k, fmt.group)
        block_k = max(block_k, MIN_DOT_K)
    bm = 1 if m == 1 else block_m(m)
    n_tiles, m_tiles, iters = cdiv(n, tiling.block_n), cdiv(m, bm), cdiv(k, block_k)
    split = 1 if whole_k else tiling.split_k or split_k_for(n_tiles * m_tiles * pairs, iters, m, n,
                                                            tiling.num_warps, device)
    if split * m * n * pairs > WORKSPACE_FLOATS or n_tiles * m_tiles * pairs > TILE_COUNTERS:
        split = 1
    per_split = cdiv(iters, split)
    split = cdiv(iters, per_split)  # no split left without a slice
    constexprs = dict(GROUP=max(fmt.group, 1), BITS=4 if fmt.four_bit else 8, FP8=fmt.fp8, NF4=fmt.nf4,
                      DENSE=fmt.dense, HAS_ZERO=fmt.has_zero, SPLIT_K=split, BLOCK_N=tiling.block_n, BLOCK_K=block_k,
                      EVEN_K=k % block_k == 0 and iters % split == 0, ITERS=per_split,
                      num_warps=tiling.num_warps, num_stages=tiling.num_stages, **pdl_launch(device))
    if m == 1:
        share = tiling.block_n * block_k // (32 * tiling.num_warps) * per_split  # bytes a thread, 8-bit codes
        eight_bit = not (fmt.four_bit or fmt.dense)
        preload = eight_bit and pairs == 1 and 1 < per_split <= PRELOAD_SLICES and share <= PRELOAD_BYTES
        prefetch = not preload and tiling.num_stages > 1 and per_split > 1
        # one warp a program: the 32 KiB table would leave too few programs an SM
        table = tiling.num_warps > 1 and uses_pair_table(fmt, x_dtype, device)
        units = lane_units(fmt)
        mask_units = units if k % lane_k == 0 else 1  # whole lanes past K: their words need no mask of their own
        return Launch(_gemv_kernel, (n_tiles, split, pairs), dict(
            constexprs, UNITS=units, MASK_UNITS=mask_units, PREFETCH=prefetch, PRELOAD=preload, NF4_TABLE=table,
            EXPERTS=False, IDS_READY=False, ROWS_PER_X=1, SUM_PAIRS=1, WEIGHTED=False, GATED=False, HAS_ADDEND=False))
    return Launch(_gemm_kernel, (n_tiles, split, m_tiles),
                  dict(constexprs, BLOCK_M=bm, PRECISION=dot_precision(x_dtype)))


def weight_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                codebook: torch.Tensor | None, fmt: WeightFormat, tiling: Tiling | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x [M, K]`` (fp16/bf16/fp32) -> ``[M, N]`` in ``out_dtype`` (default x's dtype; the sums are
    float32 whatever it is). ``qweight [N, K / codes per byte]``
    with contiguous rows, K a multiple of 8 (4-bit) or 4 (int8: whole 32-bit words); ``scales``
    ``[N]`` (8-bit) or ``[N, K / group]`` (4-bit), as ``zeros``; dense: ``qweight`` holds the
    float weights, ``scales`` is None."""
    m, k = x.shape
    n = qweight.shape[0]
    pack = 2 if fmt.four_bit else 1
    if k != pack * qweight.shape[1] or qweight.stride(1) != 1:
        raise ValueError(f"x has {k} features; qweight {tuple(qweight.shape)} holds {pack} code(s) a byte")
    if fmt.four_bit and (k % fmt.group or fmt.group < 16 or fmt.group & (fmt.group - 1)):
        raise ValueError(f"group {fmt.group} must be a power of two from 16 dividing {k} input features")
    if not (fmt.fp8 or fmt.dense) and k % (8 if fmt.four_bit else 4):
        raise ValueError(f"{k} input features do not fill whole 32-bit words")
    x = x.contiguous()
    launch = plan(m, n, k, fmt, tiling, x.dtype, x.device)
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    workspace, counters = scratch(x.device)
    scales = qweight if scales is None else scales
    zeros = scales if zeros is None else zeros
    codebook = scales if codebook is None else codebook
    meta_stride = scales.stride(0) if fmt.four_bit else 1
    if fmt.fp8:
        qweight = qweight.view(torch.uint8)
    if m == 1:
        words = qweight if fmt.fp8 or fmt.dense else qweight.view(torch.int32)  # the GEMV reads 32-bit words
        launch.kernel[launch.grid](x, words, scales, zeros, codebook, y, workspace, counters, y, y, y, 1, n, k,
                                   words.stride(0), meta_stride, 0, 0, 0, 0, MAGIC, **launch.constexprs)
    else:
        launch.kernel[launch.grid](x, qweight, scales, zeros, codebook, y, workspace, counters, m, n, k,
                                   x.stride(0), qweight.stride(0), meta_stride, y.stride(0), **launch.constexprs)
    return y


EXPERT_TILING = Tiling(4, 512, num_warps=1, num_stages=1)
"""``expert_gemv``'s tile for e4m3 and 16-bit experts: one-warp programs of 4 rows (of the MoE
models' routed experts at batch 1, the L2-cold layer bench's best or within 2% of it) where one wave
of them covers the launch."""
WIDE_EXPERT_TILING = Tiling(16, 512, num_warps=4, num_stages=1)
"""The same share a warp in four-warp programs: for a launch of more one-warp programs than the SMs
hold at once (``device.resident_blocks`` each), whose last programs would run as a second, thin wave
(ERNIE-4.5-21B-A3B's gate/up at batch 1: 4608 programs for 4224 places on an H100's or H200's 132 SMs)."""
FOUR_BIT_EXPERT_TILING = Tiling(4, 1024, num_warps=1, num_stages=2)
"""4-bit experts: the one-row tile of int4 layers (the next slice loaded ahead); one warp, so nf4
looks its codes up in the given book, not the pair table of the NF4 constants."""


def expert_tiling(fmt: WeightFormat, device: torch.device, rows: int) -> Tiling:
    """``expert_gemv``'s default tile for ``rows`` output rows over all pairs; off an NVIDIA GPU (the
    interpreter runs the programs one after another) programs of 32 rows: eight times fewer, the
    same sums."""
    if not compiled_nvidia(device):
        return replace(FOUR_BIT_EXPERT_TILING if fmt.four_bit else EXPERT_TILING, block_n=32)
    if fmt.four_bit:
        return FOUR_BIT_EXPERT_TILING
    one_wave = resident_blocks(device) * multiprocessors(device)
    return WIDE_EXPERT_TILING if cdiv(rows, EXPERT_TILING.block_n) > one_wave else EXPERT_TILING


def expert_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor | None, zeros: torch.Tensor | None,
                codebook: torch.Tensor | None, fmt: WeightFormat, ids: torch.Tensor, *, rows_per_x: int = 1,
                route_weights: torch.Tensor | None = None, sum_pairs: int = 1, gated: bool = False,
                ids_ready: bool = False, out_dtype: torch.dtype | None = None, addend: torch.Tensor | None = None,
                tiling: Tiling | None = None) -> torch.Tensor:
    """The one-row GEMV for each (token, expert) pair ``p`` of ``ids [P]`` in one launch:
    ``y[p] = x[p // rows_per_x] @ W[ids[p]]^T``, ``qweight [E, N, K / codes a byte]`` and its
    ``scales`` / ``zeros`` (``[E, N]`` or ``[E, N, K / group]``) laid out per expert as
    ``weight_gemm``'s. ``gated``: W's rows are N / 2 gate rows, then as many up rows, and ``y [P,
    N / 2]`` is ``silu(gate) * up``. ``route_weights [P]`` scale each pair's row; ``sum_pairs`` (k):
    ``y [P / k, N]``, each token's k rows summed in the launch. ``ids_ready``: the ids and ``route_weights`` were
    not written by the launch just before (see ``_gemv_kernel``). ``addend`` (y's shape, contiguous) is
    added to y in the launch."""
    pairs, k = ids.numel(), x.shape[1]
    pack = 2 if fmt.four_bit else 1
    n = qweight.shape[1] // (2 if gated else 1)
    if qweight.shape[2] * pack != k or qweight.stride(2) != 1 or x.stride(1) != 1 or (fmt.four_bit and k % 8):
        raise ValueError(f"expert GEMV: weights {tuple(qweight.shape)} ({fmt}) for x {tuple(x.shape)}")
    tiling = tiling or expert_tiling(fmt, x.device, pairs * qweight.shape[1])
    # gated: a program's rows are half gate, half up rows, and the silu needs both sums whole
    launch = plan(1, qweight.shape[1], k, fmt, tiling, x.dtype, x.device, pairs, whole_k=gated)
    y = torch.empty((pairs // sum_pairs, n), dtype=out_dtype or x.dtype, device=x.device)
    if addend is not None and (addend.shape != y.shape or not addend.is_contiguous()):
        raise ValueError(f"addend {tuple(addend.shape)} (contiguous: {addend.is_contiguous()}) does not fit "
                         f"the output {tuple(y.shape)}")
    workspace, counters = scratch(x.device)
    words = qweight.view(torch.uint8) if fmt.fp8 else qweight.view(torch.int32) if fmt.four_bit else qweight
    scales = words if scales is None else scales
    constexprs = dict(launch.constexprs, EXPERTS=True, IDS_READY=ids_ready, ROWS_PER_X=rows_per_x,
                      SUM_PAIRS=sum_pairs, WEIGHTED=route_weights is not None, GATED=gated,
                      HAS_ADDEND=addend is not None)
    launch.kernel[launch.grid](x, words, scales, scales if zeros is None else zeros,
                               scales if codebook is None else codebook, y, workspace, counters, ids,
                               y if route_weights is None else route_weights, y if addend is None else addend,
                               y.shape[0], n, k, words.stride(1),
                               scales.stride(1) if fmt.four_bit else 1, words.stride(0),
                               0 if scales is words else scales.stride(0), x.stride(0), y.stride(0), MAGIC,
                               **constexprs)
    return y
