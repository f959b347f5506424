"""What an attention backend must do: write this step's K/V into the paged cache, then attend."""

from __future__ import annotations

from typing import Protocol

import torch

from fastllm.attention.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    """Built with the platform it runs on (``fastllm.platforms.interface.Platform``), which
    answers its hardware questions once; one instance serves every layer of a model.

    Cache layout (per layer): ``k_cache``, ``v_cache`` shaped
    ``[num_blocks, block_size, num_kv_heads, head_dim]``.
    """

    name: str
    # optional: ``fuses_rotation = True`` and a ``rotation`` keyword on ``forward`` (a
    # ``fastllm.layers.rotary.Rotation`` to apply to query and key before the cache write)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """query ``[T, H, D]``, key/value ``[T, KVH, D]`` -> output ``[T, H, D]``."""
        ...
