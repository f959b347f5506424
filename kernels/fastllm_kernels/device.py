"""Which code paths a device's Triton kernels can take."""

from __future__ import annotations

import functools
import os

import torch


@functools.lru_cache(maxsize=None)
def compiled_nvidia(device: torch.device) -> bool:
    """Whether Triton kernels on ``device`` are compiled for an NVIDIA GPU, so that they may use
    inline PTX and Hopper's grid dependency control: not ROCm (whose gfx9 GPUs also report
    capability 9.x), not the interpreter."""
    return device.type == "cuda" and not torch.version.hip and os.environ.get("TRITON_INTERPRET") != "1"
