"""Mixture-of-experts feed-forward: every token through its top-k experts' SwiGLU, weighted and summed.

The (token, slot) pairs are grouped by expert and each expert's run is padded to the tile
height (``moe_align_block_size``), so a tile of rows never straddles two experts. Then two
grouped GEMM launches: gate and up in one (the SiLU-and-mul applied to the accumulators, so
the ``[pairs, 2I]`` projection is never stored), and down, scaled by the pair's routing
weight. Each program reads only its expert's weights: at decode only the routed experts' bytes
move. The k rows of a token are summed by one reduction, in a fixed order (deterministic,
unlike atomic adds into a zeroed fp32 buffer, which would also cost two more passes). At decode
(one pair a block) the down GEMM sums them itself: the k programs of a token's column tile park
their rows, and the last to arrive adds them in slot order (``fastllm_kernels.split_k``),
so no reduction launch follows; or it leaves them to the consumer (``pair_rows``: the next
RMSNorm adds them with the residual), which spares the arrival too.

Grids are fixed by shapes alone (no host sync), so a decode step replays inside a CUDA graph;
tiles past the padded pairs exit at once. Quantized experts (e4m3, or 4-bit int4 / nf4 codes with
group scales) are widened a tile at a time in registers, so decode reads their packed bytes alone.
At one pair a block (batch-1 decode) with e4m3, 4-bit or float experts, the two products run on
the one-row GEMV instead (``expert_gemv``: ``_experts_by_gemv``): a weight stream wants small programs
and many loads in flight, not tensor-core tiles whose rows are padding.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from fastllm_kernels.host_math import cdiv, next_power_of_2
from fastllm_kernels.moe_align import ExpertBlocks, moe_align_block_size, one_pair_a_block, one_pair_blocks
from fastllm_kernels.pdl import pdl_launch, wait_for_inputs
from fastllm_kernels.quant.common import dot_precision
from fastllm_kernels.quant.weight_gemm import WeightFormat, expert_gemv
from fastllm_kernels.split_k import TILE_COUNTERS, WORKSPACE_FLOATS, scratch, write_split_output

EXPERT_GEMV_ENV = "FASTLLM_MOE_GEMV"
"""Set to 0: one pair a block runs the grouped GEMMs, not the one-row GEMV (``expert_gemv``)."""


@dataclass(frozen=True)
class MoeTiling:
    """One grouped GEMM's tile: ``block_m`` pairs (the alignment unit) by ``block_n`` output
    columns (gate and up each, in the gated GEMM) by ``block_k`` inputs a step. ``interleave``
    (gated): gate and up rows in one operand, one dot of twice the columns."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 1
    num_warps: int = 4
    num_stages: int = 3
    interleave: bool = False


ONE_PAIR_TILES = MoeTiling(16, 32, 128), MoeTiling(16, 64, 128)
"""(gate/up, down) at one pair a block (batch-1 decode), in 2-byte K steps (``default_tilings``
scales them). Each program streams its expert's tile from HBM (a decode step's experts are not in
L2) in a short K loop: gate/up 16 steps of 16 KB at Qwen3-30B-A3B (8 in e4m3), down 6 (3), with
``num_stages - 1`` of them in flight. Three stages beat four to eight, split K, 8 warps, down
programs summing several pairs and L2 prefetches on both MoE models in bf16 and e4m3 in the L2-cold
H100 sweep (``bench_fused_moe.py --cold``; benchmarks/RESULTS.md)."""


