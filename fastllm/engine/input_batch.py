"""Packs one step's scheduled sequences into model inputs and attention metadata."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastllm.attention.metadata import AttentionMetadata
from fastllm.engine.scheduler import ScheduledSequence


@dataclass
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    order: list[ScheduledSequence]  # decodes first; the packing order of the tensors
    token_offsets: list[int]  # where each sequence's tokens start in the packed batch


def pack_inputs(scheduled: list[ScheduledSequence], block_size: int, device: torch.device) -> ModelInputs:
    order = sorted(scheduled, key=lambda s: s.num_new_tokens != 1)
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_lens: list[int] = []
    seq_lens: list[int] = []
    offsets: list[int] = []
    for item in order:
        seq, start = item.seq, item.seq.num_computed_tokens
        known = item.num_new_tokens - item.num_draft_tokens
        offsets.append(len(input_ids))
        input_ids += seq.token_ids[start:start + known] + seq.draft_token_ids[: item.num_draft_tokens]
        end = start + item.num_new_tokens
        positions += range(start, end)
        table = seq.block_table
        slots += [table[p // block_size] * block_size + p % block_size for p in range(start, end)]
        query_lens.append(item.num_new_tokens)
        seq_lens.append(end)
    max_blocks = max(len(item.seq.block_table) for item in order)
    tables = [item.seq.block_table + [0] * (max_blocks - len(item.seq.block_table)) for item in order]
    query_start = [0]
    for q in query_lens:
        query_start.append(query_start[-1] + q)

    def tensor(values, dtype):
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

    meta = AttentionMetadata(
        slot_mapping=tensor(slots, torch.int64),
        query_start_loc=tensor(query_start, torch.int32),
        seq_lens=tensor(seq_lens, torch.int32),
        block_tables=tensor(tables, torch.int32),
        num_decodes=sum(1 for q in query_lens if q == 1),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
    )
    return ModelInputs(tensor(input_ids, torch.int64), tensor(positions, torch.int64), meta, order, offsets)
