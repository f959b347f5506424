"""CUDA graphs of the decode forward pass: one replay instead of hundreds of kernel launches.

A decode step at small batch is bound by launch overhead, not by the GPU: replaying a captured
graph removes it. One graph is captured per padded batch size; a step of ``n`` decodes runs the
smallest graph that holds ``n``, its extra rows pointing at no cache slot (slot -1, length 1).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from fastllm.attention.metadata import AttentionMetadata

logger = logging.getLogger(__name__)


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 (vLLM's ladder), up to and including ``max_batch``."""
    sizes = [s for s in (1, 2, 4) if s < max_batch] + list(range(8, max_batch, 8)) + [max_batch]
    return sorted(set(sizes))


class DecodeGraphs:
    """Static input buffers and one captured graph per batch size, sharing one memory pool."""

    def __init__(self, forward: Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor],
                 max_batch: int, max_blocks_per_seq: int, max_model_len: int, device: torch.device):
        self.forward = forward
        self.max_model_len = max_model_len
        self.sizes = capture_sizes(max_batch)
        self.input_ids = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((max_batch,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def _metadata(self, size: int) -> AttentionMetadata:
        """What every graph of ``size`` rows reads; host-side fields are fixed at capture."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], query_start_loc=self.query_start_loc[:size + 1],
            seq_lens=self.seq_lens[:size], block_tables=self.block_tables[:size], num_decodes=size,
            max_query_len=1, max_seq_len=self.max_model_len, query_lens_cpu=[1] * size,
            seq_lens_cpu=[self.max_model_len] * size)

    @torch.inference_mode()
    def capture(self) -> None:
        """Largest first, so smaller graphs reuse the pool the largest one sized."""
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        for size in reversed(self.sizes):
            meta = self._metadata(size)
            args = (self.input_ids[:size], self.positions[:size], meta)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.forward(*args)  # compiles Triton kernels and warms cuBLAS outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self.outputs[size] = self.forward(*args)
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.sizes)

    def can_run(self, meta: AttentionMetadata) -> bool:
        n = meta.num_seqs
        return meta.num_decodes == n and n <= self.sizes[-1] and meta.block_tables.shape[1] <= \
            self.block_tables.shape[1]

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Copy the step into the static buffers, replay the smallest graph that fits, return ``n`` rows."""
        n = meta.num_seqs
        size = next(s for s in self.sizes if s >= n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:size].fill_(-1)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.seq_lens[n:size].fill_(1)
        self.block_tables[:n, : meta.block_tables.shape[1]].copy_(meta.block_tables)
        self.graphs[size].replay()
        return self.outputs[size][:n]
