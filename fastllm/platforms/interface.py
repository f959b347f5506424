"""A hardware platform: the only code that knows the device. Its dtype and attention backend,
KV-cache budget, memory profiling, whether launches run ahead of the device, and graph capture."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any, Callable, Optional, Protocol

import torch


class Platform(Protocol):
    name: str
    device: torch.device
    dist_backend: str
    default_attention_backend: str
    priority: int
    """With no ``platform=`` named, the available platform of highest priority serves."""
    overlaps_steps: bool
    """Launches return before the device finishes, so step n+1 can be queued before step n is read."""
    warms_up_kernels: bool
    """Kernels compile on first use: run every variant once before serving."""
    measures_rooflines: bool
    """The benchmarks measure its copy bandwidth and matmul rate (an accelerator's roofs)."""
    triton_rounds_fp8_exactly: bool
    """Triton kernels round to fp8 as torch does (Triton's CPU interpreter does not, so attention
    backends store an fp8 KV cache with torch there)."""

    @classmethod
    def is_available(cls) -> bool: ...

    def resolve_dtype(self, requested: str, checkpoint_dtype: torch.dtype | None) -> torch.dtype:
        """The compute dtype for ``dtype=requested`` ("auto", "bfloat16", ...)."""
        ...

    def kv_cache_budget(self, profile_peak: Callable[[], int], engine_config) -> int:
        """Bytes the KV cache may take; ``profile_peak`` runs the largest batch and returns
        the peak activation bytes it needed."""
        ...

    def synchronize(self) -> None: ...

    def seconds_per_call(self, fn: Callable[[], object], reps: int) -> float:
        """Mean seconds of ``reps`` calls of ``fn``, on the device's own clock where it has one."""
        ...

    def empty_cache(self) -> None:
        """Give cached, unused device memory back (before another library allocates)."""
        ...

    def visible_devices(self, count: int) -> list[str]:
        """At least ``count`` device ids that processes split among them (``only_devices``)."""
        ...

    def only_devices(self, devices: list[str]) -> AbstractContextManager[None]:
        """Within it, a spawned process sees only ``devices`` (a child copies the environment)."""
        ...

    def kernels(self) -> Optional[ModuleType]:
        """The fused-kernel module the layers and the sampler keep when the model is built
        (``fastllm.layers.fused.use_kernels``), or None for their plain torch paths."""
        ...

    def peak_memory_bytes(self) -> int:
        """Peak bytes allocated on the device since the last reset (0 where not tracked)."""
        ...

    def decode_graphs(self, forward: Callable[..., torch.Tensor], max_batch: int, max_blocks_per_seq: int,
                      max_model_len: int, max_query_len: int, adapters: Any = None) -> Optional[Any]:
        """Captured decode steps (``fastllm.platforms.cuda_graphs.DecodeGraphs``'s interface:
        ``can_run(meta)``, ``run(input_ids, positions, meta, adapter_batch, size)``, and for lockstep
        data-parallel replicas ``sizes`` and ``fits_tables(meta)``), or None to run
        eagerly. ``adapters``: the engine's adapter manager, whose per-token slots become a
        captured input."""
        ...


DTYPES = {
    "half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float": torch.float32, "float32": torch.float32,
}


def fastllm_kernels(default_on: bool) -> Optional[ModuleType]:
    """fastllm-kernels' Triton ops where the platform uses them: ``FASTLLM_TRITON_OPS`` is
    ``auto`` (the platform's default), ``1`` (always; on the CPU through Triton's interpreter,
    as the tests do) or ``0`` (never); None where the package is not installed."""
    mode = os.environ.get("FASTLLM_TRITON_OPS", "auto")
    if mode == "0" or (mode == "auto" and not default_on):
        return None
    try:
        import fastllm_kernels
    except ImportError:
        return None
    return fastllm_kernels

