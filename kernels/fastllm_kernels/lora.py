"""Batched LoRA for a batch that mixes adapters (Punica's SGMV): each token reads its own adapter's
A and B from stacked ``[slots, ...]`` weights.

The host groups the step's tokens by adapter slot once (``lora_tiles``): ``order`` lists the
tokens that use an adapter, sorted by slot, and each tile is a run of at most ``TILE_TOKENS`` of
them with one slot, so a program loads its adapter's weights once for the whole run and multiplies
with ``tl.dot``. A layer then runs two launches: ``lora_shrink`` (``xa = x @ A[slot]^T``, float32)
and ``lora_expand`` (``y += scale[slot] * xa @ B[slot]^T`` in place over the base output). Tokens
of the base model (slot -1) are in no tile: their rows of ``y`` are left as they were.

A captured decode graph cannot group tokens on the host each step: ``lora_shrink_tokens`` and
``lora_expand_tokens`` (Punica's BGMV) read each token's slot from a static per-token tensor on
the device, one program per token and slice of the inner or output features, so their grids
depend only on the padded batch. A base-model token's program loads nothing. At batch 1 a
decode step runs these two launches on every wrapped layer, so they are built for latency: the
shrink leaves each split's partial sums (no zeroed buffer, no atomics) for the expand to add, and
both launch dependent on the kernel before (``pdl``), loading their slice of A or B under it.
"""

from __future__ import annotations

from itertools import groupby
from typing import Optional

import torch
import triton
import triton.language as tl

from fastllm_kernels.host_math import cdiv, next_power_of_2
from fastllm_kernels.pdl import pdl_launch, wait_for_inputs

TILE_TOKENS = 32
_BLOCK_K = 64
_BLOCK_N = 64
# BGMV: a token's shrink is split over programs of this many input features (a single program
# per token would read a whole A alone; at batch 1 the split sets the launch's latency); an
# expand program writes this many outputs.
_SPLIT_K = 256
_TOKEN_BLOCK_K = 128
_TOKEN_BLOCK_N = 128


def lora_tiles(slots: list[int], tile: int = TILE_TOKENS) -> tuple[list[int], list[int]]:
    """Per-token slots -> (``order``: the adapter tokens sorted by slot, ``tiles``: flat
    ``(start in order, length, slot)`` triples of runs of at most ``tile`` tokens). Goes by runs of
    one slot (a sequence's tokens are packed together), not token by token: a prefill step has
    thousands of tokens."""
    runs: dict[int, list[range]] = {}
    token = 0
    for slot, run in groupby(slots):
        length = len(list(run))
        if slot >= 0:
            runs.setdefault(slot, []).append(range(token, token + length))
        token += length
    order: list[int] = []
    tiles: list[int] = []
    for slot in sorted(runs):
        start = len(order)
        for tokens in runs[slot]:
            order.extend(tokens)
        for offset in range(start, len(order), tile):
            tiles += [offset, min(tile, len(order) - offset), slot]
    return order, tiles


@triton.jit
def _tile(order_ptr, tiles_ptr, BLOCK_T: tl.constexpr):
    """This program's tile: its length, its slot, row numbers and the tokens at them."""
    tile = tl.program_id(0)
    start, length = tl.load(tiles_ptr + 3 * tile), tl.load(tiles_ptr + 3 * tile + 1)
    slot = tl.load(tiles_ptr + 3 * tile + 2).to(tl.int64)
    rows = tl.arange(0, BLOCK_T)
    tokens = tl.load(order_ptr + start + rows, mask=rows < length, other=0).to(tl.int64)
    return length, slot, rows, tokens


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, order_ptr, tiles_ptr, out_ptr, K, R, stride_x, stride_as, stride_ar, stride_out,
                   BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    length, slot, rows, tokens = _tile(order_ptr, tiles_ptr, BLOCK_T)
    ranks = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_T, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + tokens[:, None] * stride_x + cols[None, :],
                    mask=(rows[:, None] < length) & (cols[None, :] < K), other=0.0)
        a = tl.load(a_ptr + slot * stride_as + ranks[None, :] * stride_ar + cols[:, None],
                    mask=(ranks[None, :] < R) & (cols[:, None] < K), other=0.0)
        acc += tl.dot(x, a, input_precision=PRECISION)
    tl.store(out_ptr + tokens[:, None] * stride_out + ranks[None, :], acc,
             mask=(rows[:, None] < length) & (ranks[None, :] < R))


