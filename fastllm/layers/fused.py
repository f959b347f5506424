"""Which fused kernels the layers use: chosen once, when the model is built, not per call.

The platform names the kernel module (``Platform.kernels()``: fastllm-kernels' Triton ops on
CUDA, none on the CPU), and every layer built inside ``use_kernels(module)`` keeps that module
(``current_kernels()`` in its constructor); a layer with None runs its plain torch path.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import ModuleType
from typing import Iterator, Optional

_current: Optional[ModuleType] = None


@contextmanager
def use_kernels(kernels: Optional[ModuleType]) -> Iterator[None]:
    """Layers constructed inside use ``kernels`` (None: plain torch)."""
    global _current
    previous, _current = _current, kernels
    try:
        yield
    finally:
        _current = previous


def current_kernels() -> Optional[ModuleType]:
    """The kernel module a layer under construction should keep."""
    return _current
