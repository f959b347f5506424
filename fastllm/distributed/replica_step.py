"""What the lockstep data-parallel replicas agree on before each forward pass (data-parallel
attention with expert parallelism).

Every replica's MoE layers gather all the replicas' tokens, so each must know the others' row
counts. One small all-gather a step carries each replica's plan: its token count, whether its
step could replay a decode graph (single-token decodes only, nothing else in the way), and
whether it has work at all (an idle replica runs a dummy step to keep the collectives paired).
It runs over a gloo group on the host, so no replica waits for its device's queued work there
and steps still overlap. From the same facts every replica draws the same decision: where all
can replay and the largest count fits a captured batch size, all replay the graph of that
common bucket (each brings exactly the bucket's rows, its real ones first, so the MoE gather
has a fixed size and reads no count on the host); otherwise all run eagerly with the real counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from fastllm.platforms.transfer import to_device

_host_group: Optional[dist.ProcessGroup] = None  # gloo, over every replica: where the agreement runs


@dataclass(frozen=True)
class ReplicaPlan:
    """One replica's step as the others need to know it."""

    tokens: int
    graphable: bool  # single-token decodes the replica's decode graphs could run at some batch size
    work: bool = True  # False: a dummy step that only keeps step with the others


@dataclass(frozen=True)
class ReplicaStep:
    """The step all the replicas agreed on."""

    counts: list[int]  # every replica's real token count, in rank order
    real_on_device: Optional[torch.Tensor]  # a padded step's rows that are not padding (an idle replica's
    # dummy row is), on the device; None for an eager step
    bucket: Optional[int]  # the common padded row count every replica replays; None: eager, real counts
    work: bool  # whether any replica has work (none: every replica skips the forward)


def common_bucket(plans: list[ReplicaPlan], sizes: list[int]) -> Optional[int]:
    """The smallest of the captured batch ``sizes`` (ascending) that holds every replica's tokens,
    where every replica can replay a graph; else None."""
    if not sizes or not all(plan.graphable for plan in plans):
        return None
    need = max(plan.tokens for plan in plans)
    return next((size for size in sizes if size >= need), None)


def join_host_group() -> None:
    """Every replica, once in the default group: make the host group the agreement runs over."""
    global _host_group
    _host_group = dist.new_group(backend="gloo")


def agree_step(plan: ReplicaPlan, sizes: list[int], device: torch.device) -> ReplicaStep:
    """Exchange every replica's ``plan`` (one all-gather on the host) and decide the step; a padded
    step's real row counts go to ``device`` queued behind its work."""
    mine = torch.tensor([plan.tokens, plan.graphable, plan.work], dtype=torch.long)
    every = torch.empty(dist.get_world_size() * mine.numel(), dtype=torch.long)
    dist.all_gather_into_tensor(every, mine, group=_host_group)
    plans = [ReplicaPlan(tokens, bool(graphable), bool(work))
             for tokens, graphable, work in every.view(-1, mine.numel()).tolist()]
    bucket = common_bucket(plans, sizes)
    real = None if bucket is None else to_device([p.tokens if p.work else 0 for p in plans], torch.long, device)
    return ReplicaStep([p.tokens for p in plans], real, bucket, any(p.work for p in plans))


def padding_rows(counts: torch.Tensor, bucket: int) -> torch.Tensor:
    """``[len(counts) * bucket, 1]`` bool: which rows of the replicas' gathered padded steps are
    padding (replica ``r`` brings ``bucket`` rows, its ``counts[r]`` real ones first); computed on
    the device from ``counts``, so a captured graph reads the counts of the step it replays."""
    rows = torch.arange(bucket, device=counts.device)
    return (rows[None, :] >= counts[:, None]).reshape(-1, 1)
