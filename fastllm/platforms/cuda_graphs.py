"""CUDA graphs of short forward passes: one replay instead of hundreds of kernel launches.

A decode step at small batch is bound by launch overhead, not by the GPU: replaying a captured
graph removes it. One graph is captured per (padded batch size, query length): query length 1
is plain decoding; 2 .. ``max_query_len`` are speculative verification steps (each sequence's
last token plus its drafts), captured for batches up to ``MAX_VERIFY_BATCH``.

A step of ``n`` sequences runs the smallest graph of its longest query, ``q``, that holds ``n``.
Sequence ``b`` owns rows ``b*q .. b*q+q-1``; a shorter query fills the first of them and the rest
are padding: they write no cache slot (slot -1), and its ``seq_len`` grows by their number, so
its real queries keep their positions (an extend query ``i`` sits at ``seq_len - q + i``) and
never see them (they come after). Padded batch rows hold only padding (slot -1, length ``q``).
Padding attends to junk keys, and its outputs are dropped.

With an adapter manager, each token's adapter slot is one more static input, placed like its
token id (padding: -1, the base model); the adapters' weights sit in the manager's fixed slot
tensors, which loading an adapter overwrites in place.

Before ``capture`` (or without it), ``run`` runs the forward eagerly over the same padded static
buffers: the lockstep data-parallel replicas' padded steps where no graph is captured (CPU tests).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import torch

from fastllm.attention.metadata import AttentionMetadata
from fastllm.platforms.transfer import to_device


def stream_capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream (False without CUDA): work
    that syncs with the host, such as an all-to-all's split sizes, must not run then."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


logger = logging.getLogger(__name__)
# Larger verification batches are dense enough that launches hide behind the computation.
MAX_VERIFY_BATCH = 16


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 (vLLM's ladder), up to and including ``max_batch``."""
    sizes = [s for s in (1, 2, 4) if s < max_batch] + list(range(8, max_batch, 8)) + [max_batch]
    return sorted(set(sizes))


