"""Micro-batches of one step, so that pipeline stages overlap.

Under pipeline parallelism a stage hands its activations to the next one and would then idle
until the next step. Cut into micro-batches, the step keeps every stage busy: while stage 1
runs micro-batch k, stage 0 runs micro-batch k + 1 (sends and receives are queued on the
device, so no stage's host waits for another). The cut is by tokens, so a long prefill chunk
is cut too: its later part is a row whose context holds the earlier part, whose keys and
values the same stage wrote one micro-batch before.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from fastllm.attention.metadata import AttentionMetadata
from fastllm.platforms.transfer import to_device

PER_STAGE = 4  # micro-batches in flight per stage: the pipeline idles (stages - 1) / (count + stages - 1)


class MicroBatch(NamedTuple):
    tokens: slice
    attn_metadata: AttentionMetadata


def micro_batch_count(num_tokens: int, num_stages: int) -> int:
    """One without stages to overlap. ``FASTLLM_PP_MICRO_BATCH_TOKENS``: the fewest tokens a
    micro-batch holds (a smaller one reads the stage's weights for too little compute)."""
    if num_stages == 1:
        return 1
    min_tokens = int(os.environ.get("FASTLLM_PP_MICRO_BATCH_TOKENS", "512"))
    return max(1, min(PER_STAGE * num_stages, num_tokens // min_tokens))


def split_step(meta: AttentionMetadata, count: int, device: torch.device) -> list[MicroBatch]:
    """``meta``'s tokens in ``count`` runs of (nearly) equal length, each with its own metadata.

    Every rank cuts the same step the same way: the cut depends on the metadata alone.
    """
    num_tokens = sum(meta.query_lens_cpu)
    bounds = [num_tokens * i // count for i in range(count + 1)]
    starts = [0]
    for q in meta.query_lens_cpu:
        starts.append(starts[-1] + q)
    parts = []
    for begin, end in zip(bounds, bounds[1:]):
        rows = [r for r in range(meta.num_seqs) if starts[r] < end and starts[r + 1] > begin]
        query_lens = [min(end, starts[r + 1]) - max(begin, starts[r]) for r in rows]
        # a row cut short at ``end`` sees its keys up to there only
        seq_lens = [meta.seq_lens_cpu[r] - max(0, starts[r + 1] - end) for r in rows]
        query_start = [0]
        for q in query_lens:
            query_start.append(query_start[-1] + q)
        num_decodes = next((i for i, q in enumerate(query_lens) if q != 1), len(query_lens))
        parts.append(MicroBatch(slice(begin, end), AttentionMetadata(
            slot_mapping=meta.slot_mapping[begin:end].clone(),  # clones start aligned, as the kernels expect
            query_start_loc=to_device(query_start, torch.int32, device),
            seq_lens=to_device(seq_lens, torch.int32, device),
            block_tables=meta.block_tables[rows[0]:rows[-1] + 1].clone(),
            num_decodes=num_decodes,
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            query_lens_cpu=query_lens,
            seq_lens_cpu=seq_lens,
        )))
    return parts
