"""Only a process's first tensor-parallel group sets torch's symmetric memory up.

Torch names a rendezvous's store keys by a count kept for the life of the process: a second
engine's rank 0 (the same process) and its new workers would wait for each other's keys forever,
as two H200s showed. The symmetric-memory module is replaced by a stand-in here, so the rule runs
on the CPU over gloo groups.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from typing_extensions import deprecated

import fastllm.platforms.symmetric_all_reduce as symmetric
from fastllm.distributed.process_group import free_tcp_port

CPU = torch.device("cpu")
_MODULE = "torch.distributed._symmetric_memory"


@pytest.fixture
def join_group(monkeypatch):
    """Joins a fresh one-rank group (a new engine's), leaving the last one; a process not yet claimed."""
    monkeypatch.setattr(symmetric, "_claimed_group", None)
    monkeypatch.setattr(symmetric, "_process_claimed", False)

    def join() -> dist.ProcessGroup:
        if dist.is_initialized():
            symmetric.release_symmetric_memory()
            dist.destroy_process_group()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_tcp_port()}", rank=0, world_size=1)
        return dist.group.WORLD

    yield join
    if dist.is_initialized():
        dist.destroy_process_group()


def _stand_in(monkeypatch, enable) -> None:
    module = SimpleNamespace(enable_symm_mem_for_group=enable)
    monkeypatch.setitem(sys.modules, _MODULE, module)
    monkeypatch.setattr(dist, "_symmetric_memory", module, raising=False)


def test_an_older_torch_is_told_of_the_first_group_once(monkeypatch, join_group):
    told: list[str] = []
    _stand_in(monkeypatch, told.append)
    group = join_group()
    symmetric.claim_symmetric_memory(group, CPU)
    symmetric.claim_symmetric_memory(group, CPU)  # its second user: the copy-engine sums
    assert told == [group.group_name]


def test_a_torch_that_finds_groups_itself_is_not_told(monkeypatch, join_group):
    told: list[str] = []

    @deprecated("finds groups itself")
    def enable(name: str) -> None:
        told.append(name)

    _stand_in(monkeypatch, enable)
    symmetric.claim_symmetric_memory(join_group(), CPU)
    assert told == []


def test_a_later_engine_of_the_process_is_refused(monkeypatch, join_group):
    _stand_in(monkeypatch, lambda name: None)
    symmetric.claim_symmetric_memory(join_group(), CPU)
    later = join_group()  # same name ("0"), another group
    with pytest.raises(RuntimeError, match="earlier engine"):
        symmetric.claim_symmetric_memory(later, CPU)


def _rank(rank: int, init: str, results: dict) -> None:
    """Rank 0's process served an earlier engine (the driver's), rank 1's is new (a worker's)."""
    symmetric._process_claimed = rank == 0
    sys.modules[_MODULE] = dist._symmetric_memory = SimpleNamespace(enable_symm_mem_for_group=lambda name: None)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        symmetric.claim_symmetric_memory(dist.group.WORLD, CPU)
        results[rank] = "claimed"
    except RuntimeError:
        results[rank] = "refused"
    finally:
        dist.destroy_process_group()


def test_every_rank_refuses_when_one_process_served_an_earlier_engine(tmp_path):
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(f"file://{tmp_path}/rendezvous", results), nprocs=2)
    assert dict(results) == {0: "refused", 1: "refused"}
