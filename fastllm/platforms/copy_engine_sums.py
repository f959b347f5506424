"""Sums of a large step's partial activations over the tensor-parallel GPUs, moved by copy engines.

A prefill-sized step under tensor parallelism sums every layer's activations over the ranks
twice; NCCL's ring all-reduce runs on SMs after the GEMM that made the partial sum, and the
next norm waits for it. Here the row-parallel GEMM writes its partial sum, a few row chunks in
turn, into this rank's slot of a buffer every rank maps (torch's symmetric memory); as each
chunk is done a DMA copy on a side stream (a copy engine, no SM) puts it into the same slot of
each peer's buffer while the GEMM computes the next chunk. A barrier kernel then tells every
rank that its peers' copies have landed, and the norm after the layer reads the slots as
summands (``RMSNorm`` takes ``[rows, ranks, hidden]``). Only the last chunk's copy is exposed.
At two ranks each sends its partial once: as many bytes as a ring all-reduce.
``FASTLLM_COPY_ENGINE_SUMS=0`` (or ``FASTLLM_SYMM_MEM_ALL_REDUCE=0``) leaves these sums to NCCL.

Two buffers alternate by sum, and every sum ends with a barrier on the one side stream, so no
rank writes into a slot its peer has yet to read: sum ``i + 2``'s copies start after every
rank passed sum ``i + 1``'s barrier, which it reached after reading sum ``i``. The count runs on
from step to step.
"""

from __future__ import annotations

import logging
import os
import warnings
from itertools import accumulate
from typing import Optional

import torch
import torch.distributed as dist

from fastllm.platforms.cuda_graphs import stream_capturing

logger = logging.getLogger("fastllm")

MIN_BYTES = 4 * 1024 * 1024  # smaller sums: the symmetric-memory all-reduce (symmetric_all_reduce.py) wins
CHUNK_ROWS = 1024  # the GEMM's row chunks are at least this tall
ROW_ALIGN = 128  # chunk bounds on whole GEMM tiles
CHUNKS_ENV = "FASTLLM_COPY_ENGINE_CHUNKS"
"""How many row chunks at most (default 3): more hide more of the copies and cost more launches."""