def default_tilings(num_pairs: int, num_experts: int, element_size: int = 2,
                    weight_size: int = 2) -> tuple[MoeTiling, MoeTiling]:
    """(gate-up, down) tiles by pairs an expert gets on average, from the H100 sweeps of
    ``bench_fused_moe.py`` (bf16). One pair a block: ``ONE_PAIR_TILES``. A few (small batches):
    the product is a weight stream, so thin tiles give many programs. Many (prefill): wide
    tensor-core tiles, grouped along M so an expert's weight tile serves its row blocks from L2,
    gate and up rows in one operand (the sweep's figures: benchmarks/RESULTS.md).
    float32 halves the K step (shared memory); one-byte (fp8) weights double it in decode tiles,
    keeping the bytes a step loads."""
    per_expert = num_pairs / num_experts
    if one_pair_a_block(num_pairs, num_experts):
        tiles = ONE_PAIR_TILES
    elif per_expert <= 4:
        tiles = MoeTiling(16, 32, 128), MoeTiling(16, 64, 128)
    elif per_expert <= 12:
        tiles = MoeTiling(16, 64, 128, num_stages=4), MoeTiling(16, 64, 128, num_stages=4)
    elif per_expert <= 32:  # 16-row blocks would split many experts in two, each block streaming their weights
        tiles = MoeTiling(32, 64, 128), MoeTiling(32, 64, 128, num_stages=5)
    elif per_expert <= 128:
        tiles = MoeTiling(64, 128, 64, group_m=8), MoeTiling(64, 64, 64, group_m=8)
    else:
        tiles = (MoeTiling(128, 128, 64, group_m=8, num_warps=8, num_stages=3, interleave=True),
                 MoeTiling(128, 256, 64, group_m=8, num_warps=8, num_stages=3))
    if element_size > 2:
        tiles = tuple(replace(tile, block_k=tile.block_k // 2) for tile in tiles)
    elif weight_size == 1 and per_expert <= 32:
        tiles = tuple(replace(tile, block_k=tile.block_k * 2) for tile in tiles)
    return tiles


# ---- grouped GEMMs ----------------------------------------------------------------------------
@triton.jit
def _weight_tile(w_rows, s_rows, z_rows, book_ptr, k0, K, FP8: tl.constexpr, FOUR_BIT: tl.constexpr,
                 HAS_ZERO: tl.constexpr, GROUP: tl.constexpr, SUB: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, dtype: tl.constexpr):
    """``[BLOCK_N, BLOCK_K]`` expert weights from K step ``k0`` of rows ``w_rows`` in ``dtype``.
    ``FP8``: e4m3 bytes widened exactly (the caller scales each channel after the K loop).
    ``FOUR_BIT`` (K a multiple of BLOCK_K): bytes of two codes (even channel in the low nibble),
    ``(code - zero) * scale`` with ``HAS_ZERO`` (int4), ``book[code] * scale`` without (a code
    book: nf4), a scale (and zero) a ``GROUP`` of inputs at ``s_rows`` (``z_rows``); ``SUB`` =
    min(GROUP, BLOCK_K) inputs share one."""
    if FOUR_BIT:
        packed = tl.load(w_rows + k0 // 2 + tl.arange(0, BLOCK_K // 2)[None, :])
        codes = tl.reshape(tl.join(packed & 0xF, packed >> 4), (BLOCK_N, BLOCK_K))
        groups = (k0 + tl.arange(0, BLOCK_K // SUB) * SUB) // GROUP
        if HAS_ZERO:
            values = tl.reshape(codes.to(tl.float32), (BLOCK_N, BLOCK_K // SUB, SUB))
            values -= tl.load(z_rows + groups[None, :])[:, :, None]
        else:
            values = tl.reshape(tl.load(book_ptr + codes), (BLOCK_N, BLOCK_K // SUB, SUB))
        values *= tl.load(s_rows + groups[None, :])[:, :, None]
        w = tl.reshape(values, (BLOCK_N, BLOCK_K)).to(dtype)
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            w = tl.load(w_rows + ks[None, :])
        else:
            w = tl.load(w_rows + ks[None, :], mask=(ks < K)[None, :], other=0.0)
        if FP8:
            w = w.to(tl.float8e4nv, bitcast=True)
        w = w.to(dtype)
    return w


# the pair and block counts change with every step's token count: specialized on their divisibility
# by 16 (or on 1), they compiled new variants mid-run, each stalling a serving step for a second or more
@triton.jit(do_not_specialize=["num_pairs", "num_blocks"])
def _grouped_gemm_kernel(
    a_ptr, w_ptr, scale_ptr, zero_ptr, book_ptr, out_ptr, sorted_ptr, expert_ids_ptr, num_padded_ptr, topk_w_ptr,
    ws_ptr, lock_ptr, N, K, num_pairs, num_blocks, stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_om,
    up_rows, ROWS_PER_A: tl.constexpr, ONE_PAIR: tl.constexpr, GATED: tl.constexpr, WEIGHTED: tl.constexpr,
    SUM_PAIRS: tl.constexpr,
    FP8: tl.constexpr, FOUR_BIT: tl.constexpr, HAS_ZERO: tl.constexpr, GROUP: tl.constexpr, SUB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, INTERLEAVE: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    """``out[pair, cols] = a[pair // ROWS_PER_A] @ W[expert, cols]^T`` for one block of pairs.
    ``GATED``: a second accumulator over rows ``up_rows + cols`` and ``silu(gate) * up`` stored;
    ``WEIGHTED``: rows scaled by the pair's routing weight. Padding slots load no ``a`` row and
    store nothing; weight columns past N re-read column N - 1 (no mask on the weight stream).
    ``ONE_PAIR``: block ``p`` is pair ``p`` (row 0) and padding; with ``SUM_PAIRS`` (k) > 1 the
    output row is the pair's token, the sum of its k pairs. Quantized W (``_weight_tile``):
    ``FP8`` scales ``[E, rows]`` each output channel after the K loop; ``FOUR_BIT`` dequantizes
    each tile with its groups' scales ``[E, rows, K / GROUP]`` (and zeros) before the dot.
    ``INTERLEAVE`` (``GATED``): gate and up rows alternate in one weight operand, so one dot of
    twice the width fills one accumulator whose column pairs (gate, up) split in registers."""
    wait_for_inputs(PDL)
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * n_tiles
    first_m = pid // in_group * GROUP_M
    size_m = tl.minimum(num_blocks - first_m, GROUP_M)
    pid_m = first_m + pid % in_group % size_m
    pid_n = pid % in_group // size_m
    if ONE_PAIR:
        pairs = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_pairs).to(tl.int64)
    else:
        if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
            return
        pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    row_in = pairs < num_pairs
    a_rows = a_ptr + (tl.where(row_in, pairs, 0) // ROWS_PER_A)[:, None] * stride_am
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_cols = tl.minimum(cols, N - 1).to(tl.int64)
    W_ROWS: tl.constexpr = 2 * BLOCK_N if INTERLEAVE else BLOCK_N
    if INTERLEAVE:  # operand row 2j: the tile's gate column j, row 2j + 1: its up column
        operand_row = tl.arange(0, W_ROWS)
        w_cols = (tl.minimum(pid_n * BLOCK_N + operand_row // 2, N - 1) + operand_row % 2 * up_rows).to(tl.int64)
    w_rows = w_ptr + expert * stride_we + w_cols[:, None] * stride_wn
    s_rows = scale_ptr + expert * stride_se + w_cols[:, None] * stride_sn
    z_rows = zero_ptr + expert * stride_se + w_cols[:, None] * stride_sn
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, W_ROWS), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_rows + k0 + ks[None, :], mask=row_in[:, None], other=0.0)
        else:
            a = tl.load(a_rows + k0 + ks[None, :], mask=row_in[:, None] & (k0 + ks < K)[None, :], other=0.0)
        w = _weight_tile(w_rows, s_rows, z_rows, book_ptr, k0, K, FP8, FOUR_BIT, HAS_ZERO, GROUP, SUB, W_ROWS,
                         BLOCK_K, EVEN_K, a.dtype)
        acc = tl.dot(a, tl.trans(w), acc, input_precision=PRECISION)
        if GATED and not INTERLEAVE:
            up = _weight_tile(w_rows + up_rows * stride_wn, s_rows + up_rows * stride_sn,
                              z_rows + up_rows * stride_sn, book_ptr, k0, K, FP8, FOUR_BIT, HAS_ZERO, GROUP, SUB,
                              BLOCK_N, BLOCK_K, EVEN_K, a.dtype)
            acc_up = tl.dot(a, tl.trans(up), acc_up, input_precision=PRECISION)
    if FP8:
        scales = scale_ptr + expert * stride_se + w_cols
        acc *= tl.load(scales)[None, :]
        if GATED and not INTERLEAVE:
            acc_up *= tl.load(scales + up_rows)[None, :]
    if INTERLEAVE:
        acc, acc_up = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if WEIGHTED:
        acc *= tl.load(topk_w_ptr + pairs, mask=row_in, other=0.0).to(tl.float32)[:, None]
    if SUM_PAIRS > 1:  # rows past 0 have no routing weight: zero; the token's slot is this program's K split
        token = pid_m // SUM_PAIRS
        write_split_output(tl.sum(acc, 0)[None, :], token + tl.arange(0, 1), cols, num_pairs // SUM_PAIRS, N,
                           out_ptr, stride_om, ws_ptr, lock_ptr, token * n_tiles + pid_n, pid_m % SUM_PAIRS,
                           SUM_PAIRS)
    else:
        out_ptrs = out_ptr + pairs[:, None] * stride_om + cols[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_in[:, None] & (cols < N)[None, :])


def _weight_format(w: torch.Tensor, scale: torch.Tensor | None, zero: torch.Tensor | None,
                   book: torch.Tensor | None, block_k: int) -> tuple[torch.Tensor, int, int, dict]:
    """(the kernels' view of ``w [E, rows, K or K/2]``, K, the K step, the format's kernel
    arguments). e4m3 ``w`` with ``scale [E, rows]``; uint8 ``w`` holds two 4-bit codes a byte with
    ``scale [E, rows, K / group]`` and ``zero`` (int4) or ``book`` (16 values: nf4); else plain."""
    fp8 = w.dtype == torch.float8_e4m3fn
    four_bit = w.dtype == torch.uint8
    if (fp8 or four_bit) != (scale is not None) or (four_bit and (zero is None) == (book is None)):
        raise ValueError(f"{w.dtype} experts with scale={scale is not None}, zero={zero is not None}, "
                         f"book={book is not None}")
    k = w.shape[2] * 2 if four_bit else w.shape[2]
    group = sub = 1
    if four_bit:
        group = k // scale.shape[2]
        block_k = min(block_k, k & -k)  # whole K steps: a power of two dividing K
        sub = min(group, block_k)
        if group * scale.shape[2] != k or group % sub or block_k < 16:
            raise ValueError(f"4-bit experts: K={k} in groups of {group} do not fit K steps of {block_k}")
    dummy = w if scale is None else scale
    args = {"scale_ptr": dummy, "zero_ptr": dummy if zero is None else zero, "book_ptr": dummy if book is None else book,
            "stride_se": 0 if scale is None else scale.stride(0), "stride_sn": scale.stride(1) if four_bit else 1,
            "FP8": fp8, "FOUR_BIT": four_bit, "HAS_ZERO": zero is not None, "GROUP": group, "SUB": sub}
    return (w.view(torch.uint8) if fp8 else w), k, block_k, args


def grouped_gemm(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, blocks: ExpertBlocks, tiling: MoeTiling,
                 rows_per_a: int, gated: bool, topk_weights: torch.Tensor | None = None,
                 w_scale: torch.Tensor | None = None, w_zero: torch.Tensor | None = None,
                 book: torch.Tensor | None = None, sum_pairs: int = 1) -> torch.Tensor:
    """One launch over every block: ``out [pairs, N]`` from ``a`` rows and expert weights ``w [E, N
    (twice N gated), K]`` (a's dtype, or quantized: ``_weight_format``); rows of ``a`` are tokens
    (``rows_per_a`` = k) or pairs (1). ``sum_pairs`` = k (one pair a block only): ``out [tokens,
    N]``, each token's k pairs summed."""
    n = w.shape[1] // 2 if gated else w.shape[1]
    if blocks.block_m not in (None, tiling.block_m):
        raise ValueError(f"tiles of {tiling.block_m} rows over blocks aligned to {blocks.block_m}")
    if sum_pairs > 1 and blocks.block_m is not None:
        raise ValueError("pairs are summed in the GEMM only one pair a block")
    if w.stride(2) != 1 or a.stride(1) != 1:
        raise ValueError("weights and activations need contiguous rows")
    w, k, block_k, fmt = _weight_format(w, w_scale, w_zero, book, tiling.block_k)
    grid = (blocks.num_blocks * cdiv(n, tiling.block_n),)
    workspace, counters = scratch(a.device)
    _grouped_gemm_kernel[grid](
        a_ptr=a, w_ptr=w, out_ptr=out, sorted_ptr=blocks.sorted_pairs, expert_ids_ptr=blocks.expert_ids,
        num_padded_ptr=blocks.num_padded, topk_w_ptr=out if topk_weights is None else topk_weights,
        ws_ptr=workspace, lock_ptr=counters, N=n, K=k, num_pairs=out.shape[0] * sum_pairs,
        num_blocks=blocks.num_blocks, stride_am=a.stride(0), stride_we=w.stride(0),
        stride_wn=w.stride(1), stride_om=out.stride(0), up_rows=n, ROWS_PER_A=rows_per_a, SUM_PAIRS=sum_pairs,
        ONE_PAIR=blocks.block_m is None, GATED=gated, WEIGHTED=topk_weights is not None, BLOCK_M=tiling.block_m,
        BLOCK_N=tiling.block_n, BLOCK_K=block_k, GROUP_M=tiling.group_m, EVEN_K=k % block_k == 0,
        INTERLEAVE=gated and tiling.interleave, PRECISION=dot_precision(a.dtype), num_warps=tiling.num_warps,
        num_stages=tiling.num_stages, **fmt, **pdl_launch(a.device))
    return out


def fused_experts(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, activation: str = "silu", *, w13_scale: torch.Tensor | None = None,
                  w2_scale: torch.Tensor | None = None, w13_zero: torch.Tensor | None = None,
                  w2_zero: torch.Tensor | None = None, book: torch.Tensor | None = None,
                  tilings: tuple[MoeTiling, MoeTiling] | None = None, pair_rows: bool = False,
                  addend: torch.Tensor | Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
    """``hidden [T, H]``, ``w13 [E, 2I, H]`` (gate rows, then up rows), ``w2 [E, H, I]``,
    ``topk_weights [T, k]`` (float32), ``topk_ids [T, k]`` -> ``[T, H]`` in hidden's dtype:
    ``sum_j w_j * down_e(silu(gate_e(x)) * up_e(x))`` over each token's experts ``e = ids[j]``.
    fp8 experts: ``w13``/``w2`` e4m3 with float32 per-channel scales ``w13_scale [E, 2I]``,
    ``w2_scale [E, H]``. 4-bit experts: uint8 ``w13 [E, 2I, H/2]``/``w2 [E, H, I/2]`` (two codes
    a byte, the even input in the low nibble), float32 scales ``[E, rows, K / group]`` and
    either zeros of the same shape (int4: ``(code - zero) * scale``) or a code ``book [16]``
    (nf4: ``book[code] * scale``). One pair a block (batch-1 decode) runs the one-row GEMV
    (``_experts_by_gemv``) unless ``tilings`` (the grouped GEMMs' tiles) are given, K is not whole
    runs of 8 or ``FASTLLM_MOE_GEMV=0``. ``pair_rows``: where the pairs go one a
    block (batch-1 decode), return each token's k weighted rows unsummed, ``[T, k, H]`` float32, for a
    consumer that adds them (``fused_add_rms_norm``'s summands): no pair sum in this launch.
    ``addend [T, H]`` (the shared experts' output) is added to the sum, in the launch that sums
    the pairs; or a function that returns it, called right before that launch (the shared experts
    on a second stream, joined there: ``platforms.side_stream``)."""
    if activation != "silu":
        raise ValueError(f"fused_experts supports activation='silu', not {activation!r}")
    tokens, top_k = topk_ids.shape
    packing = 2 if w13.dtype == torch.uint8 else 1
    num_experts, inner = w13.shape[0], w13.shape[1] // 2
    if w13.shape[2] * packing != hidden.shape[1] or w2.shape != (num_experts, hidden.shape[1], inner // packing):
        raise ValueError(f"w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} do not fit hidden {tuple(hidden.shape)}")
    num_pairs = tokens * top_k
    if tilings is None and one_pair_a_block(num_pairs, num_experts) and (
            os.environ.get(EXPERT_GEMV_ENV, "1") != "0"):
        gemv = (gemv_format(w13, w13_scale, w13_zero, hidden.shape[1], hidden.dtype),
                gemv_format(w2, w2_scale, w2_zero, inner, hidden.dtype))
        if None not in gemv:
            quant = {"w13_scale": w13_scale, "w2_scale": w2_scale, "w13_zero": w13_zero, "w2_zero": w2_zero,
                     "book": book}
            return _experts_by_gemv(hidden.contiguous(), w13, w2, topk_weights, topk_ids, gemv, quant, pair_rows,
                                    addend)
    if callable(addend):
        addend = addend()
    gate_up, down = tilings or default_tilings(num_pairs, num_experts, hidden.element_size(), w13.element_size())
    formats = {"w_zero": w13_zero, "book": book}, {"w_zero": w2_zero, "book": book}
    hidden = hidden.contiguous()
    if one_pair_a_block(num_pairs, num_experts):
        blocks = one_pair_blocks(topk_ids)
    else:
        blocks = moe_align_block_size(topk_ids, gate_up.block_m, num_experts)
    act = hidden.new_empty((num_pairs, inner))
    grouped_gemm(hidden, w13, act, blocks, gate_up, top_k, gated=True, w_scale=w13_scale, **formats[0])
    weights = topk_weights.reshape(-1)
    if blocks.block_m is None and pair_rows:
        rows = hidden.new_empty((num_pairs, hidden.shape[1]), dtype=torch.float32)
        grouped_gemm(act, w2, rows, blocks, down, 1, gated=False, topk_weights=weights, w_scale=w2_scale,
                     **formats[1])
        return rows.view(tokens, top_k, -1) if addend is None else sum_pairs(rows.view(tokens, top_k, -1), addend)
    if blocks.block_m is None and top_k * hidden.numel() <= WORKSPACE_FLOATS and (
            tokens * cdiv(hidden.shape[1], down.block_n) <= TILE_COUNTERS):
        out = grouped_gemm(act, w2, torch.empty_like(hidden), blocks, down, 1, gated=False, topk_weights=weights,
                           w_scale=w2_scale, sum_pairs=top_k, **formats[1])
        return out if addend is None else out.add_(addend)
    if blocks.block_m not in (None, down.block_m):
        blocks = moe_align_block_size(topk_ids, down.block_m, num_experts)
    per_pair = hidden.new_empty((num_pairs, hidden.shape[1]))
    grouped_gemm(act, w2, per_pair, blocks, down, 1, gated=False, topk_weights=weights, w_scale=w2_scale,
                 **formats[1])
    return sum_pairs(per_pair.view(tokens, top_k, -1), addend)


def gemv_format(w: torch.Tensor, scale: torch.Tensor | None, zero: torch.Tensor | None, k: int,
                 dtype: torch.dtype) -> WeightFormat | None:
    """The one-row GEMV's format for experts ``w`` of K inputs (e4m3, 4-bit codes in groups of a
    power of two from 16, or float weights of the activations' ``dtype``), where K fills its loads
    (whole runs of 8) and its rows are contiguous (4-bit: whole 32-bit words); None where not."""
    if k % 8 or w.stride(2) != 1 or (w.dtype == torch.uint8 and (w.stride(0) % 4 or w.stride(1) % 4
                                                                  or w.storage_offset() % 4)):
        return None
    if w.dtype == torch.float8_e4m3fn:
        return WeightFormat(four_bit=False, fp8=True)
    if w.dtype == torch.uint8:
        group = k // scale.shape[2]
        if group < 16 or group & (group - 1):
            return None
        return WeightFormat(four_bit=True, nf4=zero is None, has_zero=zero is not None, group=group)
    return WeightFormat(four_bit=False, dense=True) if w.dtype == dtype else None


def _experts_by_gemv(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, formats: tuple[WeightFormat, WeightFormat], quant: dict,
                     pair_rows: bool, addend: torch.Tensor | Callable[[], torch.Tensor] | None) -> torch.Tensor:
    """``fused_experts`` at one pair a block as two launches of the one-row GEMV over the pairs
    (``expert_gemv``): gate and up with the SiLU-and-mul, then down with the routing weights and
    each token's k rows summed (or, ``pair_rows``, left to the consumer). Decode at one pair a block
    is a weight stream, and the GEMV is the kernel built to stream weights: small programs, many
    loads in flight, no tensor-core tile of padding rows; the down launch loads its experts' first
    slices under the gate/up launch (the ids were written before it) and adds ``addend`` to its
    sums. ``quant``: fused_experts' scale, zero and book keywords."""
    tokens, top_k = topk_ids.shape
    ids = topk_ids.reshape(-1).contiguous()
    weights = topk_weights.reshape(-1).contiguous()
    book = quant["book"]
    act = expert_gemv(hidden, w13, quant["w13_scale"], quant["w13_zero"], book, formats[0], ids, rows_per_x=top_k,
                      gated=True)
    down = {"route_weights": weights, "ids_ready": True}
    if callable(addend):
        addend = addend()
    if pair_rows:
        rows = expert_gemv(act, w2, quant["w2_scale"], quant["w2_zero"], book, formats[1], ids,
                           out_dtype=torch.float32, **down)
        return rows.view(tokens, top_k, -1) if addend is None else sum_pairs(rows.view(tokens, top_k, -1), addend)
    return expert_gemv(act, w2, quant["w2_scale"], quant["w2_zero"], book, formats[1], ids, sum_pairs=top_k,
                       addend=addend, **down)


@triton.jit
def _sum_pairs_kernel(rows_ptr, addend_ptr, out_ptr, H, K: tl.constexpr, HAS_ADDEND: tl.constexpr,
                      BLOCK: tl.constexpr):
    """``out[t] = sum_j rows[t, j] (+ addend[t])`` over ``BLOCK`` columns of one token, in float32,
    the slots in order (deterministic), every slot's load in flight at once."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < H
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(K):
        acc += tl.load(rows_ptr + (token * K + j) * H + cols, mask=inside, other=0.0).to(tl.float32)
    if HAS_ADDEND:
        acc += tl.load(addend_ptr + token * H + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * H + cols, acc.to(out_ptr.dtype.element_ty), mask=inside)


def sum_pairs(rows: torch.Tensor, addend: torch.Tensor | None = None) -> torch.Tensor:
    """``rows [T, k, H]`` summed over k, plus ``addend [T, H]`` if given, in ``addend``'s dtype
    (else ``rows``'): one pass over the rows, none over a partial sum."""
    tokens, top_k, hidden = rows.shape
    rows = rows.contiguous()
    out = torch.empty((tokens, hidden), dtype=rows.dtype if addend is None else addend.dtype, device=rows.device)
    if addend is not None and (addend.shape != out.shape or not addend.is_contiguous()):
        raise ValueError(f"addend {tuple(addend.shape)} (contiguous: {addend.is_contiguous()}) does not fit "
                         f"rows {tuple(rows.shape)}")
    block = min(1024, next_power_of_2(hidden))
    if tokens:
        _sum_pairs_kernel[(tokens, cdiv(hidden, block))](rows, out if addend is None else addend, out, hidden,
                                                                K=top_k, HAS_ADDEND=addend is not None, BLOCK=block)
    return out
