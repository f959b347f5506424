"""ERNIE-4.5-VL's vision side: a ViT over each frame's patches (2-D rotary, as Qwen2-VL's tower
without its merger), then the variable-resolution resampler that folds 2x2 patches, and pairs
of video frames, into one token of the language model's width."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from fastllm.models.qwen2_vl_vision import (VisionBlock, VisionMLP, VisionRMSNorm, frame_bounds, rotary_angles,
                                            segments_by_length)


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, channels: int, dim: int):
        super().__init__()
        self.proj = nn.Linear(channels * patch * patch, dim, bias=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.proj(pixels.to(self.proj.weight.dtype))


class ErnieVisionTransformer(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        dim, self.merge = config.hidden_size, config.spatial_merge_size
        self.patch_embed = PatchEmbed(config.patch_size, config.in_channels, dim)
        head_dim = dim // config.num_heads
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, head_dim // 2, 2).float() / (head_dim // 2)),
                             persistent=False)
        self.blocks = nn.ModuleList(
            VisionBlock(dim, config.num_heads, nn.LayerNorm,
                        VisionMLP(dim, config.intermediate_size, config.hidden_act))
            for _ in range(config.depth))
        self.ln = nn.LayerNorm(dim, eps=config.rms_norm_eps)

    def forward(self, pixels: torch.Tensor, grid_thw: list[tuple[int, int, int]]) -> torch.Tensor:
        """Patches ``[sum(t*h*w), C*P*P]`` -> their features ``[sum(t*h*w), dim]``."""
        x = self.patch_embed(pixels)
        angles = rotary_angles(grid_thw, self.merge, self.inv_freq)
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]
        frames = segments_by_length(frame_bounds(grid_thw), x.device)
        for block in self.blocks:
            x = block(x, frames, cos, sin)
        return self.ln(x)


def _projection(in_dim: int, out_dim: int, eps: float) -> nn.Sequential:
    # indices 0, 2, 3 are the checkpoint's names (spatial_linear.0.weight, ...)
    return nn.Sequential(nn.Linear(in_dim, out_dim), nn.GELU(), nn.Linear(out_dim, out_dim),
                         nn.LayerNorm(out_dim, eps=eps))


class VariableResolutionResampler(nn.Module):
    """Each 2x2 block of patches -> one vector; then each pair of frames (an image: its one frame
    twice) -> one token, projected to the text width and RMS-normed."""

    def __init__(self, config: Any):
        super().__init__()
        vision, text = config.vision_config, config.text_config
        self.merge, self.temporal_merge = vision.spatial_merge_size, vision.temporal_merge_size
        spatial = vision.hidden_size * self.merge ** 2
        self.spatial_linear = _projection(spatial, spatial, vision.rms_norm_eps)
        self.temporal_linear = _projection(spatial * self.temporal_merge, spatial, vision.rms_norm_eps)
        self.mlp = nn.Linear(spatial, text.hidden_size)
        self.after_norm = VisionRMSNorm(text.hidden_size, text.rms_norm_eps)

    def forward(self, features: torch.Tensor, grid_thw: tuple[int, int, int]) -> torch.Tensor:
        """One item's tower output -> its ``t * h * w / merge^2 / (2 if t > 1 else 1)`` tokens."""
        x = self.spatial_linear(features.reshape(-1, features.shape[-1] * self.merge ** 2))
        frames = x.unflatten(0, (grid_thw[0], -1))
        pairs = grid_thw[0] // self.temporal_merge
        first, second = (frames, frames) if grid_thw[0] == 1 else \
            (frames[0:2 * pairs:2], frames[1:2 * pairs:2])  # as transformers: even frames beside odd ones
        x = self.temporal_linear(torch.cat([first, second], dim=-1).flatten(0, 1))
        return self.after_norm(self.mlp(x))
