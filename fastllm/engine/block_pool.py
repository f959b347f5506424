"""The pool of KV-cache blocks: reference counts, free LRU order, and the prefix-hash index."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional


@dataclass(eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: Optional[bytes] = None


class BlockPool:
    """Hands out blocks; a freed block keeps its hash until it is reused (evicted LRU-first).

    Block 0 is never handed out: padded block tables point at it, so writes through
    padding land in a block no sequence reads.
    """

    def __init__(self, num_blocks: int, enable_caching: bool):
        if num_blocks < 2:
            raise ValueError(f"the KV cache needs at least 2 blocks, got {num_blocks}")
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.enable_caching = enable_caching
        self.free_blocks: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks[1:])
        self.cached: dict[bytes, Block] = {}

    @property
    def num_usable_blocks(self) -> int:
        return len(self.blocks) - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def lookup(self, block_hash: bytes) -> Optional[Block]:
        return self.cached.get(block_hash)

    def touch(self, block: Block) -> None:
        """Take a reference on a cached block, pulling it out of the free list if idle."""
        if block.ref_count == 0:
            del self.free_blocks[block.block_id]
        block.ref_count += 1

    def allocate(self, count: int) -> list[Block]:
        if count > len(self.free_blocks):
            raise RuntimeError(f"asked for {count} blocks, {len(self.free_blocks)} free")
        taken = []
        for _ in range(count):
            _, block = self.free_blocks.popitem(last=False)
            if block.block_hash is not None:
                del self.cached[block.block_hash]
                block.block_hash = None
            block.ref_count = 1
            taken.append(block)
        return taken

    def release(self, blocks: list[Block]) -> None:
        """Drop one reference each; idle blocks join the free list's most-recent end."""
        for block in blocks:
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block.block_id} released twice"
            if block.ref_count == 0:
                if block.block_hash is None:
                    self.free_blocks[block.block_id] = block
                    self.free_blocks.move_to_end(block.block_id, last=False)
                else:
                    self.free_blocks[block.block_id] = block

    def register(self, block: Block, block_hash: bytes) -> None:
        """Index a full block by the hash of its tokens and everything before them."""
        if not self.enable_caching or block.block_hash is not None or block_hash in self.cached:
            return
        block.block_hash = block_hash
        self.cached[block_hash] = block
