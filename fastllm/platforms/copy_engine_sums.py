"""Sums of a large step's partial activations over the tensor-parallel GPUs, moved by copy engines.

An overlapped tensor-parallel step (``worker/overlapped_step.py``) hides one micro-batch's sums
under the other's GEMMs. NCCL's ring runs on SMs: beside GEMMs it slowed them about as much as
hiding it saved (benchmarks/RESULTS.md). Here a row-parallel GEMM writes its partial sum into
this rank's slot of a buffer that every rank maps (torch's symmetric memory); on a side stream a
DMA copy (a copy engine, no SM) puts that slot into the same slot of each peer's buffer, and a
barrier kernel tells every rank that its peers' copies have landed. The norm after the layer
reads the slots as summands (``RMSNorm`` takes ``[rows, ranks, hidden]``). At two ranks each
sends its partial once: as many bytes as a ring all-reduce.

Each micro-batch has its own side stream and barrier channel, so one's sums never wait for the
other's. Buffers alternate by sum (two a micro-batch's rows), and every sum ends with a barrier,
so no rank writes into a slot its peer has yet to read: a micro-batch's sum ``i + 2`` starts
after every rank passed sum ``i + 1``, which it issued after reading sum ``i``. The counts run on
from step to step, and a step begins after the last one's micro-batches ended on every rank.
"""

from __future__ import annotations

import logging
import warnings
from typing import Optional

import torch
import torch.distributed as dist

logger = logging.getLogger("fastllm")


class CopyEngineSums:
    """Two ``[ranks, max_tokens, hidden]`` buffers a rank, mapped by its peers, and a side stream a micro-batch."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device, max_tokens: int, hidden: int,
                 dtype: torch.dtype, micro_batches: int = 2):
        from torch.distributed import _symmetric_memory as symm_mem

        with warnings.catch_warnings():  # needed before torch 2.10 or so, deprecated (and harmless) after
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(group.group_name)
        self.max_tokens, self.hidden, self.dtype = max_tokens, hidden, dtype
        shape = (2, group.size(), max_tokens, hidden)
        self.buffer = symm_mem.empty(shape, dtype=dtype, device=device)
        self.handle = symm_mem.rendezvous(self.buffer, group.group_name)  # collective: every rank alike
        self.rank = self.handle.rank
        self.peer_buffers = [self.handle.get_buffer(peer, shape, dtype)
                             for peer in range(group.size()) if peer != self.rank]
        # the highest priority: a barrier's one program starts as soon as the partial is there
        self.streams = [torch.cuda.Stream(device, priority=-10) for _ in range(micro_batches)]
        self.sums_done = [0] * micro_batches  # a micro-batch's sums so far; its next one's buffer is the parity

    def fits(self, tokens: int) -> bool:
        return tokens <= self.max_tokens

    def partial_out(self, micro_batch: int, rows: slice) -> torch.Tensor:
        """Where this rank's partial of ``micro_batch``'s next sum goes, to be sent without a copy."""
        return self.buffer[self.sums_done[micro_batch] % 2, self.rank, rows]

    def exchange(self, x: torch.Tensor, micro_batch: int, rows: slice) -> torch.Tensor:
        """Every rank's partial ``x [rows, hidden]`` of this sum as ``[rows, ranks, hidden]`` summands,
        ready on the calling stream. ``x`` is copied into this rank's slot unless it is there already."""
        if x.dtype != self.dtype or x.shape != (rows.stop - rows.start, self.hidden):
            raise RuntimeError(f"a partial sum of shape {tuple(x.shape)} ({x.dtype}) does not fit the "
                               f"copy-engine buffers ([tokens, {self.hidden}], {self.dtype})")
        parity = self.sums_done[micro_batch] % 2
        self.sums_done[micro_batch] += 1
        mine = self.buffer[parity, self.rank, rows]
        if x.data_ptr() != mine.data_ptr():
            mine.copy_(x)
        caller, stream = torch.cuda.current_stream(x.device), self.streams[micro_batch]
        stream.wait_stream(caller)
        with torch.cuda.stream(stream):
            for peer_buffer in self.peer_buffers:
                peer_buffer[parity, self.rank, rows].copy_(mine)  # contiguous: a DMA copy over NVLink
            self.handle.barrier(channel=micro_batch)
        caller.wait_stream(stream)
        return self.buffer[parity, :, rows].transpose(0, 1)


def copy_engine_sums(group: Optional[dist.ProcessGroup], device: torch.device, max_tokens: int, hidden: int,
                     dtype: torch.dtype) -> Optional[CopyEngineSums]:
    """The copy-engine sums for ``group`` (None: the default group), or None where they do not apply
    (not NCCL on CUDA) or cannot be set up (then large steps run in one pass)."""
    if device.type != "cuda" or dist.get_backend(group) != "nccl":
        return None
    try:
        return CopyEngineSums(group or dist.group.WORLD, device, max_tokens, hidden, dtype)
    except Exception as exc:  # no peer access, or a torch without symmetric memory: best effort, said once
        logger.warning("copy-engine sums unavailable (%s); large tensor-parallel steps run in one pass", exc)
        return None
