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


@functools.lru_cache(maxsize=None)
def fp8_tensor_cores(device: torch.device) -> bool:
    """Whether the tensor cores of ``device`` multiply e4m3 operands (NVIDIA compute capability
    8.9 and later: Ada, Hopper), so a ``tl.dot`` of two fp8 tiles runs as one."""
    return compiled_nvidia(device) and torch.cuda.get_device_capability(device) >= (8, 9)


@functools.lru_cache(maxsize=None)
def multiprocessors(device: torch.device) -> int:
    """The CUDA device's multiprocessor count, asked once: grids size themselves by it every launch."""
    return torch.cuda.get_device_properties(device).multi_processor_count


RESIDENT_BLOCKS = {(7, 5): 16, (8, 6): 16, (8, 7): 16, (8, 9): 24}
"""Thread blocks one multiprocessor holds at most, by compute capability, where CUDA's table does
not give 32 (Volta, A100, Hopper)."""


@functools.lru_cache(maxsize=None)
def resident_blocks(device: torch.device) -> int:
    """The most thread blocks one multiprocessor of the CUDA ``device`` holds at once."""
    return RESIDENT_BLOCKS.get(torch.cuda.get_device_capability(device), 32)
