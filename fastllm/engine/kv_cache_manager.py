"""Maps sequences to KV-cache blocks: allocation, prefix-cache hits, and freeing."""

from __future__ import annotations

import hashlib
from array import array

from fastllm.engine.block_pool import Block, BlockPool
from fastllm.engine.sequence import Sequence


def hash_block(parent_hash: bytes, token_ids: list[int], extra: bytes = b"") -> bytes:
    """A block's identity: its tokens (and the content of the images they stand for) and,
    through the parent hash, every token before them."""
    return hashlib.sha256(parent_hash + array("q", token_ids).tobytes() + extra).digest()


class KVCacheManager:
    """Owns the block pool; the scheduler asks it for room and the runner reads block tables."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool):
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks: dict[int, list[Block]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _update_hashes(self, seq: Sequence, num_tokens: int) -> None:
        """Extend ``seq.block_hashes`` over every full block among its first ``num_tokens`` tokens."""
        tokens = seq.token_ids
        size = self.block_size
        for i in range(len(seq.block_hashes), num_tokens // size):
            parent = seq.block_hashes[-1] if seq.block_hashes else seq.cache_salt
            extra = seq.multimodal.block_key(i * size, (i + 1) * size) if seq.multimodal is not None else b""
            seq.block_hashes.append(hash_block(parent, tokens[i * size:(i + 1) * size], extra))

    def match_prefix(self, seq: Sequence) -> list[Block]:
        """The cached blocks that hold a prefix of ``seq``; the last token is always recomputed."""
        if not self.enable_prefix_caching:
            return []
        self._update_hashes(seq, seq.num_tokens - 1)
        hits = []
        for block_hash in seq.block_hashes:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate(self, seq: Sequence, num_new_tokens: int, cached: list[Block] = ()) -> bool:
        """Make room for ``num_new_tokens`` more tokens after the computed (and cached) ones."""
        held = self._blocks.get(seq.seq_id, [])
        total = seq.num_computed_tokens + len(cached) * self.block_size + num_new_tokens
        missing = self.blocks_needed(total) - len(held) - len(cached)
        if missing <= 0 and not cached:  # most decode steps: the last block has room
            return True
        reusable_idle = sum(1 for b in cached if b.ref_count == 0)
        if missing > self.pool.num_free_blocks - reusable_idle:
            return False
        for block in cached:
            self.pool.touch(block)
        new_blocks = self.pool.allocate(max(missing, 0))
        blocks = held + list(cached) + new_blocks
        self._blocks[seq.seq_id] = blocks
        seq.block_table = [b.block_id for b in blocks]
        return True

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Index the full blocks whose keys and values are now in the cache."""
        if not self.enable_prefix_caching:
            return
        self._update_hashes(seq, min(seq.num_computed_tokens, seq.num_tokens))
        blocks = self._blocks.get(seq.seq_id, [])
        for block, block_hash in zip(blocks, seq.block_hashes):
            self.pool.register(block, block_hash)

    def free(self, seq: Sequence) -> None:
        blocks = self._blocks.pop(seq.seq_id, [])
        self.pool.release(list(reversed(blocks)))
        seq.block_table = []

    def usage(self) -> float:
        return self.pool.usage()
