"""The CPU platform: float32 by default, the torch attention backend, gloo for tensor parallel."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from types import ModuleType
from typing import Any, Callable, Optional

import torch

from fastllm.platforms.interface import DTYPES, fastllm_kernels


class CpuPlatform:
    name = "cpu"
    device = torch.device("cpu")
    dist_backend = "gloo"
    default_attention_backend = "torch"
    priority = 0
    overlaps_steps = False  # a CPU op returns when it is done
    warms_up_kernels = False
    measures_rooflines = False
    triton_rounds_fp8_exactly = False  # Triton's interpreter

    @classmethod
    def is_available(cls) -> bool:
        return True

    def resolve_dtype(self, requested: str, checkpoint_dtype: torch.dtype | None) -> torch.dtype:
        """``auto`` is float32: CPU half-precision matmuls are slow and less exact."""
        return torch.float32 if requested == "auto" else DTYPES[requested]

    def kv_cache_budget(self, profile_peak: Callable[[], int], engine_config) -> int:
        return int(engine_config.cpu_kv_cache_gib * 2**30)

    def synchronize(self) -> None:
        pass

    def seconds_per_call(self, fn: Callable[[], object], reps: int) -> float:
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - start) / reps

    def empty_cache(self) -> None:
        pass

    def visible_devices(self, count: int) -> list[str]:
        """Processes share the host: no device to split."""
        return [""] * count

    def only_devices(self, devices: list[str]) -> AbstractContextManager[None]:
        return nullcontext()

    def kernels(self) -> Optional[ModuleType]:
        return fastllm_kernels(default_on=False)

    def peak_memory_bytes(self) -> int:
        return 0

    def decode_graphs(self, forward: Callable[..., torch.Tensor], max_batch: int, max_blocks_per_seq: int,
                      max_model_len: int, max_query_len: int, adapters: Any = None) -> Optional[object]:
        return None
