"""Rotary position embedding applied in place to query and key.

One program per token rotates every query and key head of it, so the token's cos/sin row is
read once. ``cos_sin_cache [max_pos, rot_dim]`` holds cos in its first half and sin in its
second; ``rot_dim`` may be smaller than ``head_size`` (partial rotary): the rest is untouched.
NeoX style (``is_neox=True``, Llama/Qwen in Hugging Face) rotates the two halves of the
rotary dims; GPT-J style rotates interleaved pairs. ``norms`` (Qwen3's RMSNorm of each query and
key head before rotary) are applied in the same pass, rounded to x's dtype as the norm kernel
rounds, so a qk-norm layer spends one launch here instead of three.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastllm_kernels.host_math import next_power_of_2
from fastllm_kernels.pdl import pdl_launch, wait_for_inputs


@triton.jit
def head_halves(x_ptr, stride_head, num_heads, HEADS_PAD: tl.constexpr, ROT_HALF: tl.constexpr,
                HALF_PAD: tl.constexpr, IS_NEOX: tl.constexpr):
    """Pointers to every head's two rotary halves ``[HEADS_PAD, HALF_PAD]`` and their mask."""
    heads = tl.arange(0, HEADS_PAD)
    pairs = tl.arange(0, HALF_PAD)
    mask = (heads < num_heads)[:, None] & (pairs < ROT_HALF)[None, :]
    first, second = (pairs, pairs + ROT_HALF) if IS_NEOX else (2 * pairs, 2 * pairs + 1)
    rows = x_ptr + heads[:, None] * stride_head
    return rows + first[None, :], rows + second[None, :], mask


@triton.jit
def _rotate_heads(ptr1, ptr2, mask, x1, x2, cos, sin, w1, w2, eps, ROT_HALF: tl.constexpr, NORM: tl.constexpr):
    """Rotate loaded halves ``x1``, ``x2`` (float32; ``NORM``: RMS-normalised per head first with the
    weights' halves ``w1``, ``w2``, rounded to x's dtype as the norm kernel rounds), store them in
    place; returns them in x's dtype."""
    if NORM:  # the rotary dims are the whole head (rotary_args checks)
        rstd = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * ROT_HALF) + eps)[:, None]
        x1 = (x1 * rstd * w1).to(ptr1.dtype.element_ty).to(tl.float32)
        x2 = (x2 * rstd * w2).to(ptr1.dtype.element_ty).to(tl.float32)
    y1 = (x1 * cos - x2 * sin).to(ptr1.dtype.element_ty)
    y2 = (x2 * cos + x1 * sin).to(ptr1.dtype.element_ty)
    tl.store(ptr1, y1, mask=mask)
    tl.store(ptr2, y2, mask=mask)
    return y1, y2


@triton.jit
def _head_weights(norm_ptr, ROT_HALF: tl.constexpr, HALF_PAD: tl.constexpr, IS_NEOX: tl.constexpr):
    """A head norm's weights as one head's halves, ``[1, HALF_PAD]`` each, in float32."""
    w1_ptr, w2_ptr, w_mask = head_halves(norm_ptr, 0, 1, 1, ROT_HALF, HALF_PAD, IS_NEOX)
    w1 = tl.load(w1_ptr, mask=w_mask, other=0.0).to(tl.float32)
    return w1, tl.load(w2_ptr, mask=w_mask, other=0.0).to(tl.float32)