class DecodeGraphs:
    """Static input buffers and one captured graph per (batch size, query length), sharing one pool."""

    def __init__(self, forward: Callable[..., torch.Tensor],
                 max_batch: int, max_blocks_per_seq: int, max_model_len: int, device: torch.device,
                 max_query_len: int = 1, adapters: Any = None):
        self.forward = forward
        self.max_model_len = max_model_len
        self.sizes = capture_sizes(max_batch)
        verify_sizes = capture_sizes(min(max_batch, MAX_VERIFY_BATCH))
        self.keys = [(size, 1) for size in self.sizes] + [
            (size, q) for q in range(2, max_query_len + 1) for size in verify_sizes]
        max_tokens = max(size * q for size, q in self.keys)
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((max_tokens,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=device)
        self.adapters = adapters  # ``fastllm.adapters.AdapterManager``; its batches carry ``slots``
        self.adapter_slots = torch.full((max_tokens,), -1, dtype=torch.int32, device=device)
        # Padding queries read up to max_query_len - 1 positions past a sequence's last block.
        self.block_tables = torch.zeros(max_batch, max_blocks_per_seq + max_query_len - 1, dtype=torch.int32,
                                        device=device)
        self.query_start_locs = {q: torch.arange(0, (max_batch + 1) * q, q, dtype=torch.int32, device=device)
                                 for q in range(1, max_query_len + 1)}
        self.sizes_by_query_len: dict[int, list[int]] = {}
        for size, q in sorted(self.keys):
            self.sizes_by_query_len.setdefault(q, []).append(size)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}

    def _metadata(self, size: int, query_len: int = 1) -> AttentionMetadata:
        """What every graph of ``size`` rows of ``query_len`` reads; host-side fields are fixed at capture."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size * query_len],
            query_start_loc=self.query_start_locs[query_len][:size + 1],
            seq_lens=self.seq_lens[:size], block_tables=self.block_tables[:size],
            num_decodes=size if query_len == 1 else 0, max_query_len=query_len,
            max_seq_len=self.max_model_len, query_lens_cpu=[query_len] * size,
            seq_lens_cpu=[self.max_model_len] * size)

    def _forward(self, size: int, query_len: int) -> torch.Tensor:
        """The forward a graph captures, over the static buffers."""
        tokens = size * query_len
        args = (self.input_ids[:tokens], self.positions[:tokens], self._metadata(size, query_len))
        if self.adapters is None:
            return self.forward(*args)
        return self.forward(*args, adapter_batch=self.adapters.graph_batch(self.adapter_slots[:tokens]))

    @torch.inference_mode()
    def capture(self) -> None:
        """Most tokens first, so smaller graphs reuse the pool the largest one sized."""
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        for key in sorted(self.keys, key=lambda k: (-k[0] * k[1], k)):
            size, query_len = key
            self.seq_lens[:size].fill_(query_len)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._forward(size, query_len)  # compiles Triton kernels and warms cuBLAS outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self.outputs[key] = self._forward(size, query_len)
            self.graphs[key] = graph
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for (batch size, query length) %s", sorted(self.keys))

    def _size(self, num_seqs: int, query_len: int) -> int | None:
        return next((size for size in self.sizes_by_query_len.get(query_len, ()) if size >= num_seqs), None)

    def fits_tables(self, meta: AttentionMetadata) -> bool:
        """Whether the step's block tables fit the static ones (its batch size aside)."""
        return meta.block_tables.shape[1] <= self.block_tables.shape[1] - meta.max_query_len + 1

    def can_run(self, meta: AttentionMetadata) -> bool:
        return self._size(meta.num_seqs, meta.max_query_len) is not None and self.fits_tables(meta)

    def _replay(self, key: tuple[int, int]) -> torch.Tensor:
        if key in self.graphs:
            self.graphs[key].replay()
            return self.outputs[key]
        return self._forward(*key)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
            adapter_batch: Optional[Any] = None, size: Optional[int] = None) -> torch.Tensor:
        """Copy the step into the static buffers, replay the smallest graph that fits (or that of
        ``size`` sequences, a captured size that holds them), return its rows in the step's packed
        order. ``adapter_batch``: the step's, None when no token uses one."""
        n, q = meta.num_seqs, meta.max_query_len
        size = self._size(n, q) if size is None else size
        lens = meta.query_lens_cpu
        self.block_tables[:n, : meta.block_tables.shape[1]].copy_(meta.block_tables)
        self.seq_lens[n:size].fill_(q)
        if all(length == q for length in lens):  # packed rows are the graph's rows
            tokens = n * q
            self.input_ids[:tokens].copy_(input_ids)
            self.positions[:tokens].copy_(positions)
            self.slot_mapping[:tokens].copy_(meta.slot_mapping)
            self.slot_mapping[tokens:size * q].fill_(-1)
            if adapter_batch is not None:
                self.adapter_slots[:tokens].copy_(adapter_batch.slots)
                self.adapter_slots[tokens:size * q].fill_(-1)
            elif self.adapters is not None:  # without a manager the graphs never read the slots
                self.adapter_slots[:size * q].fill_(-1)
            self.seq_lens[:n].copy_(meta.seq_lens)
            return self._replay((size, q))[:tokens]
        rows = [b * q + i for b, length in enumerate(lens) for i in range(length)]
        host = to_device(rows + [q - length for length in lens], torch.int64, input_ids.device)
        rows_on_device, padding = host[: len(rows)], host[len(rows):]
        self.input_ids.index_copy_(0, rows_on_device, input_ids)
        self.positions.index_copy_(0, rows_on_device, positions)
        self.slot_mapping[:size * q].fill_(-1)
        self.slot_mapping.index_copy_(0, rows_on_device, meta.slot_mapping)
        if self.adapters is not None:
            self.adapter_slots[:size * q].fill_(-1)
        if adapter_batch is not None:
            self.adapter_slots.index_copy_(0, rows_on_device, adapter_batch.slots)
        self.seq_lens[:n].copy_(meta.seq_lens + padding)
        return self._replay((size, q)).index_select(0, rows_on_device)