@triton.jit
def _expand_kernel(xa_ptr, b_ptr, scale_ptr, order_ptr, tiles_ptr, y_ptr, N, R, stride_xa, stride_bs, stride_bn,
                   stride_y, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                   PRECISION: tl.constexpr):
    length, slot, rows, tokens = _tile(order_ptr, tiles_ptr, BLOCK_T)
    ranks = tl.arange(0, BLOCK_R)
    outputs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    xa = tl.load(xa_ptr + tokens[:, None] * stride_xa + ranks[None, :],
                 mask=(rows[:, None] < length) & (ranks[None, :] < R), other=0.0)
    b = tl.load(b_ptr + slot * stride_bs + outputs[None, :] * stride_bn + ranks[:, None],
                mask=(outputs[None, :] < N) & (ranks[:, None] < R), other=0.0)
    delta = tl.dot(xa.to(b.dtype), b, input_precision=PRECISION) * tl.load(scale_ptr + slot)
    mask = (rows[:, None] < length) & (outputs[None, :] < N)
    y_rows = y_ptr + tokens[:, None] * stride_y + outputs[None, :]
    y = tl.load(y_rows, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_rows, (y + delta).to(y_ptr.dtype.element_ty), mask=mask)


def _precision(x: torch.Tensor) -> Optional[str]:
    """float32 stays float32 (no tf32 rounding); half types take tl.dot's default."""
    return "ieee" if x.dtype == torch.float32 else None


def _block_r(rank: int) -> int:
    return max(16, next_power_of_2(rank))  # tl.dot wants every side >= 16


def lora_shrink(x: torch.Tensor, a: torch.Tensor, order: torch.Tensor, tiles: torch.Tensor) -> torch.Tensor:
    """``x [T, K]``, ``a [S, R, K]`` -> ``xa [T, R]`` float32, written only at the tiled tokens."""
    (_, rank, inner), num_tiles = a.shape, tiles.numel() // 3
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty(x.shape[0], rank, dtype=torch.float32, device=x.device)
    if num_tiles:
        _shrink_kernel[(num_tiles,)](x, a, order, tiles, out, inner, rank, x.stride(0), a.stride(0), a.stride(1),
                                     out.stride(0), BLOCK_T=TILE_TOKENS, BLOCK_R=_block_r(rank), BLOCK_K=_BLOCK_K,
                                     PRECISION=_precision(x))
    return out


def lora_expand(y: torch.Tensor, xa: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, order: torch.Tensor,
                tiles: torch.Tensor) -> torch.Tensor:
    """``y [T, N] += scale[slot] * xa [T, R] @ b[slot]^T`` in place (``b [S, N, R]``); returns ``y``."""
    (_, outputs, rank), num_tiles = b.shape, tiles.numel() // 3
    assert y.stride(-1) == 1, "y is updated in place and must have unit stride"
    if num_tiles:
        _expand_kernel[(num_tiles, cdiv(outputs, _BLOCK_N))](
            xa, b, scale, order, tiles, y, outputs, rank, xa.stride(0), b.stride(0), b.stride(1), y.stride(0),
            BLOCK_T=TILE_TOKENS, BLOCK_R=_block_r(rank), BLOCK_N=_BLOCK_N, PRECISION=_precision(y))
    return y


