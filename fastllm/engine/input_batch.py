"""Packs one step's scheduled sequences into model inputs and attention metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from fastllm.attention.metadata import AttentionMetadata
from fastllm.engine.scheduler import ScheduledSequence
from fastllm.platforms.transfer import to_device_with_host


@dataclass
class SampledTokens:
    """The last queued step's sampled tokens, still on the device, and each sequence's row in them."""

    tokens: torch.Tensor
    rows: dict[int, int] = field(default_factory=dict)


@dataclass
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    order: list[ScheduledSequence]  # decodes first; the packing order of the tensors
    token_offsets: list[int]  # where each sequence's tokens start in the packed batch
    host_positions: torch.Tensor  # positions and metadata again, in host memory: what workers are sent
    host_metadata: AttentionMetadata


def pack_inputs(scheduled: list[ScheduledSequence], block_size: int, device: torch.device,
                previous: Optional[SampledTokens] = None) -> ModelInputs:
    """Two host-to-device copies (the int64 and the int32 fields); a token the previous step
    sampled but the host has not read is copied from ``previous`` on the device."""
    order = sorted(scheduled, key=lambda s: s.num_new_tokens != 1)
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_lens: list[int] = []
    seq_lens: list[int] = []
    offsets: list[int] = []
    fill_at: list[int] = []
    fill_from: list[int] = []
    for item in order:
        seq, start = item.seq, item.seq.num_computed_tokens
        known = item.num_new_tokens - item.num_draft_tokens
        offsets.append(len(input_ids))
        tokens = seq.token_slice(start, start + known)
        if len(tokens) < known:  # the last one is still on the device
            fill_at.append(len(input_ids) + len(tokens))
            fill_from.append(previous.rows[seq.seq_id])
            tokens.append(0)
        input_ids += tokens + seq.draft_token_ids[: item.num_draft_tokens]
        end = start + item.num_new_tokens
        positions += range(start + seq.position_delta, end + seq.position_delta)
        table = seq.block_table
        slots += [table[p // block_size] * block_size + p % block_size for p in range(start, end)]
        query_lens.append(item.num_new_tokens)
        seq_lens.append(end)
    max_blocks = max(len(item.seq.block_table) for item in order)
    tables: list[int] = []
    for item in order:
        tables += item.seq.block_table + [0] * (max_blocks - len(item.seq.block_table))
    query_start = [0]
    for q in query_lens:
        query_start.append(query_start[-1] + q)

    host_longs, longs = _packed([input_ids, positions, slots, fill_at, fill_from], torch.int64, device)
    host_ints, ints = _packed([query_start, seq_lens, tables], torch.int32, device)
    ids = longs[0]
    if fill_at:
        ids[longs[3]] = previous.tokens[longs[4]]

    def metadata(longs: list[torch.Tensor], ints: list[torch.Tensor]) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=longs[2],
            query_start_loc=ints[0],
            seq_lens=ints[1],
            block_tables=ints[2].view(len(order), max_blocks),
            num_decodes=sum(1 for q in query_lens if q == 1),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            query_lens_cpu=query_lens,
            seq_lens_cpu=seq_lens,
        )

    return ModelInputs(ids, longs[1], metadata(longs, ints), order, offsets, host_longs[1],
                       metadata(host_longs, host_ints))


def _packed(fields: list[list[int]], dtype: torch.dtype,
            device: torch.device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The fields as views of one host buffer and of its copy on the device, each starting
    16-byte aligned (Triton specialises kernels on pointer alignment, so a misaligned view
    would compile a variant)."""
    per_16_bytes = 16 // dtype.itemsize
    values: list[int] = []
    bounds = []
    for values_of_field in fields:
        values += [0] * (-len(values) % per_16_bytes)
        bounds.append((len(values), len(values) + len(values_of_field)))
        values += values_of_field
    host, buffer = to_device_with_host(values, dtype, device)
    return [host[start:end] for start, end in bounds], [buffer[start:end] for start, end in bounds]
