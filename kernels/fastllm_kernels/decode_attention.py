"""Paged decode attention: one query token per sequence, flash-decoding style.

Decode is memory-bound: the cost is reading K and V once. So

* one program serves all query heads of one kv head (GQA), K/V are read once per group and
  the group (padded to 16 rows) goes through the tensor cores;
* a sequence's context is split into ``num_splits`` equal, tile-aligned pieces handled by
  separate programs, so a batch of a few long sequences still fills the GPU; a second,
  tiny kernel merges the pieces through their log-sum-exp.

The running max of the online softmax (in log2 units) is rounded up to an integer, so every
rescale is an exact power of two and each probability rounds to q's dtype for ``P @ V`` the
same whichever piece or tile it falls in. The number of splits follows the batch size, so
without this a sequence's 16-bit output would change with the batch it runs in; with it only
fp32 summation order differs. Memory-bound decode pays nothing for it; the compute-bound
extend kernel would, so it keeps the exact max.

The split length is derived per sequence from its own ``seq_len`` inside the kernel, so the
grid depends only on shapes and the launch can be captured in a CUDA graph. Pieces are whole
tiles: a short context under a grid sized for long ones fills only its first few, the programs of
the others exit at once and the merge reads only the filled ones. The number of
splits is a run-time value (only "split or not" and the merge's power-of-two padding are
compile-time), so a new batch size or context length reuses a compiled kernel instead of
stalling a step on a compilation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from fastllm_kernels.device import multiprocessors
from fastllm_kernels.extend_attention import paged_extend_attention_ref
from fastllm_kernels.host_math import cdiv, next_power_of_2
from fastllm_kernels.pdl import pdl_launch, wait_for_inputs

_MAX_SPLITS = 64
_MIN_TOKENS_PER_SPLIT = 256


@triton.jit
def _piece_length(seq_len, num_splits, BLOCK_N: tl.constexpr):
    """Tokens in each piece of a sequence's context: its share of ``num_splits``, whole tiles."""
    return tl.maximum(tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N), 1) * BLOCK_N


