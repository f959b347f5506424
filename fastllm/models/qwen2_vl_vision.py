"""The Qwen2-VL and Qwen2.5-VL vision towers: patch embedding, ViT blocks over each image's own
patches (Qwen2.5: inside windows, except its full-attention blocks), 2x2 patch merger."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import ACT2FN


class VisionRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class PatchEmbed(nn.Module):
    """A Conv3d whose kernel equals its stride over pre-cut patches: one matmul."""

    def __init__(self, patch: int, temporal_patch: int, channels: int, dim: int):
        super().__init__()
        self.proj = nn.Module()
        self.proj.weight = nn.Parameter(torch.empty(dim, channels, temporal_patch, patch, patch))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight
        return pixels.to(weight.dtype) @ weight.flatten(1).t()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class VisionAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, segments: list[torch.Tensor], cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        """``segments``: ``segments_by_length``'s rows; attention stays within each segment."""
        q, k, v = self.qkv(x).unflatten(-1, (3, self.num_heads, -1)).unbind(1)
        q, k = ((t.float() * cos + rotate_half(t.float()) * sin).to(x.dtype) for t in (q, k))
        out = torch.empty_like(q)
        for index in segments:  # [n, L]: n segments of L patches
            segment = [t[index].transpose(1, 2) for t in (q, k, v)]  # [n, heads, L, head_dim]
            out[index] = F.scaled_dot_product_attention(*segment).transpose(1, 2)
        return self.proj(out.flatten(1))


def segments_by_length(cu_seqlens: list[int], device: torch.device) -> list[torch.Tensor]:
    """The rows of each segment ``[cu_seqlens[i], cu_seqlens[i + 1])``, segments of one length
    stacked ``[n, L]``: one attention call per length rather than per window or frame."""
    starts: dict[int, list[int]] = {}
    for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        if end > start:
            starts.setdefault(end - start, []).append(start)
    return [(torch.tensor(firsts)[:, None] + torch.arange(length)).to(device) for length, firsts in starts.items()]


class VisionMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        self.fc1, self.fc2, self.act = nn.Linear(dim, hidden), nn.Linear(hidden, dim), ACT2FN[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionGatedMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(dim, hidden), nn.Linear(dim, hidden)
        self.down_proj, self.act = nn.Linear(hidden, dim), ACT2FN[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, norm: type[nn.Module], mlp: nn.Module):
        super().__init__()
        self.norm1, self.norm2 = norm(dim, eps=1e-6), norm(dim, eps=1e-6)
        self.attn = VisionAttention(dim, num_heads)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, segments: list[torch.Tensor], cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), segments, cos, sin)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """Each 2x2 block of neighbouring patches (adjacent rows after the processor's layout) -> one token."""

    def __init__(self, out_dim: int, dim: int, merge: int, norm: type[nn.Module]):
        super().__init__()
        self.hidden = dim * merge ** 2
        self.ln_q = norm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(self.hidden, self.hidden), nn.GELU(), nn.Linear(self.hidden, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.hidden))


