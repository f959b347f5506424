"""ERNIE-4.5-VL input processing: HF's ERNIE image processor, placeholder expansion, 3-D positions.

Its positions lay an image out as Qwen2-VL's M-RoPE does (transformers'
``Ernie4_5_VLMoeModel.get_rope_index``). Video follows transformers'
``Ernie4_5_VLMoeVideoProcessor`` without its torchvision dependency: at most ``max_frames``
frames sampled evenly, each stamped with its time in the top-left corner, an odd count padded
with the last frame, every frame resized and normalised by the image processor at the video
settings; two frames fold into one placeholder token.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch

from fastllm.multimodal.media import VIDEO_FPS
from fastllm.multimodal.qwen2_vl import Qwen2VLProcessor

# transformers' Ernie4_5_VLMoeVideoProcessor class defaults (its module imports torchvision)
VIDEO_DEFAULTS = {"size": {"shortest_edge": 299 * 28 * 28, "longest_edge": 1196 * 28 * 28},
                  "max_frames": 180, "draw_on_frames": True, "font": "Roboto-Regular.ttf"}
STAMP_SCALE = 0.1  # font size over the frame's shorter side, and outline over font size


def _video_settings(model_path: str) -> dict[str, Any]:
    """The checkpoint's video processor settings, found where transformers looks: the nested
    ``processor_config.json``, then ``video_preprocessor_config.json``, then the image processor's."""
    nested = os.path.join(model_path, "processor_config.json")
    if os.path.isfile(nested):
        with open(nested) as f:
            settings = json.load(f).get("video_processor")
        if settings is not None:
            return {**VIDEO_DEFAULTS, **settings}
    for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
        if os.path.isfile(os.path.join(model_path, name)):
            with open(os.path.join(model_path, name)) as f:
                return {**VIDEO_DEFAULTS, **json.load(f)}
    return dict(VIDEO_DEFAULTS)


def timestamp_text(seconds: float) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, rest = divmod(rest, 60)
    return f"time: {int(hours):02d}:{int(minutes):02d}:{rest:05.02f}"


def stamp_frame(frame: np.ndarray, seconds: float, font_path: str | None) -> np.ndarray:
    """The frame with its time drawn black, outlined white, at the top-left corner. Without the
    checkpoint's font file (transformers downloads Roboto) PIL's bundled font is used."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.fromarray(frame)
    size = max(1, int(min(image.size) * STAMP_SCALE))
    font = ImageFont.truetype(font_path, size) if font_path else ImageFont.load_default(size)
    ImageDraw.Draw(image).text((0, 0), timestamp_text(seconds), font=font, fill=(0, 0, 0),
                               stroke_width=int(size * STAMP_SCALE), stroke_fill=(255, 255, 255))
    return np.asarray(image)


class Ernie4_5_VLProcessor(Qwen2VLProcessor):
    """Each ``<|image@placeholder|>`` / ``<|video@placeholder|>`` token of the prompt stands for
    one item, in order."""

    video_temporal_merge = 2

    def frame_processor(self, model_path: str) -> Any:
        settings = _video_settings(model_path)
        self.max_frames, self.draw_on_frames = settings["max_frames"], settings["draw_on_frames"]
        font = os.path.join(model_path, settings["font"]) if settings.get("font") else None
        self.font_path = font if font and os.path.isfile(font) else None
        processor_cls = self.image_processor_class()
        accepted = processor_cls.valid_kwargs.__annotations__
        return processor_cls(**{k: v for k, v in settings.items() if k in accepted and k != "temporal_patch_size"})

    @staticmethod
    def image_processor_class() -> type:
        from transformers.models.ernie4_5_vl_moe.image_processing_pil_ernie4_5_vl_moe import (
            Ernie4_5_VLMoeImageProcessorPil,
        )

        return Ernie4_5_VLMoeImageProcessorPil

    def _video(self, frames: np.ndarray) -> tuple[torch.Tensor, tuple[int, int, int], tuple]:
        """Frames are taken at ``VIDEO_FPS`` (an encoded video was sampled at that rate); the
        patches are each frame's image-processor patches in turn, the grid ``(frames, h, w)``."""
        total = len(frames)
        indices = torch.arange(total)
        if total > self.max_frames:  # transformers' sample_frames
            indices = torch.arange(0, total, total / self.max_frames).int()
        frames = [frames[i] for i in indices.tolist()]
        if self.draw_on_frames:
            frames = [stamp_frame(frame, int(i) / VIDEO_FPS, self.font_path) for frame, i in zip(frames, indices)]
        if len(frames) % self.video_temporal_merge:
            frames.append(frames[-1])
        out = self.video_processor(images=frames, return_tensors="pt")
        _, h, w = out["image_grid_thw"][0].tolist()
        return out["pixel_values"], (len(frames), h, w), ()
