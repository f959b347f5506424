"""Join and leave the tensor-parallel process group that the parallel layers read.

The layers shard over torch.distributed's default group (see ``parallel_state``), so one
process can host at most one tensor-parallel engine at a time, and must leave the group
before a single-process engine is built, or that engine would shard itself too.
"""

from __future__ import annotations

import os
import socket
from typing import Optional

import torch
import torch.distributed as dist

from fastllm.distributed.parallel_state import (reset_layout, set_experts_over_replicas, set_fast_all_reduce,
                                                set_layout, tp_group)
from fastllm.distributed.replica_step import join_host_group
from fastllm.platforms.symmetric_all_reduce import release_symmetric_memory, symmetric_all_reduce

# NVLink multicast (NVLS) can put a shared host's GPUs out of service; every rank keeps it off,
# in NCCL and in the symmetric memory of the small all-reduce (whose rendezvous would map it).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def free_tcp_port() -> int:
    """A port that was free a moment ago, for rank 0's rendezvous store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_threads_per_rank(world_size: int) -> int:
    """Each CPU rank's share of the cores this process may run on.

    Ranks wait on each other at every collective, and OpenMP threads spin while they wait:
    with more threads than cores, the ranks' spinning threads starve each other.
    """
    return max(1, len(os.sched_getaffinity(0)) // world_size)


def init_tensor_parallel(rank: int, world_size: int, init_method: str, backend: str,
                         device: torch.device, pipeline_parallel_size: int = 1, expert_parallel: bool = False,
                         expert_all_to_all_min_tokens: Optional[int] = None) -> None:
    """Join the default group as ``rank`` on ``device``; blocks until all ranks have joined.
    ``world_size`` is tensor x pipeline parallel size (see ``parallel_state`` for the layout);
    ``expert_parallel`` places MoE experts whole over each stage's tensor-parallel ranks, and
    dispatches steps of ``expert_all_to_all_min_tokens`` or more by all-to-all.

    A CPU rank also narrows itself to its share of the cores (``cpu_threads_per_rank``).
    """
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads_per_rank(world_size))
    _join_default_group(rank, world_size, init_method, backend, device)
    set_layout(world_size // pipeline_parallel_size, pipeline_parallel_size, expert_parallel,
               expert_all_to_all_min_tokens)
    if world_size > pipeline_parallel_size:
        set_fast_all_reduce(symmetric_all_reduce(tp_group(), device))


def init_replica_experts(rank: int, world_size: int, init_method: str, backend: str, device: torch.device) -> None:
    """Join data-parallel replica ``rank``'s group: one rank a replica, whose MoE layers place
    their experts over all the replicas (``parallel_state.experts_over_replicas``)."""
    _join_default_group(rank, world_size, init_method, backend, device)
    set_experts_over_replicas()
    join_host_group()


def _join_default_group(rank: int, world_size: int, init_method: str, backend: str, device: torch.device) -> None:
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialized in this process: only one "
                           "distributed engine can live in a process at a time")
    if backend == "nccl":
        os.environ.update(NCCL_ENV)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            device_id=None if device.type == "cpu" else device)


def destroy_tensor_parallel() -> None:
    """Leave the group (a no-op when it was never joined or was aborted). Drop captured CUDA
    graphs first: destroying a NCCL group that a live graph captured hangs (pytorch#115388)."""
    reset_layout()  # the symmetric all-reduce buffer goes while its group lives
    release_symmetric_memory()
    if dist.is_initialized():
        dist.destroy_process_group()


def abort_tensor_parallel() -> None:
    """Make collectives blocked on a dead peer fail instead of waiting forever.

    Gloo notices a closed peer socket by itself; NCCL keeps spinning on the GPU, so its
    communicators are aborted (an experimental torch API, hence the guarded lookup).
    """
    if not dist.is_initialized() or dist.get_backend() != "nccl":
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is not None:
        abort()
        reset_layout()
