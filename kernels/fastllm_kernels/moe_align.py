"""The (token, slot) pairs of a mixture-of-experts step grouped by expert, for the grouped GEMMs.

Each expert's run of pairs is padded to whole blocks of ``block_m`` slots, so a GEMM tile never
straddles two experts; within a run the pairs keep their order (deterministic). Two launches
serve every step size, from a decode of a few sequences to a prefill of thousands of tokens: the
pairs are cut into chunks of ``ALIGN_CHUNK``, one program a chunk, and the first launch counts
each chunk's pairs per expert; in the second every chunk reads that table (its experts' runs
start after the padded runs of smaller experts and after earlier chunks' pairs), sorts its own
pairs by expert in registers and stores each in its slot. No host sync, grids fixed by shapes
alone: a decode step replays inside a CUDA graph. (One program sorting every pair, as before,
was slower than a layer's decode attention at a few hundred tokens, and beyond 4,096 pairs a torch
sort took a dozen launches: benchmarks/RESULTS.md.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fastllm_kernels.host_math import cdiv, next_power_of_2

ALIGN_CHUNK = 256
"""Pairs one alignment program sorts in registers."""
ONE_PAIR_BLOCKS_SHARE = 8
"""Pairs go one a block, ungrouped, while there are at most an eighth as many as experts."""


@dataclass(frozen=True)
class ExpertBlocks:
    """Pairs grouped by expert. ``sorted_pairs [num_blocks * block_m]``: pair ids (``token * k +
    slot``), each expert's run padded to whole blocks with ``num_pairs`` (no pair); slots past
    ``num_padded`` are never read and hold anything; ``expert_ids [num_blocks]``: each block's
    expert (``num_experts`` past the end); ``num_padded [1]``: slots in use. ``num_blocks`` is an
    upper bound from the shapes. ``block_m`` None: one pair a block, in pair order
    (``one_pair_blocks``)."""

    sorted_pairs: torch.Tensor
    expert_ids: torch.Tensor
    num_padded: torch.Tensor
    block_m: int | None

    @property
    def num_blocks(self) -> int:
        return self.expert_ids.shape[0]


def one_pair_a_block(num_pairs: int, num_experts: int) -> bool:
    """Whether ``num_pairs`` go one a block (``ONE_PAIR_BLOCKS_SHARE``) rather than grouped by expert."""
    return num_pairs * ONE_PAIR_BLOCKS_SHARE <= num_experts


def one_pair_blocks(topk_ids: torch.Tensor) -> ExpertBlocks:
    """Block ``p`` holds pair ``p`` alone: no grouping launch. For a handful of pairs (batch-1
    decode), where experts rarely repeat, so hardly a weight byte is read twice."""
    expert_ids = topk_ids.reshape(-1)
    return ExpertBlocks(expert_ids, expert_ids, expert_ids, None)


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """At most one partial block per expert that gets a pair, beyond the full ones."""
    return cdiv(num_pairs, block_m) + min(num_experts, num_pairs)


@triton.jit
def _chunk_experts(ids_ptr, chunk, num_pairs, num_experts, CHUNK: tl.constexpr):
    """The experts of chunk ``chunk``'s pairs; ``num_experts`` for slots past the last pair."""
    pair = chunk * CHUNK + tl.arange(0, CHUNK)
    return tl.load(ids_ptr + pair, mask=pair < num_pairs, other=num_experts).to(tl.int32)


# the pair count changes with every step's token count: one variant serves them all
@triton.jit(do_not_specialize=["num_pairs"])
def _count_kernel(ids_ptr, counts_ptr, num_pairs, num_experts, EXPERTS: tl.constexpr, CHUNK: tl.constexpr):
    """Row ``c`` of ``counts [chunks, EXPERTS]``: chunk ``c``'s pairs per expert (the last column
    in use counts the slots past the last pair, and is ignored)."""
    chunk = tl.program_id(0)
    experts = _chunk_experts(ids_ptr, chunk, num_pairs, num_experts, CHUNK)
    tl.store(counts_ptr + chunk * EXPERTS + tl.arange(0, EXPERTS), tl.histogram(experts, EXPERTS))


