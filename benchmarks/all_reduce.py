"""All-reduce latency by message size on this host's GPUs: NCCL against symmetric memory's
one-shot and two-shot kernels and the barrier-free (Lamport) kernel, each as a CUDA graph of
back-to-back calls (a decode step's situation) and eagerly; and, for rows of 4096, the
all-reduce + residual add + RMSNorm as the one-shot then the fused norm against the Lamport
kernel with the norm folded in. The data behind ``fastllm.platforms.symmetric_all_reduce``'s limits.

    python benchmarks/all_reduce.py --world-size 2 --output-json all_reduce.json

The Lamport kernel is timed up to the engine's limit (``FASTLLM_LAMPORT_MAX_KIB`` moves both).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fastllm.distributed.process_group import NCCL_ENV, free_tcp_port
from fastllm.platforms.symmetric_all_reduce import SymmetricAllReduce, barrier_free_max_bytes
from fastllm_kernels.rms_norm import fused_add_rms_norm

SIZES_KIB = [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
HIDDEN = 4096
CALLS = 32


def _timed(fn, graph: bool) -> float:
    """Microseconds per call of ``fn`` over CALLS back-to-back calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(CALLS):
                fn()
        run = g.replay
    else:
        def run():
            for _ in range(CALLS):
                fn()
    run()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (10 * CALLS)


def _rank(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(NCCL_ENV)
    torch.cuda.set_device(rank)
    torch.manual_seed(0)  # every rank draws the same inputs: the sum is world * x
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=device)
    biggest = max(SIZES_KIB) * 1024
    lamport_max = barrier_free_max_bytes()  # the engine's limit: its default, or FASTLLM_LAMPORT_MAX_KIB's
    reducers = {
        "one_shot": SymmetricAllReduce(dist.group.WORLD, device, one_shot_max_bytes=biggest, max_bytes=biggest,
                                       lamport_max_bytes=0),
        "two_shot": SymmetricAllReduce(dist.group.WORLD, device, one_shot_max_bytes=0, max_bytes=biggest,
                                       lamport_max_bytes=0),
        "lamport": SymmetricAllReduce(dist.group.WORLD, device, lamport_max_bytes=lamport_max),
    }
    weight = torch.randn(HIDDEN, dtype=torch.bfloat16, device=device)
    rows = []
    for kib in SIZES_KIB:
        x = torch.randn(kib * 512 // HIDDEN, HIDDEN, dtype=torch.bfloat16, device=device)  # kib KiB of bf16
        residual = torch.randn_like(x)
        want = x.float() * world
        kinds = {name: reduce for name, reduce in reducers.items()
                 if name != "lamport" or kib * 1024 <= lamport_max}
        errors = {name: (reduce(x.clone()).float() - want).abs().max().item() for name, reduce in kinds.items()}
        row = {"kib": kib, "max_abs_error": errors}
        for graph in (True, False):
            mode = "graph" if graph else "eager"
            row[f"nccl_{mode}_us"] = _timed(lambda: dist.all_reduce(x), graph)
            for name, reduce in kinds.items():
                row[f"{name}_{mode}_us"] = _timed(lambda: reduce(x), graph)
            if "lamport" in kinds:
                row[f"one_shot_then_norm_{mode}_us"] = _timed(
                    lambda: fused_add_rms_norm(reducers["one_shot"](x), residual, weight, 1e-5), graph)
                row[f"lamport_norm_{mode}_us"] = _timed(
                    lambda: reducers["lamport"].add_rms_norm(x, residual, weight, 1e-5), graph)
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world_size": world, "device": torch.cuda.get_device_name(), "calls": CALLS, "rows": rows}, f,
                      indent=1)
    reducers.clear()  # the symmetric buffers go before the group
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--output-json", default="all_reduce.json")
    args = parser.parse_args()
    mp.spawn(_rank, args=(args.world_size, free_tcp_port(), args.output_json), nprocs=args.world_size)


if __name__ == "__main__":
    main()
