"""The attention layer models call: hands q/k/v to the step's backend with this layer's cache."""

from __future__ import annotations

import torch
import torch.nn as nn

from fastllm.attention.metadata import get_forward_context


class Attention(nn.Module):
    def __init__(self, layer_idx: int, num_heads: int, head_dim: int, num_kv_heads: int, scale: float):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q ``[T, H, D]``, k/v ``[T, KVH, D]`` -> ``[T, H * D]``."""
        ctx = get_forward_context()
        k_cache, v_cache = ctx.kv_caches[self.layer_idx]
        out = ctx.backend.forward(q, k, v, k_cache, v_cache, ctx.attn_metadata, self.scale)
        return out.flatten(1)