def row_chunks(tokens: int, max_chunks: int) -> list[slice]:
    """The row chunks a GEMM writes its partial in, each sent as soon as it is done. From three
    chunks on, the first and the last are half as tall as the others: the copies start early
    (an ``o_proj`` computes about as fast as its rows copy) and the last copy, which nothing
    hides, is short (a ``down_proj``'s GEMM hides the rest)."""
    count = max(1, min(max_chunks, tokens // CHUNK_ROWS))
    while count > 2 and tokens // (2 * (count - 1)) < CHUNK_ROWS:
        count -= 1
    weights = [1] + [2] * (count - 2) + [1] if count > 2 else [1] * count
    ends = list(accumulate(weights))
    bounds = [0] + [round(tokens * end / ends[-1] / ROW_ALIGN) * ROW_ALIGN for end in ends[:-1]] + [tokens]
    return [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]


class CopyEngineSums:
    """Two ``[ranks, max_tokens, hidden]`` buffers a rank and the side stream; ``partial_out`` /
    ``send`` / ``exchange`` make one sum."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device, max_tokens: int, hidden: int,
                 dtype: torch.dtype, min_bytes: int = MIN_BYTES, max_chunks: int = 3):
        self.max_tokens, self.hidden, self.dtype, self.min_bytes = max_tokens, hidden, dtype, min_bytes
        self.max_chunks = max_chunks
        self.rank, self.world = group.rank(), group.size()
        self.buffer = self._buffers(group, device)
        self.sums_done = 0  # sums so far; the next one's buffer is its parity
        self.sent = 0  # rows of the next sum's partial already on their way to the peers

    def applies(self, tokens: int) -> bool:
        """Whether a step of ``tokens`` rows sums this way."""
        return (tokens <= self.max_tokens and tokens * self.hidden * self.buffer.element_size() > self.min_bytes
                and not stream_capturing())

    def partial_out(self, tokens: int) -> Optional[torch.Tensor]:
        """This rank's slot for the next sum's partial (write it, ``send`` it chunk by chunk); None
        while an earlier partial sits there unsummed."""
        return None if self.sent else self.buffer[self.sums_done % 2, self.rank, :tokens]

    def chunks(self, tokens: int) -> list[slice]:
        return row_chunks(tokens, self.max_chunks)

    def send(self, rows: slice) -> None:
        """Queue the copy of the slot's ``rows`` (written by the work queued so far) to every peer."""
        self._send(self.sums_done % 2, rows)
        self.sent = rows.stop

    def exchange(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """Every rank's partial ``x [tokens, hidden]`` of this sum as ``[tokens, ranks, hidden]``
        summands; None where ``x`` is not a partial these buffers take. ``x`` is copied into this
        rank's slot unless it is there already."""
        tokens, parity = x.shape[0], self.sums_done % 2
        mine = self.buffer[parity, self.rank, :tokens]
        if x.data_ptr() != mine.data_ptr():
            if x.dtype != self.dtype or x.shape != (tokens, self.hidden) or not self.applies(tokens):
                return None
            mine.copy_(x)
            self.sent = 0
        if self.sent < tokens:
            self.send(slice(self.sent, tokens))
        self._arrive(parity, tokens)
        self.sums_done, self.sent = self.sums_done + 1, 0
        return self.buffer[parity, :, :tokens].transpose(0, 1)

    # the transport: symmetric memory, a copy engine and a barrier on the side stream
    def _buffers(self, group: dist.ProcessGroup, device: torch.device) -> torch.Tensor:
        from torch.distributed import _symmetric_memory as symm_mem

        with warnings.catch_warnings():  # needed before torch 2.10 or so, deprecated (and harmless) after
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(group.group_name)
        shape = (2, self.world, self.max_tokens, self.hidden)
        buffer = symm_mem.empty(shape, dtype=self.dtype, device=device)
        self.handle = symm_mem.rendezvous(buffer, group.group_name)  # collective: every rank alike
        self.peer_buffers = [self.handle.get_buffer(peer, shape, self.dtype)
                             for peer in range(self.world) if peer != self.rank]
        # the highest priority: a barrier's one program starts as soon as the copies are done
        self.stream = torch.cuda.Stream(device, priority=-10)
        return buffer

    def _send(self, parity: int, rows: slice) -> None:
        self.stream.wait_stream(torch.cuda.current_stream(self.buffer.device))
        with torch.cuda.stream(self.stream):
            for peer_buffer in self.peer_buffers:
                peer_buffer[parity, self.rank, rows].copy_(self.buffer[parity, self.rank, rows])  # a DMA copy

    def _arrive(self, parity: int, tokens: int) -> None:
        """Every peer's copies of this sum are in this rank's buffer, for the calling stream's next work."""
        with torch.cuda.stream(self.stream):
            self.handle.barrier(channel=0)
        torch.cuda.current_stream(self.buffer.device).wait_stream(self.stream)


def copy_engine_sums(group: Optional[dist.ProcessGroup], device: torch.device, max_tokens: int, hidden: int,
                     dtype: torch.dtype) -> Optional[CopyEngineSums]:
    """The copy-engine sums for ``group`` (None: the default group), or None where they do not apply
    (not NCCL on CUDA) or cannot be set up (then NCCL sums the large steps)."""
    if (device.type != "cuda" or dist.get_backend(group) != "nccl"
            or os.environ.get("FASTLLM_COPY_ENGINE_SUMS", "1") == "0"
            or os.environ.get("FASTLLM_SYMM_MEM_ALL_REDUCE", "1") == "0"):
        return None
    max_chunks = int(os.environ.get(CHUNKS_ENV, "3"))  # a malformed setting fails start-up, not the sums
    if max_chunks < 1:
        raise ValueError(f"{CHUNKS_ENV} must be 1 or more, not {max_chunks}")
    try:
        return CopyEngineSums(group or dist.group.WORLD, device, max_tokens, hidden, dtype, max_chunks=max_chunks)
    except Exception as exc:  # no peer access, or a torch without symmetric memory: best effort, said once
        logger.warning("copy-engine sums unavailable (%s); NCCL sums the large steps", exc)
        return None
