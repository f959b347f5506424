"""Scatter this step's keys and values into the paged KV cache.

Cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]``, so one slot
(``block_id * block_size + offset``) holds all kv heads of one token contiguously and a
token is one contiguous copy. Negative slots are padding (CUDA-graph batches) and are skipped.

fp8 caches (``float8_e4m3fn``, ``float8_e5m2``) hold values unscaled, clamped to the format's
finite range first: a plain cast of an out-of-range value gives NaN (e4m3) or inf (e5m2).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastllm_kernels.host_math import next_power_of_2
from fastllm_kernels.pdl import pdl_launch, wait_for_inputs
from fastllm_kernels.rotary import HeadNorms, head_halves, rotary_args, rotate_token, token_rotation


@triton.jit
def _to_cache(values, cache_ptrs, slot, mask, SATURATE: tl.constexpr):
    """Store ``values`` at ``cache_ptrs`` in ``slot`` (none for a negative slot); fp8 caches clamp
    to their largest finite value first, then round."""
    if SATURATE > 0:
        values = tl.minimum(tl.maximum(values.to(tl.float32), -SATURATE), SATURATE)
    # slot broadcast first: the interpreter mishandles `tensor & scalar` masks
    tl.store(cache_ptrs, values.to(cache_ptrs.dtype.element_ty), mask=mask & (mask.to(tl.int64) * 0 + slot >= 0))


@triton.jit
def _write_token(token, key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                 stride_kt, stride_kh, stride_vt, stride_vh, stride_cache_slot,
                 NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                 SATURATE: tl.constexpr):
    """Copy one token's keys and values into its slot (none for a negative slot)."""
    slot = tl.load(slot_mapping_ptr + token)
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_DIM)
    mask = (heads < NUM_KV_HEADS)[:, None] & (dims < HEAD_DIM)[None, :]
    k = tl.load(key_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    dst = slot * stride_cache_slot + heads[:, None] * HEAD_DIM + dims[None, :]
    _to_cache(k, k_cache_ptr + dst, slot, mask, SATURATE)
    _to_cache(v, v_cache_ptr + dst, slot, mask, SATURATE)


@triton.jit
def _write_kv_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_cache_slot,
    NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    SATURATE: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    _write_token(tl.program_id(0), key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, stride_kt,
                 stride_kh, stride_vt, stride_vh, stride_cache_slot, NUM_KV_HEADS, HEADS_PAD, HEAD_DIM, SATURATE)


@triton.jit
def _rotary_write_kernel(
    positions_ptr, q_ptr, k_ptr, cos_sin_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cos_sin, num_heads, num_kv_heads,
    q_norm_ptr, k_norm_ptr, eps,
    value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, stride_vt, stride_vh, stride_cache_slot,
    Q_HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr, ROT_HALF: tl.constexpr,
    HALF_PAD: tl.constexpr, IS_NEOX: tl.constexpr, NORM: tl.constexpr, HEAD_DIM: tl.constexpr,
    SATURATE: tl.constexpr, PDL: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    rotation = token_rotation(token, positions_ptr, cos_sin_ptr, stride_cos_sin, q_norm_ptr, k_norm_ptr, ROT_HALF,
                              HALF_PAD, IS_NEOX, NORM)
    slot = tl.load(slot_mapping_ptr + token)  # a step input, as the position: before the wait too
    wait_for_inputs(PDL)
    if 2 * ROT_HALF == HEAD_DIM:  # the rotated halves are the whole key: stored from registers
        heads = tl.arange(0, KV_HEADS_PAD)
        dims = tl.arange(0, HEAD_DIM)
        mask = (heads < num_kv_heads)[:, None] & (dims < HEAD_DIM)[None, :]
        v = tl.load(value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
        k1, k2 = rotate_token(token, rotation, q_ptr, k_ptr, stride_qt, stride_qh, stride_kt, stride_kh, num_heads,
                              num_kv_heads, eps, Q_HEADS_PAD, KV_HEADS_PAD, ROT_HALF, HALF_PAD, IS_NEOX, NORM)
        # the slot holds the token's heads as the key tensor holds them, HEAD_DIM apart
        k1_ptrs, k2_ptrs, half_mask = head_halves(k_cache_ptr + slot * stride_cache_slot, HEAD_DIM, num_kv_heads,
                                                   KV_HEADS_PAD, ROT_HALF, HALF_PAD, IS_NEOX)
        _to_cache(k1, k1_ptrs, slot, half_mask, SATURATE)
        _to_cache(k2, k2_ptrs, slot, half_mask, SATURATE)
        _to_cache(v, v_cache_ptr + slot * stride_cache_slot + heads[:, None] * HEAD_DIM + dims[None, :], slot, mask,
                  SATURATE)
    else:  # partial rotary: the key's other dims come along in the copy
        rotate_token(token, rotation, q_ptr, k_ptr, stride_qt, stride_qh, stride_kt, stride_kh, num_heads,
                     num_kv_heads, eps, Q_HEADS_PAD, KV_HEADS_PAD, ROT_HALF, HALF_PAD, IS_NEOX, NORM)
        tl.debug_barrier()  # the rotated keys, stored by every thread, are what the copy reads
        _write_token(token, k_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, stride_kt, stride_kh,
                     stride_vt, stride_vh, stride_cache_slot, num_kv_heads, KV_HEADS_PAD, HEAD_DIM, SATURATE)


def _check_layouts(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor) -> tuple[int, int, int]:
    """``key``'s (tokens, kv heads, head dim), once the layouts the kernels index are checked."""
    num_tokens, num_kv_heads, head_dim = key.shape
    assert key.stride(-1) == 1 and value.stride(-1) == 1, "head_dim must be contiguous"
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    assert k_cache.shape[2:] == (num_kv_heads, head_dim), "cache is [blocks, block_size, KVH, D]"
    return num_tokens, num_kv_heads, head_dim


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Copy ``key``/``value`` ``[T, KVH, D]`` into their slots, in place; slot < 0 is skipped.

    ``key`` and ``value`` may be strided views (e.g. slices of a fused QKV output) as long as
    the head dimension is contiguous.
    """
    num_tokens, num_kv_heads, head_dim = _check_layouts(key, value, k_cache, v_cache)
    if num_tokens == 0:
        return
    _write_kv_cache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1), k_cache.stride(1),
        NUM_KV_HEADS=num_kv_heads, HEADS_PAD=next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim, SATURATE=_fp8_max(k_cache.dtype), num_warps=4,
        **pdl_launch(key.device),
    )


def rotary_write_kv_cache(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          slot_mapping: torch.Tensor, is_neox: bool = True, norms: HeadNorms | None = None) -> None:
    """``rotary_embedding`` of ``query`` and ``key`` (in place; ``norms``: each head RMS-normalised
    first), then ``write_kv_cache`` of the rotated keys and ``value``, in one launch: one kernel
    less a layer in every decode step (three less with head norms). Where rotary turns the whole
    head, the keys go to the cache from registers, and the values are loaded with the heads: no
    round trip to memory after the rotation."""
    num_tokens, _, head_dim = _check_layouts(key, value, k_cache, v_cache)
    if num_tokens == 0:
        return
    values, constexprs = rotary_args(positions, query, key, cos_sin_cache, head_dim, is_neox, norms)
    _rotary_write_kernel[(num_tokens,)](
        *values, value, k_cache, v_cache, slot_mapping, value.stride(0), value.stride(1), k_cache.stride(1),
        **constexprs, HEAD_DIM=head_dim, SATURATE=_fp8_max(k_cache.dtype), num_warps=4, **pdl_launch(key.device),
    )


def _fp8_max(dtype: torch.dtype) -> float:
    """The clamp limit of an fp8 cache; 0.0 (no clamp) for 16/32-bit caches."""
    return torch.finfo(dtype).max if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else 0.0


def write_kv_cache_ref(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Plain torch version of :func:`write_kv_cache`."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    limit = _fp8_max(k_cache.dtype)
    for x, cache in ((key[valid], k_cache), (value[valid], v_cache)):
        if limit:  # fp8: clamp, round, then copy bytes (CPU index kernels lack fp8)
            x, cache = x.clamp(-limit, limit).to(cache.dtype).view(torch.uint8), cache.view(torch.uint8)
        cache.view(-1, *cache.shape[2:])[slots] = x.to(cache.dtype)
