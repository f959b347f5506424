"""What the accelerator can do, measured here: copy bandwidth and dense matmul rate (the roofline's two
roofs). Run them before the engine takes the device's memory; each returns its memory to the device.
``platform``: the engine's (``fastllm.platforms``), which times calls on the device's clock."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch


def copy_bandwidth(platform: Any, nbytes: int = 2 * 2**30, reps: int = 5) -> float:
    """Bytes/s of a device-to-device copy of ``nbytes``, counting the read and the write."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=platform.device)
    dst = torch.empty_like(src)
    seconds = seconds_per_call(platform, partial(dst.copy_, src), reps)
    del src, dst
    platform.empty_cache()
    return 2 * nbytes / seconds


def matmul_flops(platform: Any, n: int = 8192, dtype: torch.dtype = torch.bfloat16, reps: int = 10) -> float:
    """FLOP/s of an ``n x n x n`` matmul in ``dtype``."""
    a, b = (torch.randn(n, n, device=platform.device).to(dtype) for _ in range(2))
    out = torch.empty(n, n, device=platform.device, dtype=dtype)
    seconds = seconds_per_call(platform, partial(torch.mm, a, b, out=out), reps)
    del a, b, out
    platform.empty_cache()
    return 2 * n**3 / seconds


def seconds_per_call(platform: Any, fn: Any, reps: int) -> float:
    """Mean time of ``reps`` calls after one warm-up call."""
    fn()
    return platform.seconds_per_call(fn, reps)
