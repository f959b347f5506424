import pytest
import torch

from fastllm_kernels.extend_attention import paged_extend_attention, paged_extend_attention_ref
from kernel_testing import DEVICE, DTYPES, TOLERANCE, nan_like, paged_kv, randn, rel_err

# (cached prefix, query length) per sequence, packed into one launch.
PREFILL = [(0, 70), (100, 5), (37, 1), (64, 64), (0, 3)]
VERIFY = [(90, 4), (15, 2), (200, 8), (7, 3)]


def run(runs, dtype, block_size, num_heads, num_kv_heads, head_dim, max_query_len=None,
        cache_dtype=None):
    lens = [prefix + q_len for prefix, q_len in runs]
    k_cache, v_cache, block_tables = paged_kv(lens, block_size, num_kv_heads, head_dim,
                                              cache_dtype or dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q_lens = torch.tensor([0] + [q_len for _, q_len in runs])
    query_start_loc = q_lens.cumsum(0).to(torch.int32).to(DEVICE)
    max_query_len = max_query_len or int(q_lens.max())
    q = randn(int(q_lens.sum()), num_heads, head_dim, dtype=dtype)
    scale = head_dim ** -0.5

    out = paged_extend_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
                                 max_query_len, scale, out=nan_like(q))
    ref = paged_extend_attention_ref(q.double(), k_cache.double(), v_cache.double(), block_tables,
                                     query_start_loc, seq_lens, max_query_len, scale)
    return rel_err(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size,num_heads,num_kv_heads,head_dim", [
    (16, 8, 2, 64),
    (32, 4, 4, 32),
    (64, 6, 2, 128),   # a group of 3
    (16, 2, 1, 256),
])
def test_prefill_with_cached_prefix_matches_reference(dtype, block_size, num_heads, num_kv_heads,
                                                      head_dim):
    assert run(PREFILL, dtype, block_size, num_heads, num_kv_heads, head_dim) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_speculative_verification_matches_reference(dtype):
    assert run(VERIFY, dtype, 16, 8, 2, 64) < TOLERANCE[dtype]


def test_overestimated_max_query_len_is_harmless():
    assert run(VERIFY, torch.float32, 32, 4, 1, 64, max_query_len=40) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_extend_reads_fp8_cache(dtype, cache_dtype):
    """fp8 caches are upcast to the query's dtype as they are loaded."""
    assert run(PREFILL, dtype, 16, 8, 2, 64, cache_dtype=cache_dtype) < TOLERANCE[dtype]
