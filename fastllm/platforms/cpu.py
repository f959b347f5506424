"""The CPU platform: float32 by default, the torch attention backend, gloo for tensor parallel."""

from __future__ import annotations

from typing import Callable

import torch

from fastllm.platforms.interface import DTYPES


class CpuPlatform:
    name = "cpu"
    device = torch.device("cpu")
    dist_backend = "gloo"
    default_attention_backend = "torch"

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
