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

Sequence parallel (models whose every block leaves its sum to the next norm: the dense ones).
Each rank owns a block of the step's rows. The row-parallel GEMM computes the peers' blocks
first and sends each only to its owner, then its own block, which hides the copies; the norm
adds and normalises only the rows this rank owns (a reduce-scatter, and half the norm's work at
two ranks) and writes them into a second buffer every rank maps, whose rows go to every peer (an
all-gather) while the next column-parallel GEMM computes on the rows already here
(``rows_in_flight``, ``settle``). The same bytes cross NVLink as before, but no copy waits for
the last GEMM rows. ``FASTLLM_SEQUENCE_PARALLEL_SUMS=0`` keeps the plain sums.

Two buffers alternate by sum, and every sum ends with a barrier on the one side stream, so no
rank writes into a slot its peer has yet to read: sum ``i + 2``'s copies start after every
rank passed sum ``i + 1``'s barrier, which it reached after reading sum ``i``. The count runs on
from step to step.
"""

from __future__ import annotations

import logging
import math
import os
from itertools import accumulate
from typing import Optional

import torch
import torch.distributed as dist

from fastllm.platforms.cuda_graphs import stream_capturing
from fastllm.platforms.symmetric_all_reduce import claim_symmetric_memory

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
    """Two ``[ranks, max_tokens, hidden]`` buffers a rank for the partials, two ``[max_tokens,
    hidden]`` for sequence-parallel norms' outputs, and the side stream; ``partial_out`` / ``send``
    / ``exchange`` (or ``reduce_scatter``) make one sum, ``gather_out`` / ``start_gather`` /
    ``settle`` one gather."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device, max_tokens: int, hidden: int,
                 dtype: torch.dtype, min_bytes: int = MIN_BYTES, max_chunks: int = 3):
        self.max_tokens, self.hidden, self.dtype, self.min_bytes = max_tokens, hidden, dtype, min_bytes
        self.max_chunks = max_chunks
        self.rank, self.world = group.rank(), group.size()
        self.peers = tuple(peer for peer in range(self.world) if peer != self.rank)
        self.buffer, self.gathered = self._buffers(group, device)
        self.sums_done = 0  # sums so far; the next one's buffer is its parity
        self.gathers_done = 0  # all-gathers so far, likewise
        self.sent: Optional[str] = None  # the next sum's partial is in the slot, sent to "all" peers or "owners"
        self.sequence_parallel = False  # set by the runner for models that allow it (module docstring)
        self.in_flight: Optional[tuple[int, slice]] = None  # a gathered tensor's address, the rows already here
        self._plans: dict[int, list[tuple[slice, tuple[int, ...]]]] = {}  # by step size (the mode is fixed)
        self._blocks: dict[int, list[slice]] = {}

    def applies(self, tokens: int) -> bool:
        """Whether a step of ``tokens`` rows sums this way."""
        return (tokens <= self.max_tokens and tokens * self.hidden * self.buffer.element_size() > self.min_bytes
                and not stream_capturing())

    def partial_out(self, tokens: int) -> Optional[torch.Tensor]:
        """This rank's slot for the next sum's partial (write it in ``plan`` order, ``send`` each
        piece); None while an earlier partial sits there unsummed."""
        return None if self.sent else self.buffer[self.sums_done % 2, self.rank, :tokens]

    def blocks(self, tokens: int) -> list[slice]:
        """Each rank's rows under sequence parallelism, on whole GEMM tiles."""
        blocks = self._blocks.get(tokens)
        if blocks is None:
            bounds = [round(tokens * rank / self.world / ROW_ALIGN) * ROW_ALIGN for rank in range(self.world)]
            blocks = self._blocks[tokens] = [slice(start, stop) for start, stop in zip(bounds, bounds[1:] + [tokens])]
        return blocks

    def plan(self, tokens: int) -> list[tuple[slice, tuple[int, ...]]]:
        """The row pieces a row-parallel GEMM writes in turn, each with the peers it is sent to as
        soon as it is done: row chunks for every peer, or, sequence parallel, the peers' blocks
        (each to its owner), from the next rank round, then this rank's own (sent nowhere)."""
        plan = self._plans.get(tokens)
        if plan is None:
            if self.sequence_parallel:
                blocks = self.blocks(tokens)
                owners = [(self.rank + step) % self.world for step in range(1, self.world + 1)]
                plan = [(blocks[owner], () if owner == self.rank else (owner,)) for owner in owners]
            else:
                plan = [(rows, self.peers) for rows in row_chunks(tokens, self.max_chunks)]
            self._plans[tokens] = plan
        return plan

    def send(self, rows: slice, peers: tuple[int, ...]) -> None:
        """Queue the copy of the slot's ``rows`` (written by the work queued so far) to ``peers``."""
        if peers:
            self._send(self.sums_done % 2, rows, peers)
        self.sent = "owners" if self.sequence_parallel else "all"

    def exchange(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """Every rank's partial ``x [tokens, hidden]`` of this sum as ``[tokens, ranks, hidden]``
        summands; None where ``x`` is not a partial these buffers take. ``x`` is copied into this
        rank's slot unless it is there already."""
        tokens, parity = x.shape[0], self.sums_done % 2
        if not self._in_slot(x):
            return None
        if self.sent != "all":
            self._send(parity, slice(0, tokens), self.peers)
        self._arrive()
        self.sums_done, self.sent = self.sums_done + 1, None
        return self.buffer[parity, :, :tokens].transpose(0, 1)

    def reduce_scatter(self, x: torch.Tensor) -> Optional[tuple[torch.Tensor, slice]]:
        """Sequence parallel: the ranks' partials ``x`` of the rows this rank owns, as ``[rows,
        ranks, hidden]`` summands, and those rows; None where ``x`` is not a partial these buffers
        take."""
        tokens, parity = x.shape[0], self.sums_done % 2
        if not self._in_slot(x):
            return None
        if self.sent is None:
            for rows, peers in self.plan(tokens):
                self.send(rows, peers)
        self._arrive()
        self.sums_done, self.sent = self.sums_done + 1, None
        own = self.blocks(tokens)[self.rank]
        return self.buffer[parity, :, own].transpose(0, 1), own

    def gather_out(self, tokens: int) -> torch.Tensor:
        """The ``[tokens, hidden]`` tensor a sequence-parallel norm writes its rows into."""
        return self.gathered[self.gathers_done % 2, :tokens]

    def start_gather(self, out: torch.Tensor) -> torch.Tensor:
        """Send this rank's rows of ``out`` (``gather_out``, written by the work queued so far) to
        every peer; ``out`` is whole once ``settle``d (or past ``rows_in_flight``)."""
        own = self.blocks(out.shape[0])[self.rank]
        self._send_gathered(self.gathers_done % 2, own)
        self._barrier()
        self.gathers_done += 1
        self.in_flight = (out.data_ptr(), own)
        return out

    def rows_in_flight(self, x: torch.Tensor) -> Optional[slice]:
        """The rows of ``x`` already here when its other rows are still being gathered (compute
        on them, then ``settle``), else None."""
        in_flight = self.in_flight
        return in_flight[1] if in_flight is not None and in_flight[0] == x.data_ptr() else None

    def settle(self, x: torch.Tensor) -> torch.Tensor:
        """``x``, with the calling stream's next work after every gathered row of it has landed."""
        if self.rows_in_flight(x) is not None:
            self._wait_side()
            self.in_flight = None
        return x

    def _in_slot(self, x: torch.Tensor) -> bool:
        """Whether ``x`` is this sum's partial in this rank's slot, copying it there if it fits."""
        tokens = x.shape[0]
        mine = self.buffer[self.sums_done % 2, self.rank, :tokens]
        if x.data_ptr() == mine.data_ptr():
            return True
        if x.dtype != self.dtype or x.shape != (tokens, self.hidden) or not self.applies(tokens):
            return False
        mine.copy_(x)
        self.sent = None
        return True

    # the transport: symmetric memory, a copy engine and a barrier on the side stream
    def _buffers(self, group: dist.ProcessGroup, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        from torch.distributed import _symmetric_memory as symm_mem

        claim_symmetric_memory(group, device)
        shape = (2, self.world, self.max_tokens, self.hidden)
        gathered_shape = (2, self.max_tokens, self.hidden)
        # one allocation for both, so one rendezvous maps them
        storage = symm_mem.empty(math.prod(shape) + math.prod(gathered_shape), dtype=self.dtype, device=device)
        self.handle = symm_mem.rendezvous(storage, group.group_name)  # collective: every rank alike
        self.peer_buffers, self.peer_gathered = {}, {}
        for peer in self.peers:
            peer_storage = self.handle.get_buffer(peer, storage.shape, self.dtype)
            self.peer_buffers[peer], self.peer_gathered[peer] = _split(peer_storage, shape, gathered_shape)
        # the highest priority: a barrier's one program starts as soon as the copies are done
        self.stream = torch.cuda.Stream(device, priority=-10)
        return _split(storage, shape, gathered_shape)

    def _send(self, parity: int, rows: slice, peers: tuple[int, ...]) -> None:
        self._copy(self.buffer[parity, self.rank, rows],
                   [self.peer_buffers[peer][parity, self.rank, rows] for peer in peers])

    def _send_gathered(self, parity: int, rows: slice) -> None:
        self._copy(self.gathered[parity, rows], [self.peer_gathered[peer][parity, rows] for peer in self.peers])

    def _copy(self, source: torch.Tensor, targets: list[torch.Tensor]) -> None:
        """DMA copies of ``source`` (written by the calling stream's work so far) on the side stream."""
        self.stream.wait_stream(torch.cuda.current_stream(self.buffer.device))
        with torch.cuda.stream(self.stream):
            for target in targets:
                target.copy_(source)

    def _barrier(self) -> None:
        """Queue on the side stream: every rank's copies queued so far have landed."""
        with torch.cuda.stream(self.stream):
            self.handle.barrier(channel=0)

    def _wait_side(self) -> None:
        """The calling stream's next work waits for the side stream's."""
        torch.cuda.current_stream(self.buffer.device).wait_stream(self.stream)

    def _arrive(self) -> None:
        """Every peer's copies of this sum are in this rank's buffer, for the calling stream's next work."""
        self._barrier()
        self._wait_side()


def _split(storage: torch.Tensor, shape: tuple[int, ...], gathered_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The sums' buffer and the gathers' buffer, views of one flat allocation."""
    size = math.prod(shape)
    return storage[:size].view(shape), storage[size:].view(gathered_shape)


def copy_engine_sums(group: Optional[dist.ProcessGroup], device: torch.device, max_tokens: int, hidden: int,
                     dtype: torch.dtype, sequence_parallel: bool = False) -> Optional[CopyEngineSums]:
    """The copy-engine sums for ``group`` (None: the default group), or None where they do not apply
    (not NCCL on CUDA) or cannot be set up (then NCCL sums the large steps). ``sequence_parallel``:
    the model allows it (``LlamaModel.sequence_parallel``); every rank decides alike."""
    if (device.type != "cuda" or dist.get_backend(group) != "nccl"
            or os.environ.get("FASTLLM_COPY_ENGINE_SUMS", "1") == "0"
            or os.environ.get("FASTLLM_SYMM_MEM_ALL_REDUCE", "1") == "0"):
        return None
    max_chunks = int(os.environ.get(CHUNKS_ENV, "3"))  # a malformed setting fails start-up, not the sums
    if max_chunks < 1:
        raise ValueError(f"{CHUNKS_ENV} must be 1 or more, not {max_chunks}")
    try:
        sums = CopyEngineSums(group or dist.group.WORLD, device, max_tokens, hidden, dtype, max_chunks=max_chunks)
    except Exception as exc:  # no peer access, or a torch without symmetric memory: best effort, said once
        logger.warning("copy-engine sums unavailable (%s); NCCL sums the large steps", exc)
        return None
    sums.sequence_parallel = sequence_parallel and os.environ.get("FASTLLM_SEQUENCE_PARALLEL_SUMS", "1") != "0"
    return sums