@triton.jit
def token_rotation(token, positions_ptr, cos_sin_ptr, stride_cos_sin, q_norm_ptr, k_norm_ptr,
                   ROT_HALF: tl.constexpr, HALF_PAD: tl.constexpr, IS_NEOX: tl.constexpr, NORM: tl.constexpr):
    """What rotating one token takes besides its heads: its position's cos and sin rows and (``NORM``)
    the head norms' weights, ``(cos, sin, q_w1, q_w2, k_w1, k_w2)``. Step inputs and parameters only,
    so a dependent launch loads them before its wait (``pdl``)."""
    position = tl.load(positions_ptr + token)
    pairs = tl.arange(0, HALF_PAD)
    row = cos_sin_ptr + position * stride_cos_sin + pairs
    cos = tl.load(row, mask=pairs < ROT_HALF, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(row + ROT_HALF, mask=pairs < ROT_HALF, other=0.0).to(tl.float32)[None, :]
    if NORM:
        q_w1, q_w2 = _head_weights(q_norm_ptr, ROT_HALF, HALF_PAD, IS_NEOX)
        k_w1, k_w2 = _head_weights(k_norm_ptr, ROT_HALF, HALF_PAD, IS_NEOX)
    else:  # unused
        q_w1, q_w2, k_w1, k_w2 = cos, sin, cos, sin
    return cos, sin, q_w1, q_w2, k_w1, k_w2


@triton.jit
def rotate_token(token, rotation, q_ptr, k_ptr, stride_qt, stride_qh, stride_kt, stride_kh, num_heads, num_kv_heads,
                 eps, Q_HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr, ROT_HALF: tl.constexpr,
                 HALF_PAD: tl.constexpr, IS_NEOX: tl.constexpr, NORM: tl.constexpr):
    """Rotate every query and key head of one token in place (``NORM``: RMSNorm each head first) by
    ``rotation`` (``token_rotation``'s); returns the keys' rotated halves ``[KV_HEADS_PAD, HALF_PAD]``
    in their dtype. All heads load at once: one memory round trip a token, not one a tensor."""
    cos, sin, q_w1, q_w2, k_w1, k_w2 = rotation
    q1_ptr, q2_ptr, q_mask = head_halves(q_ptr + token * stride_qt, stride_qh, num_heads, Q_HEADS_PAD, ROT_HALF,
                                         HALF_PAD, IS_NEOX)
    k1_ptr, k2_ptr, k_mask = head_halves(k_ptr + token * stride_kt, stride_kh, num_kv_heads, KV_HEADS_PAD,
                                         ROT_HALF, HALF_PAD, IS_NEOX)
    q1 = tl.load(q1_ptr, mask=q_mask, other=0.0).to(tl.float32)
    q2 = tl.load(q2_ptr, mask=q_mask, other=0.0).to(tl.float32)
    k1 = tl.load(k1_ptr, mask=k_mask, other=0.0).to(tl.float32)
    k2 = tl.load(k2_ptr, mask=k_mask, other=0.0).to(tl.float32)
    _rotate_heads(q1_ptr, q2_ptr, q_mask, q1, q2, cos, sin, q_w1, q_w2, eps, ROT_HALF, NORM)
    return _rotate_heads(k1_ptr, k2_ptr, k_mask, k1, k2, cos, sin, k_w1, k_w2, eps, ROT_HALF, NORM)


@triton.jit
def _rotary_kernel(
    positions_ptr, q_ptr, k_ptr, cos_sin_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cos_sin, num_heads, num_kv_heads,
    q_norm_ptr, k_norm_ptr, eps,
    Q_HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr, ROT_HALF: tl.constexpr,
    HALF_PAD: tl.constexpr, IS_NEOX: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    rotation = token_rotation(token, positions_ptr, cos_sin_ptr, stride_cos_sin, q_norm_ptr, k_norm_ptr, ROT_HALF,
                              HALF_PAD, IS_NEOX, NORM)
    wait_for_inputs(PDL)
    rotate_token(token, rotation, q_ptr, k_ptr, stride_qt, stride_qh, stride_kt, stride_kh, num_heads, num_kv_heads,
                 eps, Q_HEADS_PAD, KV_HEADS_PAD, ROT_HALF, HALF_PAD, IS_NEOX, NORM)


def _heads_view(x: torch.Tensor, head_size: int) -> torch.Tensor:
    """``[T, heads, head_size]`` view of ``[T, heads * head_size]`` or ``[T, heads, head_size]``."""
    view = x.view(x.shape[0], -1, head_size)
    assert view.stride(-1) == 1, "head dimension must be contiguous"
    return view


HeadNorms = tuple[torch.Tensor, torch.Tensor, float]
"""(query head norm's weight ``[D]``, key head norm's weight ``[D]``, eps)."""


def rotary_args(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
                head_size: int, is_neox: bool = True, norms: HeadNorms | None = None) -> tuple[tuple, dict]:
    """The rotary kernels' arguments, as ``_rotary_kernel`` takes them: (run-time values, compile-time ones)."""
    q, k = _heads_view(query, head_size), _heads_view(key, head_size)
    rot_dim = cos_sin_cache.shape[-1]
    assert rot_dim <= head_size and rot_dim % 2 == 0 and cos_sin_cache.stride(-1) == 1
    if norms is not None and rot_dim != head_size:
        raise ValueError(f"head norms are fused only where rotary turns the whole head ({rot_dim} of {head_size})")
    q_norm, k_norm, eps = norms if norms is not None else (cos_sin_cache, cos_sin_cache, 0.0)
    values = (positions, q, k, cos_sin_cache, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
              cos_sin_cache.stride(0), q.shape[1], k.shape[1], q_norm, k_norm, eps)
    return values, dict(Q_HEADS_PAD=next_power_of_2(q.shape[1]),
                        KV_HEADS_PAD=next_power_of_2(k.shape[1]),
                        ROT_HALF=rot_dim // 2, HALF_PAD=next_power_of_2(rot_dim // 2), IS_NEOX=is_neox,
                        NORM=norms is not None)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     cos_sin_cache: torch.Tensor, head_size: int, is_neox: bool = True,
                     norms: HeadNorms | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query`` and ``key`` in place by ``positions`` (int64 ``[T]``), each head
    RMS-normalised first with ``norms``; returns both."""
    values, constexprs = rotary_args(positions, query, key, cos_sin_cache, head_size, is_neox, norms)
    if query.shape[0]:
        _rotary_kernel[(query.shape[0],)](*values, **constexprs, num_warps=4, **pdl_launch(query.device))
    return query, key


def rotary_embedding_ref(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                         cos_sin_cache: torch.Tensor, head_size: int,
                         is_neox: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Out-of-place torch version, in the inputs' dtype; returns rotated copies."""
    cos, sin = cos_sin_cache[positions].to(query.dtype).chunk(2, dim=-1)
    return (_rotate_ref(query, cos, sin, head_size, is_neox),
            _rotate_ref(key, cos, sin, head_size, is_neox))


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int,
                is_neox: bool) -> torch.Tensor:
    heads = x.reshape(x.shape[0], -1, head_size)
    rot_dim = 2 * cos.shape[-1]
    rot, rest = heads[..., :rot_dim], heads[..., rot_dim:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if is_neox:
        x1, x2 = rot.chunk(2, dim=-1)
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    return torch.cat([rotated, rest], dim=-1).reshape(x.shape)
