"""A hardware platform: its device, default dtype and attention backend, and KV-cache budget."""

from __future__ import annotations

from typing import Callable, Protocol

import torch


class Platform(Protocol):
    name: str
    device: torch.device
    dist_backend: str
    default_attention_backend: str

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


DTYPES = {
    "half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float": torch.float32, "float32": torch.float32,
}