@triton.jit
def _tile_tokens(table, cols, end, stride_cache_block, stride_cache_token, head_offset, BLOCK_SIZE: tl.constexpr):
    """Cache offsets of the kv head's keys (or values) at positions ``cols`` (block 0 past ``end``)."""
    block_id = tl.load(table + cols // BLOCK_SIZE, mask=cols < end, other=0).to(tl.int64)
    return block_id * stride_cache_block + (cols % BLOCK_SIZE) * stride_cache_token + head_offset


@triton.jit
def _attend(q, k, v, col_mask, m_i, l_i, acc, scale_log2e, PRECISION: tl.constexpr):
    """The online softmax's state after one tile of keys ``k [D, N]`` and values ``v [N, D]``."""
    s = tl.dot(q, k.to(q.dtype), input_precision=PRECISION) * scale_log2e
    s = tl.where(col_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.ceil(tl.max(s, 1)))  # an integer: see the module's docstring
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["stride_table"],  # as the extend kernel: no variant compiled mid-run
            do_not_specialize_on_alignment=["block_tables_ptr", "seq_lens_ptr"])
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, split_out_ptr, split_lse_ptr, scale_log2e,
    stride_qb, stride_qh, stride_ob, stride_oh,
    stride_cache_block, stride_cache_token, stride_cache_head, stride_table,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    PRECISION: tl.constexpr, PDL: tl.constexpr, PRELOAD_VALUES: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_kv_heads = tl.num_programs(1)
    num_splits = tl.num_programs(2)

    # The lengths and tables were copied in before the step's first launch, and every key and value but
    # this step's was written by an earlier step: the first tile of keys (and of values) loads under the
    # previous kernel.
    seq_len = tl.load(seq_lens_ptr + seq)
    split_len = _piece_length(seq_len, num_splits, BLOCK_N)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    table = block_tables_ptr + seq.to(tl.int64) * stride_table
    head_offset = kv_head * stride_cache_head
    dims = tl.arange(0, HEAD_DIM)
    cols = start + tl.arange(0, BLOCK_N)
    token = _tile_tokens(table, cols, end, stride_cache_block, stride_cache_token, head_offset, BLOCK_SIZE)
    older = cols < seq_len - 1
    k = tl.load(k_cache_ptr + token[None, :] + dims[:, None], mask=older[None, :], other=0.0)
    if PRELOAD_VALUES:
        v = tl.load(v_cache_ptr + token[:, None] + dims[None, :], mask=older[:, None], other=0.0)
    wait_for_inputs(PDL)
    if SPLIT:
        if start >= seq_len:  # past the context (a short one, under a grid sized for long ones): the merge skips it
            return

    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    row_mask = rows < GROUP
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=row_mask[:, None], other=0.0)
    newest = cols == seq_len - 1  # this step's key and value, in the first tile or a later one
    k = tl.where(newest[None, :], tl.load(k_cache_ptr + token[None, :] + dims[:, None], mask=newest[None, :]), k)
    if PRELOAD_VALUES:
        v = tl.where(newest[:, None], tl.load(v_cache_ptr + token[:, None] + dims[None, :], mask=newest[:, None]), v)
    else:
        v = tl.load(v_cache_ptr + token[:, None] + dims[None, :], mask=(cols < end)[:, None], other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    if start < end:  # not an empty context
        m_i, l_i, acc = _attend(q, k, v, cols < end, m_i, l_i, acc, scale_log2e, PRECISION)
    for n0 in range(start + BLOCK_N, end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_mask = cols < end
        token = _tile_tokens(table, cols, end, stride_cache_block, stride_cache_token, head_offset, BLOCK_SIZE)
        k = tl.load(k_cache_ptr + token[None, :] + dims[:, None], mask=col_mask[None, :], other=0.0)
        v = tl.load(v_cache_ptr + token[:, None] + dims[None, :], mask=col_mask[:, None], other=0.0)
        m_i, l_i, acc = _attend(q, k, v, col_mask, m_i, l_i, acc, scale_log2e, PRECISION)

    # Unsplit, an empty context (seq_len 0: padding) leaves l_i == 0: it writes zeros.
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if not SPLIT:
        dst = out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])
    else:
        part = (seq * num_kv_heads * GROUP + heads) * num_splits + split
        tl.store(split_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], o, mask=row_mask[:, None])
        tl.store(split_lse_ptr + part, m_i + tl.log2(l_safe), mask=row_mask)


