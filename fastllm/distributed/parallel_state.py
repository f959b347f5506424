"""Tensor-parallel rank and size of this process, and the collectives the layers need."""

from __future__ import annotations

import torch
import torch.distributed as dist


def tp_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def tp_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if tp_size() > 1:
        dist.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's shard of the last dimension (vocab-parallel logits)."""
    if tp_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(tp_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def broadcast_input_ids(input_ids: torch.Tensor) -> torch.Tensor:
    """Rank 0's step tokens into every rank's ``input_ids`` (queued on the device, no host wait)."""
    dist.broadcast(input_ids, src=0)
    return input_ids
