import pytest
import torch

from fastllm_kernels.rms_norm import rms_norm_ref
from fastllm_kernels.rotary import rotary_embedding, rotary_embedding_ref
from kernel_testing import DEVICE, DTYPES, TOLERANCE, randn, rel_err


def cos_sin_cache(max_position: int, rot_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim)
    freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_size,rot_dim", [
    (8, 2, 64, 64),
    (6, 3, 128, 64),   # partial rotary; head counts not powers of two
])
def test_rotary_matches_reference(dtype, is_neox, num_heads, num_kv_heads, head_size, rot_dim):
    tokens = 5
    cache = cos_sin_cache(4096, rot_dim)
    positions = torch.randint(0, 4096, (tokens,), device=DEVICE)
    # query and key as [T, heads * head_size] slices of one fused projection output.
    qkv = randn(tokens, (num_heads + 2 * num_kv_heads) * head_size, dtype=dtype)
    query = qkv[:, :num_heads * head_size]
    key = qkv[:, num_heads * head_size:(num_heads + num_kv_heads) * head_size]
    value_before = qkv[:, (num_heads + num_kv_heads) * head_size:].clone()
    q_ref, k_ref = rotary_embedding_ref(positions, query.double(), key.double(), cache.double(),
                                        head_size, is_neox)

    q_out, k_out = rotary_embedding(positions, query, key, cache, head_size, is_neox)

    assert q_out.data_ptr() == query.data_ptr() and k_out.data_ptr() == key.data_ptr()
    assert rel_err(query, q_ref) < TOLERANCE[dtype]
    assert rel_err(key, k_ref) < TOLERANCE[dtype]
    assert torch.equal(qkv[:, (num_heads + num_kv_heads) * head_size:], value_before)


def test_rotary_accepts_three_dimensional_heads():
    cache = cos_sin_cache(64, 32)
    positions = torch.randint(0, 64, (3,), device=DEVICE)
    query, key = randn(3, 4, 32, dtype=torch.float32), randn(3, 2, 32, dtype=torch.float32)
    q_ref, k_ref = rotary_embedding_ref(positions, query.double(), key.double(), cache.double(), 32)

    rotary_embedding(positions, query, key, cache, 32)

    assert rel_err(query, q_ref) < 1e-4 and rel_err(key, k_ref) < 1e-4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_with_head_norms_matches_norm_then_rotary(dtype, is_neox):
    """Qwen3's per-head RMSNorm fused before the rotation, against float64 norm-then-rotate."""
    tokens, heads, kv_heads, head_size = 5, 6, 2, 64
    cache = cos_sin_cache(512, head_size)
    positions = torch.randint(0, 512, (tokens,), device=DEVICE)
    query, key = randn(tokens, heads, head_size, dtype=dtype) * 3, randn(tokens, kv_heads, head_size, dtype=dtype)
    q_weight, k_weight = randn(head_size, dtype=dtype), randn(head_size, dtype=dtype)
    eps = 1e-6
    q_ref, k_ref = rotary_embedding_ref(positions, rms_norm_ref(query.double(), q_weight.double(), eps),
                                        rms_norm_ref(key.double(), k_weight.double(), eps), cache.double(),
                                        head_size, is_neox)

    q_out, k_out = rotary_embedding(positions, query, key, cache, head_size, is_neox, norms=(q_weight, k_weight, eps))

    assert rel_err(q_out, q_ref) < TOLERANCE[dtype] and rel_err(k_out, k_ref) < TOLERANCE[dtype]


def test_head_norms_need_the_whole_head_rotated():
    query, key = randn(2, 2, 64, dtype=torch.float32), randn(2, 1, 64, dtype=torch.float32)
    weight = torch.ones(64, device=DEVICE)
    with pytest.raises(ValueError, match="whole head"):
        rotary_embedding(torch.zeros(2, dtype=torch.long, device=DEVICE), query, key, cos_sin_cache(8, 32), 64,
                         norms=(weight, weight, 1e-6))