@triton.jit
def _decode_merge_kernel(
    split_out_ptr, split_lse_ptr, out_ptr, seq_lens_ptr, stride_ob, stride_oh, num_splits,
    SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):
    """Merge a sequence's pieces that hold context (no piece of seq_len 0: zeros)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)  # a step input: before the wait, as in the split kernel
    pieces = tl.cdiv(seq_len, _piece_length(seq_len, num_splits, BLOCK_N))
    wait_for_inputs(PDL)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM)
    part = (seq * tl.num_programs(1) + head) * num_splits + splits
    lse = tl.load(split_lse_ptr + part, mask=splits < pieces, other=float("-inf"))
    lse_max = tl.max(lse, 0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weight = tl.exp2(lse - lse_max)
    o = tl.load(split_out_ptr + part[:, None] * HEAD_DIM + dims[None, :],
                mask=(splits < pieces)[:, None], other=0.0)
    total = tl.sum(weight, 0)
    merged = tl.sum(o * weight[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims, merged.to(out_ptr.dtype.element_ty))


def _multiprocessors(q: torch.Tensor) -> int:
    """q's device's multiprocessors; 16 off CUDA (the interpreter), so that tests meet every path."""
    return multiprocessors(q.device) if q.is_cuda else 16


def _default_num_splits(q: torch.Tensor, num_kv_heads: int, max_context: int) -> int:
    """Enough programs for about four per multiprocessor, but no piece under 256 tokens."""
    wanted = cdiv(4 * _multiprocessors(q), q.shape[0] * num_kv_heads)
    return max(1, min(wanted, cdiv(max_context, _MIN_TOKENS_PER_SPLIT), _MAX_SPLITS))


@dataclass(frozen=True)
class DecodeTiling:
    """``block_n`` keys a step of a piece's loop, with the launch's warps and pipeline stages;
    ``preload_values``: the first value tile loads before the wait too, as the first key tile does."""

    block_n: int
    num_warps: int = 4
    num_stages: int = 2
    preload_values: bool = False


def default_decode_tiling(head_dim: int, sparse: bool = False) -> DecodeTiling:
    """From the H100 sweep (``kernels/bench_kernels.py --sweep-decode``; figures in
    benchmarks/RESULTS.md): 64 keys a step, two warps, three stages. 128 keys with four warps was
    faster over long contexts at batch 1 but halves the pieces of a short one, and lost there.
    ``sparse`` (a launch of at most one program a multiprocessor: batch-1 decode, where the wait
    is the critical path): the first value tile loads before the wait too, over four warps (two
    spill with both tiles in registers); a full launch keeps two, which fit more programs at once."""
    if head_dim > 128:
        return DecodeTiling(32, preload_values=sparse)
    return DecodeTiling(64, 4, 3, preload_values=True) if sparse else DecodeTiling(64, 2, 3)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           out: Optional[torch.Tensor] = None, *,
                           num_splits: Optional[int] = None, tiling: Optional[DecodeTiling] = None) -> torch.Tensor:
    """Attention of one query token per sequence over its paged context.

    q ``[B, H, D]``; caches ``[num_blocks, block_size, KVH, D]`` in q's dtype or fp8 (upcast to
    q's dtype as loaded; e4m3 needs compute capability 8.9+); ``block_tables`` int32
    ``[B, max_blocks]``; ``seq_lens`` int32 ``[B]`` counts the context including this step's
    token (already in the cache). ``num_splits`` overrides the context-splitting heuristic;
    it fixes the grid, so keep it constant across CUDA-graph replays (the default depends only
    on shapes and the device). ``tiling``: the launch's (``default_decode_tiling`` if None).
    """
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert q.stride(-1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert num_heads % num_kv_heads == 0 and head_dim == next_power_of_2(head_dim)
    out = torch.empty_like(q) if out is None else out
    if batch == 0:
        return out
    if num_splits is None:
        num_splits = _default_num_splits(q, num_kv_heads, block_tables.shape[1] * block_size)
    assert 1 <= num_splits <= _MAX_SPLITS
    group = num_heads // num_kv_heads
    programs = batch * num_kv_heads * num_splits
    tiling = tiling or default_decode_tiling(head_dim, programs <= _multiprocessors(q))
    block_n = tiling.block_n
    split_out = split_lse = out  # placeholders: not read when num_splits == 1
    if num_splits > 1:
        split_out = q.new_empty((batch, num_heads, num_splits, head_dim), dtype=torch.float32)
        split_lse = q.new_empty((batch, num_heads, num_splits), dtype=torch.float32)
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, split_out, split_lse,
        scale * math.log2(math.e),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=group, GROUP_PAD=max(16, next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, SPLIT=num_splits > 1,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=tiling.num_warps,
        num_stages=tiling.num_stages, PRELOAD_VALUES=tiling.preload_values, **pdl_launch(q.device),
    )
    if num_splits > 1:
        _decode_merge_kernel[(batch, num_heads)](
            split_out, split_lse, out, seq_lens, out.stride(0), out.stride(1), num_splits,
            SPLITS_PAD=next_power_of_2(num_splits),
            HEAD_DIM=head_dim, BLOCK_N=block_n, num_warps=4, **pdl_launch(q.device),
        )
    return out


def paged_decode_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, seq_lens: torch.Tensor,
                               scale: float) -> torch.Tensor:
    """Decode is extend with one query token per sequence."""
    query_start_loc = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return paged_extend_attention_ref(q, k_cache, v_cache, block_tables, query_start_loc,
                                      seq_lens, 1, scale)
