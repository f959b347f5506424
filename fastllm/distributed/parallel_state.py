"""This process's place among the ranks (tensor-parallel rank and size, pipeline stage), and
the collectives the layers need.

Ranks are laid out stage by stage: rank ``r`` is tensor-parallel rank ``r % tp`` of pipeline
stage ``r // tp``, so rank 0 (the driver) sits in the first stage.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional

import torch
import torch.distributed as dist

from fastllm.platforms.cuda_graphs import stream_capturing

if TYPE_CHECKING:
    from fastllm.platforms.copy_engine_sums import CopyEngineSums
    from fastllm.platforms.symmetric_all_reduce import SymmetricAllReduce


@dataclass
class Layout:
    tp: int = 1
    pp: int = 1
    tp_group: Optional[dist.ProcessGroup] = None  # None: the default group (no pipeline)
    expert_parallel: bool = False  # MoE experts placed whole over the tensor-parallel ranks
    fast_all_reduce: Optional["SymmetricAllReduce"] = None  # for the tensors it fits
    # expert parallelism dispatches steps of at least this many tokens by all-to-all (None: never)
    expert_all_to_all_min_tokens: Optional[int] = None
    # data-parallel attention with expert parallelism: each rank is a one-GPU engine replica with
    # its own requests, and the MoE layers place their experts over all the replicas
    experts_over_replicas: bool = False


_layout = Layout()
_large_sums: Optional["CopyEngineSums"] = None  # this step's, set by ``sums_by_copy``


def expert_all_to_all_cut() -> Optional[int]:
    """``FASTLLM_EP_ALL_TO_ALL_MIN_TOKENS``, read on the driver: every rank must take the same path.
    Unset: the all-reduce at every size (it beat the all-to-all on one NVLink host: benchmarks/RESULTS.md)."""
    cut = os.environ.get("FASTLLM_EP_ALL_TO_ALL_MIN_TOKENS")
    return None if cut is None else int(cut)


def set_layout(tensor_parallel_size: int, pipeline_parallel_size: int, expert_parallel: bool = False,
               expert_all_to_all_min_tokens: Optional[int] = None) -> None:
    """Record the split and, under pipeline parallelism, make each stage's tensor-parallel group
    (every rank creates every group, in the same order)."""
    global _layout
    group = None
    if pipeline_parallel_size > 1:
        for stage in range(pipeline_parallel_size):
            ranks = list(range(stage * tensor_parallel_size, (stage + 1) * tensor_parallel_size))
            created = dist.new_group(ranks)
            if dist.get_rank() in ranks:
                group = created
    _layout = Layout(tensor_parallel_size, pipeline_parallel_size, group, expert_parallel,
                     expert_all_to_all_min_tokens=expert_all_to_all_min_tokens)


def set_experts_over_replicas() -> None:
    """This process is one replica of a data-parallel group whose ranks share the MoE experts."""
    global _layout
    _layout = Layout(experts_over_replicas=True)


def experts_over_replicas() -> bool:
    return _layout.experts_over_replicas and dist.is_initialized()


def set_fast_all_reduce(reduce: Optional["SymmetricAllReduce"]) -> None:
    """An all-reduce for the tensors it ``fits``; None: the group's own for every tensor."""
    _layout.fast_all_reduce = reduce


def tp_group() -> Optional[dist.ProcessGroup]:
    """This stage's tensor-parallel group; None: the default group."""
    return _layout.tp_group


def reset_layout() -> None:
    global _layout
    _layout = Layout()


def tp_size() -> int:
    return _layout.tp if dist.is_initialized() else 1


def tp_rank() -> int:
    return dist.get_rank() % tp_size() if dist.is_initialized() else 0


def ep_size() -> int:
    """Over how many ranks MoE experts are placed (the tensor-parallel ones, or every data-parallel
    replica), 1 without expert parallelism."""
    if experts_over_replicas():
        return dist.get_world_size()
    return tp_size() if _layout.expert_parallel else 1


def ep_rank() -> int:
    if experts_over_replicas():
        return dist.get_rank()
    return tp_rank() if _layout.expert_parallel else 0


def use_expert_all_to_all(tokens: int) -> bool:
    """Whether an expert-parallel MoE layer dispatches this step's ``tokens`` by all-to-all
    (``fastllm.distributed.expert_dispatch``) rather than running every replicated token's local
    routes and all-reducing. Small steps keep the all-reduce: one message, no host sync, and
    capturable in a CUDA graph. ``FASTLLM_EP_ALL_TO_ALL_MIN_TOKENS`` sets the cut (0: always; unset: never)."""
    cut = _layout.expert_all_to_all_min_tokens
    return (ep_size() > 1 and cut is not None and tokens >= cut
            and not stream_capturing())


def pp_size() -> int:
    return _layout.pp if dist.is_initialized() else 1


def pp_rank() -> int:
    return dist.get_rank() // tp_size() if pp_size() > 1 else 0


def is_first_stage() -> bool:
    return pp_rank() == 0


def is_last_stage() -> bool:
    return pp_rank() == pp_size() - 1


