import pytest
import torch

from fastllm_kernels.kv_cache import write_kv_cache, write_kv_cache_ref
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
