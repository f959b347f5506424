"""All-reduce of decode-sized tensors through GPU peer memory (torch's symmetric memory).

NCCL's all-reduce pays a fixed latency that dominates the small messages of a decode step
(one hidden vector per token, twice a layer). With every rank's buffer mapped into its peers
(NVLink), a reduction is one kernel: ``one_shot`` reads all peers' copies and sums them (least
latency, for the smallest messages), ``two_shot`` reduce-scatters then all-gathers through the
buffer (less traffic per rank, for larger ones). Above ``max_bytes`` NCCL's ring wins and is
used. 16-bit rows up to ``lamport_max_bytes`` skip torch's kernels for one that needs no
barrier and can fold in the residual add and RMSNorm that follow a row-parallel layer
(``fastllm_kernels.lamport_all_reduce``). The limits come from ``benchmarks/all_reduce.py`` on
two NVLink H100s and two H200s (see benchmarks/RESULTS.md); ``FASTLLM_SYMM_MEM_ALL_REDUCE=0`` turns this path
off, ``FASTLLM_LAMPORT_ALL_REDUCE=0`` the barrier-free kernel alone, ``FASTLLM_LAMPORT_MAX_KIB``
moves its limit.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from fastllm_kernels.lamport_all_reduce import PeerBuffers

logger = logging.getLogger("fastllm")

ONE_SHOT_MAX_BYTES = 256 * 1024
TWO_SHOT_MAX_BYTES = 4 * 1024 * 1024
LAMPORT_MAX_BYTES = 4 * 1024 * 1024
LAMPORT_MAX_KIB_ENV = "FASTLLM_LAMPORT_MAX_KIB"
"""The barrier-free kernel's largest message in KiB (its buffers hold three slots a peer of it)."""
_ONE_SHOT_COPY = getattr(torch.ops.symm_mem, "one_shot_all_reduce_copy", None)  # torch >= 2.8
_claimed_group: Optional[dist.ProcessGroup] = None  # the group that set symmetric memory up in this process
_process_claimed = False  # whether any group did (claim_symmetric_memory says why it matters)


class SymmetricAllReduce:
    """One symmetric buffer per rank of ``group``; ``__call__`` sums a tensor over the group."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device,
                 one_shot_max_bytes: int = ONE_SHOT_MAX_BYTES, max_bytes: int = TWO_SHOT_MAX_BYTES,
                 lamport_max_bytes: int = LAMPORT_MAX_BYTES):
        from torch.distributed import _symmetric_memory as symm_mem

        self.one_shot_max_bytes, self.max_bytes = one_shot_max_bytes, max_bytes
        self.group_name, self.alignment = group.group_name, 16 * group.size()  # two-shot splits 16-byte units
        claim_symmetric_memory(group, device)
        self.buffer = symm_mem.empty(max_bytes, dtype=torch.uint8, device=device)
        symm_mem.rendezvous(self.buffer, self.group_name)  # collective: every rank of the group allocates alike
        self.peers = self._peer_buffers(group, device, lamport_max_bytes) if lamport_max_bytes else None

    def _peer_buffers(self, group: dist.ProcessGroup, device: torch.device, slot_bytes: int) -> "PeerBuffers":
        """The barrier-free kernel's buffers, every element empty on every rank before any rank's first call."""
        from torch.distributed import _symmetric_memory as symm_mem

        from fastllm_kernels import lamport_all_reduce

        self.lamport = lamport_all_reduce
        world, slot = group.size(), slot_bytes // 2
        size = lamport_all_reduce.PHASES * world * slot
        self.lamport_buffer = symm_mem.empty(size, dtype=torch.int16, device=device)
        handle = symm_mem.rendezvous(self.lamport_buffer, self.group_name)
        self.lamport_buffer.fill_(lamport_all_reduce.EMPTY_BITS)
        torch.cuda.synchronize(device)
        dist.barrier(group)
        bases = [handle.get_buffer(peer, (size,), torch.int16).data_ptr() for peer in range(world)]
        shift = self.lamport_buffer.data_ptr() - bases[handle.rank]  # where the pool placed it in its allocation
        pointers = torch.tensor([base + shift for base in bases], dtype=torch.int64, device=device)
        return lamport_all_reduce.PeerBuffers(pointers, torch.zeros(2, dtype=torch.int32, device=device),
                                              handle.rank, world, slot)

    def fits(self, x: torch.Tensor) -> bool:
        nbytes = x.numel() * x.element_size()
        return (nbytes <= self.max_bytes and nbytes % self.alignment == 0
                and x.dtype in (torch.bfloat16, torch.float16, torch.float32))

    def barrier_free_fits(self, x: torch.Tensor) -> bool:
        """Whether the barrier-free kernel takes ``x`` (alone, or with ``add_rms_norm``)."""
        return self.peers is not None and self.lamport.fits(x, self.peers)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rms_norm(s + residual), s + residual)`` for ``s`` the sum of ``x`` over the group."""
        return self.lamport.lamport_all_reduce_add_rms_norm(x, residual, weight, eps, self.peers)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.barrier_free_fits(x):
            return self.lamport.lamport_all_reduce(x, self.peers)
        nbytes = x.numel() * x.element_size()
        staged = self.buffer[:nbytes].view(x.dtype)
        one_shot = nbytes <= self.one_shot_max_bytes
        if one_shot and _ONE_SHOT_COPY is not None:  # stages the input in the reducing kernel: one launch, not two
            return _ONE_SHOT_COPY(staged, x.reshape(-1), "sum", self.group_name).view_as(x)
        staged.copy_(x.reshape(-1))
        if one_shot:
            return torch.ops.symm_mem.one_shot_all_reduce(staged, "sum", self.group_name).view_as(x)
        torch.ops.symm_mem.two_shot_all_reduce_(staged, "sum", self.group_name)
        return x.copy_(staged.view_as(x))


