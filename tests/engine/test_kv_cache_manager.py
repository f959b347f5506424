"""Block pool and KV-cache manager: allocation, prefix hits, LRU eviction, no leaks."""

from __future__ import annotations

from fastllm.engine.kv_cache_manager import KVCacheManager
from fastllm.engine.sequence import Sequence
from fastllm.sampling_params import SamplingParams


def _seq(tokens: list[int]) -> Sequence:
    return Sequence("r", 0, tokens, SamplingParams(), frozenset({2}), 4096)


def test_allocate_and_free_returns_every_block():
    kv = KVCacheManager(num_blocks=9, block_size=4, enable_prefix_caching=False)
    seq = _seq(list(range(10)))
    assert kv.allocate(seq, 10)
    assert len(seq.block_table) == 3 and 0 not in seq.block_table
    assert kv.num_free_blocks == 5
    assert not kv.allocate(_seq(list(range(30))), 30)  # needs 8 blocks, 5 free
    kv.free(seq)
    assert kv.num_free_blocks == 8 and seq.block_table == []


def test_prefix_hits_share_blocks_and_leave_last_token():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    first = _seq(list(range(12)))
    assert kv.allocate(first, 12)
    first.num_computed_tokens = 12
    kv.cache_computed_blocks(first)
    second = _seq(list(range(12)))
    hits = kv.match_prefix(second)
    assert [b.block_id for b in hits] == first.block_table[:2]  # the last token is recomputed
    assert kv.allocate(second, 4, hits)
    assert second.block_table[:2] == first.block_table[:2]
    assert hits[0].ref_count == 2
    kv.free(first)
    kv.free(second)
    assert kv.num_free_blocks == 15


def test_cached_blocks_are_evicted_lru_and_unhashed():
    kv = KVCacheManager(num_blocks=5, block_size=2, enable_prefix_caching=True)
    seq = _seq([1, 2, 3, 4, 5])
    kv.allocate(seq, 5)
    seq.num_computed_tokens = 5
    kv.cache_computed_blocks(seq)
    kv.free(seq)
    assert len(kv.pool.cached) == 2
    other = _seq([9] * 8)
    assert kv.allocate(other, 8)  # takes all 4 usable blocks: both cached blocks evicted
    assert not kv.pool.cached
    assert kv.match_prefix(_seq([1, 2, 3, 4, 5])) == []


def test_different_prefixes_do_not_hit():
    kv = KVCacheManager(num_blocks=8, block_size=2, enable_prefix_caching=True)
    seq = _seq([1, 2, 3, 4, 5])
    kv.allocate(seq, 5)
    seq.num_computed_tokens = 5
    kv.cache_computed_blocks(seq)
    assert len(kv.match_prefix(_seq([1, 2, 7, 4, 5]))) == 1
    assert kv.match_prefix(_seq([7, 2, 3, 4, 5])) == []


def test_a_cache_salt_keeps_adapters_apart_and_shares_within_one():
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    first = _seq(list(range(12)))
    first.cache_salt = b"adapter:1"
    assert kv.allocate(first, 12)
    first.num_computed_tokens = 12
    kv.cache_computed_blocks(first)
    for salt, hits in [(b"", 0), (b"adapter:2", 0), (b"adapter:1", 2)]:
        seq = _seq(list(range(12)))
        seq.cache_salt = salt
        assert len(kv.match_prefix(seq)) == hits