def stage_layers(num_layers: int) -> range:
    """The decoder layers this rank's stage runs: contiguous, as even as the count allows."""
    size, stage = pp_size(), pp_rank()
    if num_layers < size:
        raise ValueError(f"{num_layers} layers cannot be split over pipeline_parallel_size={size}")
    return range(stage * num_layers // size, (stage + 1) * num_layers // size)


@contextmanager
def sums_by_copy(sums: Optional["CopyEngineSums"], tokens: int) -> Iterator[None]:
    """Sum the partials of a step of ``tokens`` rows through ``sums`` (``platforms.copy_engine_sums``)
    where they apply to it; otherwise, and with None, through the usual collectives."""
    global _large_sums
    previous = _large_sums
    _large_sums = sums if sums is not None and sums.applies(tokens) else None
    try:
        yield
    finally:
        _large_sums = previous


def large_sums() -> Optional["CopyEngineSums"]:
    """This step's copy-engine sums, for a row-parallel layer to write its partial into; None: none."""
    return _large_sums


def exchanged_partials(x: torch.Tensor) -> Optional[torch.Tensor]:
    """Every rank's partial sum ``x`` as ``[rows, ranks, hidden]`` summands where this step sums by
    copy engine and ``x`` fits; None otherwise."""
    sums = _large_sums
    return None if sums is None else sums.exchange(x)


def sequence_parallel_sums() -> Optional["CopyEngineSums"]:
    """This step's copy-engine sums where they run sequence parallel (a norm then works on this
    rank's rows only and gathers its output: ``platforms.copy_engine_sums``); None otherwise."""
    sums = _large_sums
    return sums if sums is not None and sums.sequence_parallel else None


def settled(x: torch.Tensor) -> torch.Tensor:
    """``x`` whole: where a sequence-parallel norm's rows of it are still being gathered, the
    current stream's next work waits for them. Any consumer of a norm's output other than a
    column-parallel linear layer (which computes on the rows already here first) calls it."""
    sums = _large_sums
    return x if sums is None else sums.settle(x)


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over the tensor-parallel ranks (in ``x`` or a new tensor: use the result)."""
    if tp_size() > 1:
        summands = exchanged_partials(x)
        if summands is not None:
            return summands.sum(1)
        fast = _layout.fast_all_reduce
        if fast is not None and fast.fits(x):
            return fast(x)
        dist.all_reduce(x, group=_layout.tp_group)
    return x


def all_reduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """``(rms_norm(s + residual), s + residual)`` for ``s`` the sum of ``x`` over the tensor-parallel
    ranks, in one kernel where the fast all-reduce has one for ``x``; None: sum, then norm."""
    fast = _layout.fast_all_reduce
    if tp_size() > 1 and fast is not None and fast.barrier_free_fits(x):
        return fast.add_rms_norm(x, residual, weight, eps)
    return None


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's shard of the last dimension (vocab-parallel logits)."""
    if tp_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(tp_size())]
    dist.all_gather(parts, x.contiguous(), group=_layout.tp_group)
    return torch.cat(parts, dim=-1)


def gather_over_ranks(x: torch.Tensor) -> torch.Tensor:
    """Every tensor-parallel rank's ``x`` in rank order, ``[ranks, *x.shape]``: one collective into
    one tensor (an all-gather into a list copies each part out again)."""
    if tp_size() == 1:
        return x[None]
    gathered = x.new_empty((tp_size() * x.shape[0], *x.shape[1:]))
    dist.all_gather_into_tensor(gathered, x.contiguous(), group=_layout.tp_group)
    return gathered.view(tp_size(), *x.shape)


def greedy_over_shards(gathered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The vocabulary's argmax (int64) and its logprob per row from every tensor-parallel rank's
    ``[3, rows]`` stats of its shard, ``[ranks, 3, rows]`` (``gather_over_ranks``): its max logit,
    that token's id (float32: ids below 2**24 are exact) and its log-sum-exp. Ties go to the lowest
    token id, as one argmax over the whole vocabulary would have it."""
    maxima, tokens, lses = gathered.unbind(1)  # each [ranks, rows], ranks in vocabulary order
    winner = maxima.argmax(dim=0, keepdim=True)  # the first rank among equal maxima
    return tokens.gather(0, winner).squeeze(0).long(), maxima.gather(0, winner).squeeze(0) - lses.logsumexp(dim=0)


def broadcast_input_ids(input_ids: torch.Tensor) -> torch.Tensor:
    """Rank 0's step tokens into every rank's ``input_ids`` (queued on the device, no host wait)."""
    dist.broadcast(input_ids, src=0)
    return input_ids


def send_to_next_stage(*tensors: torch.Tensor) -> None:
    """Hand activations to the same tensor-parallel rank of the next stage."""
    for tensor in tensors:
        dist.send(tensor.contiguous(), dst=dist.get_rank() + tp_size())


def receive_from_previous_stage(count: int, shape: tuple[int, ...], dtype: torch.dtype,
                                device: torch.device) -> list[torch.Tensor]:
    tensors = [torch.empty(shape, dtype=dtype, device=device) for _ in range(count)]
    for tensor in tensors:
        dist.recv(tensor, src=dist.get_rank() - tp_size())
    return tensors


def logits_to_driver(logits: Optional[torch.Tensor], shape: tuple[int, int],
                     device: torch.device) -> Optional[torch.Tensor]:
    """The last stage's logits on rank 0, which samples; other ranks get what they passed."""
    if pp_size() == 1:
        return logits
    last_stage_rank, rank = (pp_size() - 1) * tp_size(), dist.get_rank()
    if rank == last_stage_rank:
        dist.send(logits.contiguous(), dst=0)
    elif rank == 0:
        logits = torch.empty(shape, dtype=torch.float32, device=device)
        dist.recv(logits, src=last_stage_rank)
    return logits
