"""Paged extend (prefill) attention: variable-length query runs over a cached prefix.

One launch covers every sequence. A program owns one kv head and a tile of ``BLOCK_M`` rows,
where a row is a (query token, query head of the group) pair: all heads of a GQA group share
each K/V tile, and a short query run (speculative verification, 2..8 tokens) still fills the
tensor-core tile instead of wasting 15 of 16 rows. Keys at or before the tile's first
position are visible to every row and run without a mask; only the diagonal part is masked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fastllm_kernels.host_math import cdiv, next_power_of_2


@triton.jit
def _attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, table, head_offset, n0, kv_end,
                 row_pos, scale_log2e, stride_cache_block, stride_cache_token,
                 HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """One online-softmax step over keys ``[n0, n0 + BLOCK_N)``; masked only when CAUSAL."""
    dims = tl.arange(0, HEAD_DIM)
    cols = n0 + tl.arange(0, BLOCK_N)
    if CAUSAL:
        col_mask = cols < kv_end
        block_id = tl.load(table + cols // BLOCK_SIZE, mask=col_mask, other=0).to(tl.int64)
    else:
        block_id = tl.load(table + cols // BLOCK_SIZE).to(tl.int64)
    token = block_id * stride_cache_block + (cols % BLOCK_SIZE) * stride_cache_token + head_offset
    if CAUSAL:
        k = tl.load(k_cache_ptr + token[None, :] + dims[:, None], mask=col_mask[None, :], other=0.0)
    else:
        k = tl.load(k_cache_ptr + token[None, :] + dims[:, None])
    s = tl.dot(q, k.to(q.dtype), input_precision=PRECISION) * scale_log2e
    if CAUSAL:
        s = tl.where(cols[None, :] <= row_pos[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if CAUSAL:
        v = tl.load(v_cache_ptr + token[:, None] + dims[None, :], mask=col_mask[:, None], other=0.0)
    else:
        v = tl.load(v_cache_ptr + token[:, None] + dims[None, :])
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION)
    return m_new, l_i, acc


# The step's metadata (block tables, lengths) are slices whose offsets and widths change from step
# to step: specializing on their alignment or the table's stride would compile a variant mid-run.
@triton.jit(do_not_specialize=["stride_table"],
            do_not_specialize_on_alignment=["block_tables_ptr", "query_start_loc_ptr", "seq_lens_ptr"])
def _extend_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_loc_ptr, seq_lens_ptr,
    out_ptr, scale_log2e, stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cache_block, stride_cache_token, stride_cache_head, stride_table,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    tokens_per_tile: tl.constexpr = BLOCK_M // GROUP
    # Last query tiles see the most keys: start them first.
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    seq = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    first = tile * tokens_per_tile
    if first < q_len:
        prefix_len = tl.load(seq_lens_ptr + seq) - q_len
        rows = tl.arange(0, BLOCK_M)
        dims = tl.arange(0, HEAD_DIM)
        q_idx = first + rows // GROUP
        heads = kv_head * GROUP + rows % GROUP
        row_mask = (rows < tokens_per_tile * GROUP) & (q_idx < q_len)
        q_offset = (q_start + q_idx).to(tl.int64)
        q = tl.load(q_ptr + q_offset[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                    mask=row_mask[:, None], other=0.0)
        row_pos = prefix_len + q_idx

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        table = block_tables_ptr + seq.to(tl.int64) * stride_table
        head_offset = kv_head * stride_cache_head
        first_pos = prefix_len + first
        kv_end = prefix_len + tl.minimum(first + tokens_per_tile, q_len)
        unmasked_end = (first_pos + 1) // BLOCK_N * BLOCK_N
        for n0 in range(0, unmasked_end, BLOCK_N):
            m_i, l_i, acc = _attend_tile(
                q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, table, head_offset, n0, kv_end,
                row_pos, scale_log2e, stride_cache_block, stride_cache_token,
                HEAD_DIM, BLOCK_SIZE, BLOCK_N, False, PRECISION)
        for n0 in range(unmasked_end, kv_end, BLOCK_N):
            m_i, l_i, acc = _attend_tile(
                q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, table, head_offset, n0, kv_end,
                row_pos, scale_log2e, stride_cache_block, stride_cache_token,
                HEAD_DIM, BLOCK_SIZE, BLOCK_N, True, PRECISION)

        o = acc / l_i[:, None]
        out_offset = (q_start + q_idx).to(tl.int64)
        tl.store(out_ptr + out_offset[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


@dataclass(frozen=True)
class ExtendTiling:
    """``block_m`` rows (query token x head of the group) by ``block_n`` keys a step."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def default_extend_tiling(head_dim: int, group: int, max_query_len: int, element_size: int) -> ExtendTiling:
    """Query tiles of 64 rows unless the runs are short, 64 keys a step (K tiles of at most 32 KB), four
    warps: the H100 sweep's best on prefill chunks of Llama-3-8B and ERNIE-4.5-21B-A3B
    (``kernels/bench_kernels.py --sweep-extend``; figures in benchmarks/RESULTS.md); short query
    tiles are memory-bound and take 32 keys."""
    block_m = max(min(64, max(16, next_power_of_2(max_query_len * group))), next_power_of_2(group))
    block_n = min(64 if block_m > 32 else 32, 32768 // (head_dim * element_size))
    return ExtendTiling(block_m, block_n, 4, 2)


def paged_extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                           seq_lens: torch.Tensor, max_query_len: int, scale: float,
                           out: Optional[torch.Tensor] = None, tiling: Optional[ExtendTiling] = None) -> torch.Tensor:
    """Causal attention of packed query runs ``q [T, H, D]`` over their paged KV.

    Sequence ``b`` owns queries ``query_start_loc[b]:query_start_loc[b+1]``; its ``seq_lens[b]``
    keys (cached prefix plus this step's tokens, already written) live in the blocks of
    ``block_tables[b]``. Query ``i`` sits at position ``seq_len - query_len + i`` and sees keys
    up to and including that position. ``max_query_len`` sizes the grid and must bound every
    run (an over-estimate only launches idle programs). The caches may be fp8 (upcast to q's
    dtype as loaded; e4m3 needs compute capability 8.9+). ``tiling``: the launch's tiles
    (``default_extend_tiling`` if None).
    """
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert q.stride(-1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert num_heads % num_kv_heads == 0 and head_dim == next_power_of_2(head_dim)
    out = torch.empty_like(q) if out is None else out
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0 or max_query_len == 0:
        return out
    group = num_heads // num_kv_heads
    tiling = tiling or default_extend_tiling(head_dim, group, max_query_len, q.element_size())
    block_m = tiling.block_m
    num_tiles = cdiv(max_query_len, block_m // group)
    _extend_kernel[(num_tiles, num_seqs, num_kv_heads)](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out,
        scale * math.log2(math.e), q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=tiling.block_n,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=tiling.num_warps, num_stages=tiling.num_stages,
    )
    return out


def paged_extend_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                               seq_lens: torch.Tensor, max_query_len: int,
                               scale: float) -> torch.Tensor:
    """Gather each sequence's keys and run SDPA with the bottom-right-aligned causal mask."""
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for b, kv_len in enumerate(lens):
        q_len = starts[b + 1] - starts[b]
        if q_len == 0:
            continue
        blocks = block_tables[b, : cdiv(kv_len, block_size)].long()
        k = k_cache[blocks].flatten(0, 1)[:kv_len].transpose(0, 1).to(q.dtype)
        v = v_cache[blocks].flatten(0, 1)[:kv_len].transpose(0, 1).to(q.dtype)
        group = q.shape[1] // k.shape[0]
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        positions = torch.arange(kv_len - q_len, kv_len, device=q.device)
        mask = torch.arange(kv_len, device=q.device)[None, :] <= positions[:, None]
        o = F.scaled_dot_product_attention(q[starts[b]:starts[b + 1]].transpose(0, 1), k, v,
                                           attn_mask=mask, scale=scale)
        out[starts[b]:starts[b + 1]] = o.transpose(0, 1)
    return out
