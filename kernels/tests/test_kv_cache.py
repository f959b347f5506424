import pytest
import torch

from fastllm_kernels.kv_cache import rotary_write_kv_cache, write_kv_cache, write_kv_cache_ref
from fastllm_kernels.rotary import rotary_embedding
from kernel_testing import DEVICE, DTYPES, randn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size,num_kv_heads,head_dim", [(16, 2, 64), (64, 3, 128), (32, 1, 32)])
def test_write_kv_cache_matches_reference(dtype, block_size, num_kv_heads, head_dim):
    num_tokens, num_blocks = 9, 4
    # Keys and values as slices of one fused projection output, as the model produces them.
    qkv = randn(num_tokens, 4 * num_kv_heads, head_dim, dtype=dtype)
    key, value = qkv[:, :num_kv_heads], qkv[:, 2 * num_kv_heads:3 * num_kv_heads]
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:num_tokens]
    slots[[2, 5]] = -1
    k_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    v_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()

    write_kv_cache(key, value, k_cache, v_cache, slots)
    write_kv_cache_ref(key, value, k_ref, v_ref, slots)

    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_write_fp8_cache_saturates(cache_dtype):
    """Out-of-range values clamp to the largest finite fp8 value instead of becoming NaN/inf.

    The inputs are otherwise exactly representable: the interpreter rounds fp8 inexactly.
    """
    limit = torch.finfo(cache_dtype).max
    key, value = (randn(6, 2, 32, dtype=torch.float32).to(cache_dtype).float() for _ in range(2))
    key[0, 0, :4] = torch.tensor([3 * limit, -3 * limit, float("inf"), -float("inf")])
    value[1, 1, :2] = torch.tensor([2 * limit, -2 * limit])
    slots = torch.tensor([3, 17, -1, 0, 30, 8], device=DEVICE)
    k_cache = _write_matches_ref(key, value, slots, (2, 16, 2, 32), cache_dtype)
    assert k_cache.float().view(-1, 2, 32)[3, 0, :4].tolist() == [limit, -limit, limit, -limit]


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the interpreter rounds fp8 inexactly")
@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_write_fp8_cache_rounds_as_torch(dtype, cache_dtype):
    """Any input (a third of it past the format's range) lands in the same bytes as torch's cast."""
    key, value = (randn(9, 2, 64, dtype=dtype) * torch.finfo(cache_dtype).max for _ in range(2))
    slots = torch.randperm(64, device=DEVICE)[:9]
    slots[4] = -1
    _write_matches_ref(key, value, slots, (4, 16, 2, 64), cache_dtype)


def _write_matches_ref(key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor, shape: tuple[int, ...],
                       cache_dtype: torch.dtype) -> torch.Tensor:
    """Write through the kernel and the reference into zeroed fp8 caches; both must hold the same bytes."""
    k_cache = torch.zeros(shape, dtype=cache_dtype, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv_cache(key, value, k_cache, v_cache, slots)
    write_kv_cache_ref(key, value, k_ref, v_ref, slots)
    assert torch.equal(k_cache.view(torch.uint8), k_ref.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), v_ref.view(torch.uint8))
    return k_cache


FP8_ON_CUDA = [torch.float8_e4m3fn] if DEVICE.type == "cuda" else []  # the interpreter rounds fp8 inexactly


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rot_dim,head_norms,is_neox,cache_dtype", [
    (64, False, True, None), (32, False, True, None), (64, True, True, None),  # 32: partial rotary
    (64, False, False, None)] + [(64, True, True, fp8) for fp8 in FP8_ON_CUDA])
def test_rotary_write_matches_rotary_then_write(dtype, rot_dim, head_norms, is_neox, cache_dtype):
    """One launch: query and key rotated in place (each head RMS-normalised first with
    ``head_norms``; NeoX halves or GPT-J pairs), the rotated keys and the values in the cache, bit for
    bit what the rotary kernel and then the cache write give (test_rotary.py checks the rotation
    against torch)."""
    num_tokens, heads, kv_heads, head_dim, block_size = 7, 4, 2, 64, 16
    qkv = randn(num_tokens, heads + 2 * kv_heads, head_dim, dtype=dtype)
    qkv_ref, original = qkv.clone(), qkv.clone()
    positions = torch.tensor([0, 5, 9, 100, 3, 64, 200], device=DEVICE)
    cos_sin = randn(256, rot_dim, dtype=torch.float32)
    slots = torch.randperm(4 * block_size, device=DEVICE)[:num_tokens]
    slots[3] = -1
    k_cache = randn(4, block_size, kv_heads, head_dim, dtype=dtype).to(cache_dtype or dtype)
    v_cache = randn(4, block_size, kv_heads, head_dim, dtype=dtype).to(cache_dtype or dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()

    def split(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x[:, :heads], x[:, heads:heads + kv_heads], x[:, heads + kv_heads:]

    norms = (randn(head_dim, dtype=dtype), randn(head_dim, dtype=dtype), 1e-6) if head_norms else None
    query, key, value = split(qkv_ref)
    rotary_embedding(positions, query, key, cos_sin, head_dim, is_neox, norms)
    write_kv_cache(key, value, k_ref, v_ref, slots)
    rotary_write_kv_cache(positions, *split(qkv), cos_sin, k_cache, v_cache, slots, is_neox, norms)

    assert torch.equal(qkv, qkv_ref) and not torch.equal(qkv[:, :heads + kv_heads], original[:, :heads + kv_heads])
    assert torch.equal(k_cache.view(torch.uint8), k_ref.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), v_ref.view(torch.uint8))
