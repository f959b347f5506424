"""Qwen2-VL / Qwen2.5-VL input processing: HF's image processor, placeholder expansion, M-RoPE."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np
import torch

from fastllm.engine.input_processor import RequestError
from fastllm.multimodal.inputs import MultimodalInputs, MultimodalItem
from fastllm.multimodal.media import VIDEO_FPS


def mrope_positions(num_tokens: int, items: list[MultimodalItem], merge: int,
                    tokens_per_second: float | None, video_temporal_merge: int = 1) -> tuple[torch.Tensor, int]:
    """``[3, num_tokens]`` (time, height, width) positions and the delta decode positions add,
    as transformers' ``Qwen2_5_VLModel.get_rope_index``: text advances all three by one; an
    item's tokens lay out its merged grid from the current position, which then moves past
    its larger spatial side. Qwen2.5-VL spaces video steps by ``tokens_per_second`` x seconds per step;
    ERNIE-4.5-VL folds ``video_temporal_merge`` frames into one step."""
    pieces, position, cursor = [], 0, 0
    for item in items:
        text = item.offset - cursor
        pieces.append(torch.arange(text).expand(3, -1) + position)
        position += text
        t = item.grid_thw[0] // (video_temporal_merge if item.modality == "video" else 1)
        h, w = item.grid_thw[1] // merge, item.grid_thw[2] // merge
        interval = tokens_per_second * item.extra[0] if item.modality == "video" and item.extra else 1.0
        grid_t, grid_h, grid_w = torch.meshgrid((torch.arange(t) * interval).long() + position,
                                                torch.arange(h) + position, torch.arange(w) + position,
                                                indexing="ij")
        pieces.append(torch.stack([grid_t, grid_h, grid_w]).reshape(3, -1))
        position += max(h, w)
        cursor = item.end
    pieces.append(torch.arange(num_tokens - cursor).expand(3, -1) + position)
    positions = torch.cat(pieces, dim=1)
    return positions, int(positions.max()) + 1 - num_tokens


class Qwen2VLProcessor:
    """Each ``<|image_pad|>`` / ``<|video_pad|>`` token of the prompt stands for one item, in order."""

    modalities = ("image", "video")
    video_temporal_merge = 1  # frames (grid steps) folded into one placeholder token

    def __init__(self, hf_config: Any, tokenizer: Any, model_path: str):
        processor_cls = self.image_processor_class()
        saved = os.path.isfile(os.path.join(model_path, "preprocessor_config.json"))
        # a bundled dummy config has no processor settings: transformers' defaults are the model's
        self.image_processor = processor_cls.from_pretrained(model_path) if saved else processor_cls()
        ids = {"image": hf_config.image_token_id, "video": hf_config.video_token_id}
        self.token_ids = {modality: ids[modality] for modality in self.modalities}
        vision = hf_config.vision_config
        self.merge = vision.spatial_merge_size
        self.temporal_patch = getattr(vision, "temporal_patch_size", 1)
        self.tokens_per_second = getattr(vision, "tokens_per_second", None)  # Qwen2.5-VL: timed video steps
        self.video_processor = self.frame_processor(model_path)

    def frame_processor(self, model_path: str) -> Any:
        """HF's video processor needs torchvision: its settings (video_preprocessor_config.json, else
        the image processor's, as AutoVideoProcessor falls back) drive the image processor per frame."""
        video_config = os.path.join(model_path, "video_preprocessor_config.json")
        if not os.path.isfile(video_config):
            return self.image_processor
        with open(video_config) as f:
            return self.image_processor_class().from_dict(json.load(f))

    @staticmethod
    def image_processor_class() -> type:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil

    def process(self, prompt_token_ids: list[int],
                media: dict[str, list[Any]]) -> tuple[list[int], MultimodalInputs]:
        for modality, items in media.items():
            if items and modality not in self.modalities:
                raise RequestError(f"this model takes no {modality} input")
        features = {modality: self._features(modality, items) for modality, items in media.items() if items}
        placeholders = [(i, m) for i, t in enumerate(prompt_token_ids)
                        for m, token in self.token_ids.items() if t == token]
        for modality in self.modalities:
            found, given = sum(1 for _, m in placeholders if m == modality), len(features.get(modality, []))
            if found != given:
                raise RequestError(f"the prompt has {found} {modality} placeholders "
                                   f"but {given} {modality} items were given")
        expanded: list[int] = []
        items: list[MultimodalItem] = []
        cursor, used = 0, {modality: 0 for modality in self.modalities}
        for index, modality in placeholders:
            expanded += prompt_token_ids[cursor:index]
            pixels, grid, extra = features[modality][used[modality]]
            used[modality] += 1
            length = grid[0] * grid[1] * grid[2] // self.merge ** 2
            length //= self.video_temporal_merge if modality == "video" else 1
            digest = hashlib.sha256(pixels.numpy().tobytes() + repr((modality, grid, extra)).encode()).digest()
            items.append(MultimodalItem(modality, pixels, grid, len(expanded), length, digest, extra))
            expanded += [self.token_ids[modality]] * length
            cursor = index + 1
        expanded += prompt_token_ids[cursor:]
        positions, delta = mrope_positions(len(expanded), items, self.merge, self.tokens_per_second,
                                           self.video_temporal_merge)
        return expanded, MultimodalInputs(tuple(items), positions, delta)

    def _features(self, modality: str, items: list[Any]) -> list[tuple[torch.Tensor, tuple[int, int, int], tuple]]:
        """(patches, grid, extra) per item, from the HF processor; a video's frames go through
        the image processor one by one and are paired into temporal patches."""
        if modality == "image":
            out = self.image_processor(images=items, return_tensors="pt")
            grids = [tuple(int(v) for v in g) for g in out["image_grid_thw"]]
            sizes = [g[0] * g[1] * g[2] for g in grids]
            return [(pixels, grid, ()) for pixels, grid in zip(out["pixel_values"].split(sizes), grids)]
        return [self._video(frames) for frames in items]

    def _video(self, frames: np.ndarray) -> tuple[torch.Tensor, tuple[int, int, int], tuple]:
        """Frames padded to a multiple of the temporal patch by repeating the last, each resized
        and normalised by the image processor at the first frame's size, then grouped per
        temporal patch in the processor's patch layout."""
        if len(frames) % self.temporal_patch:
            pad = self.temporal_patch - len(frames) % self.temporal_patch
            frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
        out = self.video_processor(images=list(frames), return_tensors="pt")
        grid = out["image_grid_thw"][0].tolist()
        # each frame's rows hold its patch repeated over the temporal axis: keep one copy per frame
        per_frame = out["pixel_values"].unflatten(0, (len(frames), -1))
        channels_time = per_frame.unflatten(-1, (3, self.temporal_patch, -1))[..., 0, :]
        steps = channels_time.unflatten(0, (-1, self.temporal_patch))  # [T', tp, N, C, P*P]
        pixels = steps.permute(0, 2, 3, 1, 4).flatten(0, 1).flatten(1)
        t = len(frames) // self.temporal_patch
        seconds = (self.temporal_patch / VIDEO_FPS,) if self.tokens_per_second is not None else ()
        return pixels, (t, grid[1], grid[2]), seconds
