"""Batched LoRA for a batch that mixes adapters (Punica's BGMV): each token reads its own
adapter's A and B, picked by a per-token slot index into stacked ``[slots, ...]`` weights.

A layer runs two launches: ``lora_shrink`` (``xa = x @ A[slot]^T``, rank-sized, float32) and
``lora_expand`` (``y += scale[slot] * xa @ B[slot]^T`` in place over the base layer's output).
A token with slot -1 (the base model) reads no weights and leaves ``y`` as it was.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK_K = 128
_BLOCK_N = 64


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, slot_ptr, out_ptr, K, R, stride_x, stride_as, stride_ar, stride_out,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    ranks = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    if slot >= 0:
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + token * stride_x + cols, mask=cols < K, other=0.0).to(tl.float32)
            a = tl.load(a_ptr + slot * stride_as + ranks[:, None] * stride_ar + cols[None, :],
                        mask=(ranks[:, None] < R) & (cols[None, :] < K), other=0.0).to(tl.float32)
            acc += tl.sum(a * x[None, :], axis=1)
    tl.store(out_ptr + token * stride_out + ranks, acc, mask=ranks < R)


@triton.jit
def _expand_kernel(xa_ptr, b_ptr, scale_ptr, slot_ptr, y_ptr, N, R, stride_xa, stride_bs, stride_bn,
                   stride_y, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:
        rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        ranks = tl.arange(0, BLOCK_R)
        xa = tl.load(xa_ptr + token * stride_xa + ranks, mask=ranks < R, other=0.0)
        b = tl.load(b_ptr + slot * stride_bs + rows[:, None] * stride_bn + ranks[None, :],
                    mask=(rows[:, None] < N) & (ranks[None, :] < R), other=0.0).to(tl.float32)
        delta = tl.sum(b * xa[None, :], axis=1) * tl.load(scale_ptr + slot)
        y_rows = y_ptr + token * stride_y + rows
        y = tl.load(y_rows, mask=rows < N, other=0.0).to(tl.float32)
        tl.store(y_rows, (y + delta).to(y_ptr.dtype.element_ty), mask=rows < N)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``x [T, K]``, ``a [S, R, K]``, ``slots [T]`` int -> ``xa [T, R]`` float32 (0 where slot -1)."""
    tokens, (_, rank, inner) = x.shape[0], a.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty(tokens, rank, dtype=torch.float32, device=x.device)
    if tokens:
        _shrink_kernel[(tokens,)](x, a, slots, out, inner, rank, x.stride(0), a.stride(0), a.stride(1),
                                  out.stride(0), BLOCK_R=triton.next_power_of_2(rank), BLOCK_K=_BLOCK_K)
    return out


def lora_expand(y: torch.Tensor, xa: torch.Tensor, b: torch.Tensor, scale: torch.Tensor,
                slots: torch.Tensor) -> torch.Tensor:
    """``y [T, N] += scale[slot] * xa [T, R] @ b[slot]^T`` in place (``b [S, N, R]``); returns ``y``."""
    tokens, (_, outputs, rank) = y.shape[0], b.shape
    assert y.stride(-1) == 1, "y is updated in place and must have unit stride"
    if tokens:
        _expand_kernel[(tokens, triton.cdiv(outputs, _BLOCK_N))](
            xa, b, scale, slots, y, outputs, rank, xa.stride(0), b.stride(0), b.stride(1), y.stride(0),
            BLOCK_R=triton.next_power_of_2(rank), BLOCK_N=_BLOCK_N)
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