def patch_positions(grid_thw: list[tuple[int, int, int]], merge: int) -> torch.Tensor:
    """``[N, 2]`` (row, column) of each patch, in the processor's merge-block-major order."""
    rows = []
    for t, h, w in grid_thw:
        hpos, wpos = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        shape = (h // merge, merge, w // merge, merge)
        hw = torch.stack([p.reshape(shape).transpose(1, 2).flatten() for p in (hpos, wpos)], dim=-1)
        rows.append(hw.repeat(t, 1))
    return torch.cat(rows)


def rotary_angles(grid_thw: list[tuple[int, int, int]], merge: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """``[N, head_dim]`` rotary angles of each patch: its row turns the first half's frequencies,
    its column the second's, both repeated for NeoX-style halves."""
    angles = (patch_positions(grid_thw, merge).to(inv_freq.device)[..., None].float() * inv_freq).flatten(1)
    return torch.cat([angles, angles], dim=-1)


def frame_bounds(grid_thw: list[tuple[int, int, int]]) -> list[int]:
    """Cumulative patch counts of every frame of every item: attention stays within one."""
    bounds = [0]
    for t, h, w in grid_thw:
        for _ in range(t):
            bounds.append(bounds[-1] + h * w)
    return bounds


def window_index(grid_thw: list[tuple[int, int, int]], merge: int, window: int) -> tuple[torch.Tensor, list[int]]:
    """Qwen2.5-VL's windows: the merged-token order that groups each ``window x window`` tile of
    merged tokens together, and the windows' cumulative patch counts (as transformers'
    ``get_vision_window_index``)."""
    order, bounds, base = [], [0], 0
    for t, h, w in grid_thw:
        gh, gw = h // merge, w // merge
        index = torch.arange(t * gh * gw).reshape(t, gh, gw)
        pad_h, pad_w = window - gh % window, window - gw % window
        nh, nw = (gh + pad_h) // window, (gw + pad_w) // window
        padded = F.pad(index, (0, pad_w, 0, pad_h), value=-1)
        padded = padded.reshape(t, nh, window, nw, window).permute(0, 1, 3, 2, 4).reshape(t, nh * nw, -1)
        counts = (padded >= 0).sum(-1).flatten()
        order.append(padded.flatten()[padded.flatten() >= 0] + base)
        for count in counts.tolist():
            if count:
                bounds.append(bounds[-1] + count * merge ** 2)
        base += t * gh * gw
    return torch.cat(order), bounds


class VisionTransformer(nn.Module):
    """Qwen2-VL's tower; with ``window_size`` in the config, Qwen2.5-VL's."""

    def __init__(self, config: Any):
        super().__init__()
        self.merge = config.spatial_merge_size
        windowed = hasattr(config, "window_size")
        if windowed:  # Qwen2.5-VL
            dim, out_dim, norm = config.hidden_size, config.out_hidden_size, VisionRMSNorm
            self.window = config.window_size // self.merge // config.patch_size
            self.full_attention = set(config.fullatt_block_indexes)

            def mlp() -> nn.Module:
                return VisionGatedMLP(dim, config.intermediate_size, config.hidden_act)
        else:
            dim, out_dim, norm = config.embed_dim, config.hidden_size, nn.LayerNorm
            self.window, self.full_attention = 0, set()

            def mlp() -> nn.Module:
                return VisionMLP(dim, int(dim * config.mlp_ratio), config.hidden_act)
        self.patch_embed = PatchEmbed(config.patch_size, config.temporal_patch_size, config.in_channels, dim)
        head_dim = dim // config.num_heads
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, head_dim // 2, 2).float() / (head_dim // 2)),
                             persistent=False)
        self.blocks = nn.ModuleList(VisionBlock(dim, config.num_heads, norm, mlp()) for _ in range(config.depth))
        self.merger = PatchMerger(out_dim, dim, self.merge, norm)

    def forward(self, pixels: torch.Tensor, grid_thw: list[tuple[int, int, int]]) -> torch.Tensor:
        """Patches of one or more items -> their merged tokens ``[sum(t*h*w) / merge^2, out_dim]``."""
        x = self.patch_embed(pixels)
        angles = rotary_angles(grid_thw, self.merge, self.inv_freq)
        full = segments_by_length(frame_bounds(grid_thw), x.device)
        unit, order, windows = self.merge ** 2, None, full
        if self.window:
            order, bounds = window_index(grid_thw, self.merge, self.window)
            windows = segments_by_length(bounds, x.device)
            order = order.to(x.device)
            x = x.unflatten(0, (-1, unit))[order].flatten(0, 1)
            angles = angles.unflatten(0, (-1, unit))[order].flatten(0, 1)
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]
        for i, block in enumerate(self.blocks):
            x = block(x, full if (not self.window or i in self.full_attention) else windows, cos, sin)
        merged = self.merger(x)
        return merged if order is None else merged[torch.argsort(order)]
