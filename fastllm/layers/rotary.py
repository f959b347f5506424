"""Rotary position embedding (NeoX layout, as HF Llama/Qwen), with Llama-3 and linear scaling."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from types import ModuleType
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


_TABLES: "weakref.WeakValueDictionary[tuple, torch.Tensor]" = weakref.WeakValueDictionary()
"""cos/sin tables by (frequencies, length, device), alive while a module holds one: every layer
of a model shares one table instead of holding its own (tens of MB each at long context, which
otherwise come out of the KV cache)."""


def _cos_sin_table(inv_freq: torch.Tensor, max_position: int) -> torch.Tensor:
    """The shared table (a fresh one on the meta device, whose frequencies have no values)."""
    key = None if inv_freq.is_meta else (tuple(inv_freq.tolist()), max_position, str(inv_freq.device))
    table = None if key is None else _TABLES.get(key)
    if table is None:
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        table = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
        if key is not None:
            _TABLES[key] = table
    return table


class RotaryEmbedding(nn.Module):
    """Rotates query and key by position; the cos/sin table is computed once in float32 and
    shared by the layers with the same frequencies (read only)."""

    def __init__(self, head_dim: int, max_position: int, base: float,
                 scaling: Optional[dict[str, Any]] = None):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if kind == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, scaling)
        elif kind == "linear":
            inv_freq = inv_freq / scaling["factor"]
        elif kind not in ("default", "mrope"):  # mrope: default frequencies, sections in MRotaryEmbedding
            raise ValueError(f"rope scaling {kind!r} is not supported (default, linear, llama3 are)")
        self.register_buffer("cos_sin_cache", _cos_sin_table(inv_freq, max_position), persistent=False)
        self.kernels = current_kernels()

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        """query ``[T, H, D]``, key ``[T, KVH, D]``; returns both rotated (in place on CUDA)."""
        return _apply(self.kernels, self.cos_sin_cache, positions, query, key)


class MRotaryEmbedding(RotaryEmbedding):
    """Qwen2-VL's multimodal rotary (M-RoPE): consecutive sections of the rotated dimensions
    turn by the token's time, height and width positions (``[3, T]``). Text has three equal
    positions, so ``[T]`` positions (text-only steps, decodes) rotate as plain rotary."""

    def __init__(self, head_dim: int, max_position: int, base: float, sections: list[int]):
        super().__init__(head_dim, max_position, base)
        if sum(sections) != head_dim // 2:
            raise ValueError(f"mrope_section {sections} must add up to head_dim / 2 = {head_dim // 2}")
        axis = torch.cat([torch.full((n,), i % 3, dtype=torch.int64) for i, n in enumerate(sections)])
        self.register_buffer("axis_of_column", torch.cat([axis, axis]), persistent=False)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        if positions.dim() == 1:
            return super().forward(positions, query, key)
        per_axis = self.cos_sin_cache[positions]  # [3, T, D]: every column under all three positions
        table = per_axis.gather(0, self.axis_of_column.expand(1, positions.shape[1], -1)).squeeze(0)
        return _apply(self.kernels, table, torch.arange(positions.shape[1], device=positions.device), query, key)


def _apply(kernels: Optional[ModuleType], cos_sin: torch.Tensor, positions: torch.Tensor, query: torch.Tensor,
           key: torch.Tensor):
    if kernels is not None:
        return kernels.rotary_embedding(positions, query, key, cos_sin, query.shape[-1])
    cos, sin = cos_sin[positions].chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return _rotate(query, cos, sin), _rotate(key, cos, sin)


@dataclass(frozen=True)
class Rotation:
    """A rotary embedding still to be applied to a step's query and key: an attention backend
    that writes the KV cache in a kernel (``fuses_rotation``) does it in that kernel. ``norms``:
    the RMSNorm of each query and key head that comes first (Qwen3), fused there too where the
    backend ``fuses_head_norms``."""

    positions: torch.Tensor
    rotary: RotaryEmbedding
    norms: Optional[tuple[nn.Module, nn.Module]] = None

    def __call__(self, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary(self.positions, *self.normalize(query, key))

    def normalize(self, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Query and key through the head norms (as they are without norms)."""
        if self.norms is None:
            return query, key
        return self.norms[0](query), self.norms[1](key)

    @property
    def norm_weights(self) -> Optional[tuple[torch.Tensor, torch.Tensor, float]]:
        """(query norm weight, key norm weight, eps): what a fused kernel takes, or None."""
        if self.norms is None:
            return None
        q_norm, k_norm = self.norms
        return q_norm.weight, k_norm.weight, q_norm.eps


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