@triton.jit
def _shrink_tokens_kernel(x_ptr, a_ptr, slots_ptr, out_ptr, T, K, R, stride_x, stride_as, stride_ar,
                          SPLIT_K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    # a base-model token: every load and the store are masked off
    K, R = tl.where(slot >= 0, K, 0), tl.where(slot >= 0, R, 0)
    ranks = tl.arange(0, BLOCK_R)
    cols = split * SPLIT_K + tl.arange(0, BLOCK_K)
    a_rows = a_ptr + slot * stride_as + ranks[:, None] * stride_ar
    a = tl.load(a_rows + cols[None, :], mask=(ranks[:, None] < R) & (cols[None, :] < K), other=0.0)
    wait_for_inputs(PDL)  # A is the adapter's weights (no kernel writes them); x is the layer's input
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in tl.static_range(0, SPLIT_K, BLOCK_K):
        x = tl.load(x_ptr + token * stride_x + cols, mask=cols < K, other=0.0).to(tl.float32)
        acc += tl.sum(a.to(tl.float32) * x[None, :], axis=1)
        if k0 + BLOCK_K < SPLIT_K:
            cols += BLOCK_K
            a = tl.load(a_rows + cols[None, :], mask=(ranks[:, None] < R) & (cols[None, :] < K), other=0.0)
    tl.store(out_ptr + (split * T + token) * BLOCK_R + ranks, acc, mask=ranks < R)


@triton.jit
def _expand_tokens_kernel(xa_ptr, b_ptr, scale_ptr, slots_ptr, y_ptr, T, N, R, SPLITS, stride_bs, stride_bn, stride_y,
                          BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    # a base-model token: every load and the store are masked off
    N, R = tl.where(slot >= 0, N, 0), tl.where(slot >= 0, R, 0)
    ranks = tl.arange(0, BLOCK_R)
    outputs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    b = tl.load(b_ptr + slot * stride_bs + outputs[:, None] * stride_bn + ranks[None, :],
                mask=(outputs[:, None] < N) & (ranks[None, :] < R), other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr + tl.maximum(slot, 0))
    wait_for_inputs(PDL)  # B and the scale are the adapter's; the shrink's sums and y are not
    splits = tl.arange(0, BLOCK_S)
    partials = tl.load(xa_ptr + (splits[:, None] * T + token) * BLOCK_R + ranks[None, :],
                       mask=(splits[:, None] < SPLITS) & (ranks[None, :] < R), other=0.0)
    xa = tl.sum(partials, axis=0)
    delta = tl.sum(b * xa[None, :], axis=1) * scale
    y = tl.load(y_ptr + token * stride_y + outputs, mask=outputs < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + token * stride_y + outputs, (y + delta).to(y_ptr.dtype.element_ty), mask=outputs < N)


def lora_shrink_tokens(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``lora_shrink`` by each token's own slot in ``slots [T]`` (-1: none), left as the float32
    partial sums of each split of K, ``[splits, T, BLOCK_R]`` (a power of two >= R; the rows of
    slot -1 and the ranks past R are not written), which ``lora_expand_tokens`` adds up: no
    zeroed buffer, no atomics, so one launch, dependent on the base layer's (``pdl``)."""
    _, rank, inner = a.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    splits, block_r = cdiv(inner, _SPLIT_K), next_power_of_2(rank)
    out = torch.empty(splits, x.shape[0], block_r, dtype=torch.float32, device=x.device)
    if x.shape[0]:
        _shrink_tokens_kernel[(x.shape[0], splits)](
            x, a, slots, out, x.shape[0], inner, rank, x.stride(0), a.stride(0), a.stride(1),
            SPLIT_K=_SPLIT_K, BLOCK_R=block_r, BLOCK_K=_TOKEN_BLOCK_K, **pdl_launch(x.device))
    return out


def lora_expand_tokens(y: torch.Tensor, xa: torch.Tensor, b: torch.Tensor, scale: torch.Tensor,
                       slots: torch.Tensor) -> torch.Tensor:
    """``lora_expand`` by each token's own slot in ``slots [T]``, from ``lora_shrink_tokens``'s
    partial sums ``xa``; rows of slot -1 stay as they were."""
    _, outputs, rank = b.shape
    assert y.stride(-1) == 1, "y is updated in place and must have unit stride"
    assert xa.is_contiguous() and xa.shape[1:] == (y.shape[0], next_power_of_2(rank))
    if y.shape[0]:
        _expand_tokens_kernel[(y.shape[0], cdiv(outputs, _TOKEN_BLOCK_N))](
            xa, b, scale, slots, y, y.shape[0], outputs, rank, xa.shape[0], b.stride(0), b.stride(1), y.stride(0),
            BLOCK_S=next_power_of_2(xa.shape[0]), BLOCK_R=xa.shape[2], BLOCK_N=_TOKEN_BLOCK_N, **pdl_launch(y.device))
    return y


def lora_shrink_ref(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    used = slots >= 0
    out = torch.zeros(x.shape[0], a.shape[1], dtype=torch.float64, device=x.device)
    out[used] = torch.einsum("tk,trk->tr", x[used].double(), a[slots[used].long()].double())
    return out


def lora_expand_ref(y: torch.Tensor, xa: torch.Tensor, b: torch.Tensor, scale: torch.Tensor,
                    slots: torch.Tensor) -> torch.Tensor:
    used = slots >= 0
    out = y.double().clone()
    picked = slots[used].long()
    out[used] += torch.einsum("tr,tnr->tn", xa[used].double(), b[picked].double()) * scale[picked, None].double()
    return out
