"""The barrier-free all-reduce (+ residual add + RMSNorm) on two real GPUs against NCCL's
all-reduce followed by the fused norm: eagerly, then replayed from a CUDA graph many times
(its phase counter lives on the device), with every rank getting the same bits."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fastllm.distributed.process_group import NCCL_ENV, free_tcp_port

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs with peer access")

HIDDEN = 4096


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return ((a.double() - b.double()).norm() / b.double().norm()).item() < 2e-2


def _rank(rank: int, world: int, port: int, failures) -> None:
    from fastllm.platforms.symmetric_all_reduce import SymmetricAllReduce
    from fastllm_kernels.rms_norm import fused_add_rms_norm

    os.environ.update(NCCL_ENV)
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=device)
    fast = SymmetricAllReduce(dist.group.WORLD, device)
    torch.manual_seed(0)
    weight = torch.randn(HIDDEN, device=device).bfloat16()
    residual = torch.randn(16, HIDDEN, device=device).bfloat16()
    torch.manual_seed(1 + rank)
    parts = torch.randn(16, HIDDEN, device=device).bfloat16()
    try:
        for rows in (1, 4, 16):
            x, res = parts[:rows], residual[:rows]
            assert fast.barrier_free_fits(x)
            summed = x.clone()
            dist.all_reduce(summed)
            want, want_residual = fused_add_rms_norm(summed, res, weight, 1e-5)

            out, new_residual = fast.add_rms_norm(x, res, weight, 1e-5)  # eager
            assert _close(out, want) and _close(new_residual, want_residual), f"eager, {rows} rows"
            assert _close(fast(x), summed), f"all-reduce alone, {rows} rows"

            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = [fast.add_rms_norm(x, res, weight, 1e-5) for _ in range(5)]  # 5 calls: phases wrap
            for _ in range(20):
                graph.replay()
            torch.cuda.synchronize()
            for out, new_residual in outs:
                assert _close(out, want) and _close(new_residual, want_residual), f"graph, {rows} rows"
            gathered = [torch.empty_like(outs[-1][0]) for _ in range(world)]
            dist.all_gather(gathered, outs[-1][0])
            assert all(torch.equal(g, gathered[0]) for g in gathered), "ranks disagree"
    except AssertionError as exc:
        failures.put(f"rank {rank}: {exc}")
    finally:
        del fast
        dist.destroy_process_group()


def test_matches_nccl_then_norm_eagerly_and_in_graphs():
    failures = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_rank, args=(2, free_tcp_port(), failures), nprocs=2)
    reports = []
    while not failures.empty():
        reports.append(failures.get())
    assert not reports, reports