@triton.jit(do_not_specialize=["num_pairs", "num_blocks", "num_chunks"])
def _place_kernel(ids_ptr, counts_ptr, sorted_ptr, expert_ids_ptr, num_padded_ptr, num_pairs, num_experts,
                  num_blocks, num_chunks, BLOCK_M: tl.constexpr, EXPERTS: tl.constexpr, CHUNK: tl.constexpr,
                  ROWS: tl.constexpr, PAD: tl.constexpr):
    """Chunk ``c``'s pairs into their slots: an expert's run starts after the padded runs of the
    experts before it, and a pair's slot in the run is the count of that expert's pairs in earlier
    chunks plus its rank among the chunk's own (a sort of packed (expert, pair) keys). Program 0
    also writes the padding, each block's expert and the slots in use: the padding slots are no
    pair's, so no program overwrites another's stores."""
    chunk = tl.program_id(0)
    bins = tl.arange(0, EXPERTS)
    total = tl.zeros((EXPERTS,), dtype=tl.int32)
    before = tl.zeros((EXPERTS,), dtype=tl.int32)
    for first in range(0, num_chunks, ROWS):
        rows = first + tl.arange(0, ROWS)
        counts = tl.load(counts_ptr + rows[:, None] * EXPERTS + bins[None, :], mask=(rows < num_chunks)[:, None],
                         other=0)
        total += tl.sum(counts, 0)
        before += tl.sum(tl.where((rows < chunk)[:, None], counts, 0), 0)
    total = tl.where(bins < num_experts, total, 0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    experts = _chunk_experts(ids_ptr, chunk, num_pairs, num_experts, CHUNK)
    mine = tl.histogram(experts, EXPERTS)
    keys = tl.sort(experts * CHUNK + tl.arange(0, CHUNK))
    expert = keys // CHUNK
    # sorted position i holds the (i - pairs of smaller experts in the chunk)-th pair of its expert here
    shift = ends - padded + before - (tl.cumsum(mine, 0) - mine)
    slot = tl.gather(shift, tl.minimum(expert, EXPERTS - 1), 0) + tl.arange(0, CHUNK)
    tl.store(sorted_ptr + slot, chunk * CHUNK + keys % CHUNK, mask=expert < num_experts)
    if chunk == 0:
        tail = ends - padded + total  # first padding slot of each run
        for step in range(0, BLOCK_M, PAD):
            pad = step + tl.arange(0, PAD)
            tl.store(sorted_ptr + tail[:, None] + pad[None, :], num_pairs,
                     mask=(pad[None, :] < (padded - total)[:, None]))
        for start in range(0, num_blocks, 64):
            block = start + tl.arange(0, 64)
            ended = (ends[None, :] <= block[:, None] * BLOCK_M) & (bins < num_experts)[None, :]
            tl.store(expert_ids_ptr + block, tl.sum(ended.to(tl.int32), 1), mask=block < num_blocks)
        tl.store(num_padded_ptr, tl.sum(padded, 0))


def moe_align_block_size(topk_ids: torch.Tensor, block_m: int, num_experts: int) -> ExpertBlocks:
    """Group the pairs of ``topk_ids [T, k]`` by expert into blocks of ``block_m`` slots."""
    ids = topk_ids.reshape(-1)
    num_pairs = ids.numel()
    blocks = max_blocks(num_pairs, num_experts, block_m)
    chunks = max(1, cdiv(num_pairs, ALIGN_CHUNK))
    experts = next_power_of_2(num_experts + 1)  # one more bin: the slots past the last pair
    counts = torch.empty(chunks, experts, dtype=torch.int32, device=ids.device)
    sorted_pairs = torch.empty(blocks * block_m, dtype=torch.int32, device=ids.device)
    expert_ids = torch.empty(blocks, dtype=torch.int32, device=ids.device)
    num_padded = torch.empty(1, dtype=torch.int32, device=ids.device)
    _count_kernel[(chunks,)](ids, counts, num_pairs, num_experts, EXPERTS=experts, CHUNK=ALIGN_CHUNK)
    _place_kernel[(chunks,)](ids, counts, sorted_pairs, expert_ids, num_padded, num_pairs, num_experts, blocks,
                             chunks, BLOCK_M=block_m, EXPERTS=experts, CHUNK=ALIGN_CHUNK,
                             ROWS=max(1, 4096 // experts), PAD=min(block_m, max(1, 4096 // experts)))
    return ExpertBlocks(sorted_pairs, expert_ids, num_padded, block_m)
