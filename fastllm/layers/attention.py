"""The attention layer models call: hands q/k/v to the step's backend with this layer's cache."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch
import torch.nn as nn

from fastllm.attention.metadata import get_forward_context
from fastllm.layers.rotary import Rotation


class Attention(nn.Module):
    def __init__(self, layer_idx: int, num_heads: int, head_dim: int, num_kv_heads: int, scale: float):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                rotation: Optional[Rotation] = None) -> torch.Tensor:
        """q ``[T, H, D]``, k/v ``[T, KVH, D]`` -> ``[T, H * D]``; ``rotation``: applied to q and k
        first, by the backend where it ``fuses_rotation``."""
        ctx = get_forward_context()
        k_cache, v_cache = ctx.kv_caches[self.layer_idx]
        if rotation is not None:
            fuses = getattr(ctx.backend, "fuses_rotation", False) and rotation.positions.dim() == 1  # M-RoPE: none
            if rotation.norms is not None and fuses and not getattr(ctx.backend, "fuses_head_norms", False):
                q, k = rotation.normalize(q, k)
                rotation = replace(rotation, norms=None)
            if not fuses:
                q, k = rotation(q, k)
                rotation = None
        fused = {} if rotation is None else {"rotation": rotation}
        out = ctx.backend.forward(q, k, v, k_cache, v_cache, ctx.attn_metadata, self.scale, **fused)
        return out.flatten(1)