def symmetric_all_reduce(group: Optional[dist.ProcessGroup], device: torch.device) -> Optional[SymmetricAllReduce]:
    """The peer-memory all-reduce for ``group`` (None: the default group), or None where it does
    not apply (not NCCL on CUDA, turned off) or cannot be set up (then NCCL does every size)."""
    if device.type != "cuda" or dist.get_backend(group) != "nccl":
        return None
    if os.environ.get("FASTLLM_SYMM_MEM_ALL_REDUCE", "1") == "0":
        return None
    lamport_max_bytes = barrier_free_max_bytes()  # a malformed setting fails start-up, not the fast path
    try:
        return SymmetricAllReduce(group or dist.group.WORLD, device, lamport_max_bytes=lamport_max_bytes)
    except Exception as exc:  # no peer access, or a torch without the ops: best effort, said once
        logger.warning("symmetric-memory all-reduce unavailable (%s); NCCL does every all-reduce", exc)
        return None


def claim_symmetric_memory(group: dist.ProcessGroup, device: torch.device) -> None:
    """Let ``group`` set torch's symmetric memory up, or raise on every rank of it alike (the
    callers then leave their sums to NCCL) where a rank's process did so for an earlier group.

    Torch's rendezvous names its store keys by a count of exchanges kept for the life of the
    process (``StoreExchange``), and before 2.10 or so also keeps each group name's store for good.
    A later engine's rank 0 lives in the same process as the earlier one's while its workers are new
    processes: each would wait for keys the others never write (seen on two H200s), so only the first
    engine of a process gets symmetric memory."""
    global _claimed_group, _process_claimed
    if _claimed_group is group:  # the group's second user (the all-reduce, then the copy-engine sums)
        return
    earlier = torch.tensor([float(_process_claimed)], device=device)
    dist.all_reduce(earlier, op=dist.ReduceOp.MAX, group=group)
    if earlier.item():
        raise RuntimeError("a rank's process set symmetric memory up for an earlier engine")
    from torch.distributed import _symmetric_memory as symm_mem

    if getattr(symm_mem.enable_symm_mem_for_group, "__deprecated__", None) is None:  # older torch must be told
        symm_mem.enable_symm_mem_for_group(group.group_name)
    _claimed_group, _process_claimed = group, True


def release_symmetric_memory() -> None:
    """Forget the group (it is being destroyed); the process stays claimed."""
    global _claimed_group
    _claimed_group = None


def barrier_free_max_bytes() -> int:
    """The barrier-free kernel's largest message as the environment sets it (0: turned off)."""
    if os.environ.get("FASTLLM_LAMPORT_ALL_REDUCE", "1") == "0":
        return 0
    kib = os.environ.get(LAMPORT_MAX_KIB_ENV, str(LAMPORT_MAX_BYTES // 1024))
    if not kib.isdigit():
        raise ValueError(f"{LAMPORT_MAX_KIB_ENV}={kib!r}: expected a whole number of KiB")
    return int(kib) * 1024
