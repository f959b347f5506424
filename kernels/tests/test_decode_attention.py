import pytest
import torch

from fastllm_kernels.decode_attention import DecodeTiling, paged_decode_attention, paged_decode_attention_ref
from kernel_testing import DEVICE, DTYPES, TOLERANCE, nan_like, paged_kv, randn, rel_err

SEQ_LENS = [1, 37, 300, 777]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size,num_heads,num_kv_heads,head_dim", [
    (16, 8, 2, 64),    # GQA group of 4
    (32, 4, 4, 32),    # plain multi-head
    (64, 6, 1, 128),   # a group of 6: not a power of two
    (16, 4, 2, 256),
])
@pytest.mark.parametrize("num_splits", [1, 5, None])
def test_decode_matches_reference(dtype, block_size, num_heads, num_kv_heads, head_dim, num_splits):
    k_cache, v_cache, block_tables = paged_kv(SEQ_LENS, block_size, num_kv_heads, head_dim, dtype)
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int32, device=DEVICE)
    q = randn(len(SEQ_LENS), num_heads, head_dim, dtype=dtype)
    scale = head_dim ** -0.5

    out = paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale,
                                 out=nan_like(q), num_splits=num_splits)
    ref = paged_decode_attention_ref(q.double(), k_cache.double(), v_cache.double(),
                                     block_tables, seq_lens, scale)

    assert rel_err(out, ref) < TOLERANCE[dtype]


def test_decode_splits_a_long_context():
    """A 4k context in 16 pieces, with a short neighbour that leaves most pieces empty."""
    lens = [4100, 20]
    k_cache, v_cache, block_tables = paged_kv(lens, 64, 2, 64, torch.float32)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = randn(2, 4, 64, dtype=torch.float32)

    out = paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, 0.125,
                                 out=nan_like(q), num_splits=16)
    ref = paged_decode_attention_ref(q.double(), k_cache.double(), v_cache.double(),
                                     block_tables, seq_lens, 0.125)

    assert rel_err(out, ref) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("preload_values", [False, True])
@pytest.mark.parametrize("num_splits", [1, 32])
def test_padding_and_short_contexts_under_many_pieces(num_splits, preload_values):
    """A grid sized for long contexts (as CUDA graphs capture it): a padding row (seq_len 0) gets
    zeros, short contexts fill their first pieces only, and the merge reads just those; unsplit, the
    padding row's first tile (loaded before the wait) holds no key (nor value: ``preload_values``)."""
    lens = [0, 5, 130]
    k_cache, v_cache, block_tables = paged_kv(lens, 16, 2, 64, torch.float32)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = randn(len(lens), 4, 64, dtype=torch.float32)

    out = paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, 0.125, out=nan_like(q),
                                 num_splits=num_splits, tiling=DecodeTiling(64, 4, 3, preload_values))
    ref = paged_decode_attention_ref(q[1:], k_cache, v_cache, block_tables[1:], seq_lens[1:], 0.125)

    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert rel_err(out[1:], ref) < TOLERANCE[torch.float32]


def test_split_count_changes_only_summation_order():
    """The batch size picks the number of splits, so a sequence's output should not depend on
    it. With an integer running max every rescale is exact and each probability rounds to fp16
    the same in any split; only fp32 summation order differs, which tips an output's rounding
    rarely (0.07% here; 12% with the exact running max)."""
    lens = [37, 300, 777]
    k_cache, v_cache, block_tables = paged_kv(lens, 16, 2, 64, torch.float16)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = randn(len(lens), 8, 64, dtype=torch.float16) * 3

    whole, split = (paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, 0.125, num_splits=n)
                    for n in (1, 5))

    assert (whole != split).float().mean() < 0.01


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_reads_fp8_cache(dtype, cache_dtype):
    """fp8 caches are upcast to the query's dtype as they are loaded."""
    k_cache, v_cache, block_tables = paged_kv(SEQ_LENS, 16, 2, 64, cache_dtype)
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int32, device=DEVICE)
    q = randn(len(SEQ_LENS), 8, 64, dtype=dtype)

    out = paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, 0.125, out=nan_like(q))
    ref = paged_decode_attention_ref(q.double(), k_cache.double(), v_cache.double(),
                                     block_tables, seq_lens, 0.125)

    assert rel_err(out, ref) < TOLERANCE[dtype]
