"""Per-step attention inputs, built once by the runner and read by every attention layer."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterator, Optional

import torch


@dataclass
class AttentionMetadata:
    """Layout of one packed batch over the paged KV cache.

    Sequences with one query token (decodes) come first: ``num_decodes`` of them.
    ``seq_lens`` counts each sequence's KV tokens including this step's.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = padding
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    num_decodes: int
    max_query_len: int
    max_seq_len: int
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    # Every layer reads the decodes and the rows after them apart; each slice (and the shifted
    # starts, a kernel) costs an eager step's host microseconds a layer, so they are made once.
    @cached_property
    def decode_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(block tables, KV lengths) of the decodes."""
        return self.block_tables[:self.num_decodes], self.seq_lens[:self.num_decodes]

    @cached_property
    def extend_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(block tables, query starts counted from the first of them, KV lengths) of the rows
        after the decodes; each decode holds one token, so their runs start at token ``num_decodes``."""
        nd = self.num_decodes
        if not nd:
            return self.block_tables, self.query_start_loc, self.seq_lens
        return self.block_tables[nd:], self.query_start_loc[nd:] - nd, self.seq_lens[nd:]


@dataclass
class ForwardContext:
    attn_metadata: AttentionMetadata
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    backend: Any
    adapter_batch: Any = None  # what the adapter manager prepared for this step (per-token adapter slots)
    # data-parallel attention with expert parallelism: every replica's token count this step, exchanged
    # once a step for all the MoE layers' gathers
    replica_tokens: Optional[list[int]] = None
    # a padded lockstep step (every replica brings the same rows): its padding rows among the gathered
    # ones, ``[sum(replica_tokens), 1]`` bool, which route with weight 0 (``replica_step.padding_rows``)
    replica_padding: Optional[torch.Tensor] = None


_context: Optional[ForwardContext] = None


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[None]:
    """Make ``ctx`` visible to attention layers for one forward pass."""
    global _context
    _context, previous = ctx, _context
    try:
        yield
    finally:
        _context = previous


def get_forward_context() -> ForwardContext:
    if _context is None:
        raise RuntimeError("attention called outside a forward_context")
    return _context
