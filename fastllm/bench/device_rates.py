"""What the accelerator can do, measured here: copy bandwidth and dense matmul rate (the roofline's two
roofs). Run them before the engine takes the device's memory; each returns its memory to the device."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import torch


def copy_bandwidth(device: torch.device, nbytes: int = 2 * 2**30, reps: int = 5) -> float:
    """Bytes/s of a device-to-device copy of ``nbytes``, counting the read and the write."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = seconds_per_call(device, partial(dst.copy_, src), reps)
    del src, dst
    _release(device)
    return 2 * nbytes / seconds


def matmul_flops(device: torch.device, n: int = 8192, dtype: torch.dtype = torch.bfloat16, reps: int = 10) -> float:
    """FLOP/s of an ``n x n x n`` matmul in ``dtype``."""
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds = seconds_per_call(device, partial(torch.mm, a, b, out=out), reps)
    del a, b, out
    _release(device)
    return 2 * n**3 / seconds


def seconds_per_call(device: torch.device, fn: Callable[[], object], reps: int) -> float:
    """Mean time of ``reps`` calls after one warm-up call, on the device's own clock where it has one."""
    fn()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - start) / reps
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    begin.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1000 / reps


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
