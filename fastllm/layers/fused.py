"""fastllm-kernels' fused Triton ops for the layers: one kernel where torch would launch several.

``FASTLLM_TRITON_OPS``: ``auto`` (the default) uses them on CUDA tensors when fastllm-kernels
is installed, ``1`` everywhere (on CPU through Triton's interpreter, for tests), ``0`` never.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Optional

import torch

MODE = os.environ.get("FASTLLM_TRITON_OPS", "auto")
_kernels: Optional[ModuleType] = None
_looked_up = False


def kernels_for(x: torch.Tensor) -> Optional[ModuleType]:
    """The kernel module when ``x`` should go through it, else None (use plain torch)."""
    global _kernels, _looked_up
    if MODE == "0" or (MODE == "auto" and not x.is_cuda):
        return None
    if not _looked_up:
        try:
            import fastllm_kernels
        except ImportError:
            fastllm_kernels = None
        _kernels, _looked_up = fastllm_kernels, True
    return _kernels
