"""Rotary position embedding (NeoX layout, as HF Llama/Qwen), with Llama-3 and linear scaling."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn as nn

from fastllm.layers.fused import current_kernels


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's frequency-dependent scaling of long wavelengths."""
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Rotates query and key by position; the cos/sin table is computed once in float32."""

    def __init__(self, head_dim: int, max_position: int, base: float,
                 scaling: Optional[dict[str, Any]] = None):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if kind == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, scaling)
        elif kind == "linear":
            inv_freq = inv_freq / scaling["factor"]
        elif kind != "default":
            raise ValueError(f"rope scaling {kind!r} is not supported (default, linear, llama3 are)")
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.register_buffer("cos_sin_cache", torch.cat([freqs.cos(), freqs.sin()], dim=-1),
                             persistent=False)
        self.kernels = current_kernels()

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        """query ``[T, H, D]``, key ``[T, KVH, D]``; returns both rotated (in place on CUDA)."""
        if self.kernels is not None:
            return self.kernels.rotary_embedding(positions, query, key, self.cos_sin_cache, query.shape[-1])
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return _rotate(query, cos, sin), _rotate(key, cos, sin)


@dataclass(frozen=True)
class Rotation:
    """A rotary embedding still to be applied to a step's query and key: an attention backend
    that writes the KV cache in a kernel (``fuses_rotation``) does it in that kernel."""

    positions: torch.Tensor
    rotary: RotaryEmbedding

    def __call__(self, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary(self.positions, query, key)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
