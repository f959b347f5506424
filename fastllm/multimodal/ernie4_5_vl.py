"""ERNIE-4.5-VL input processing: HF's ERNIE image processor, placeholder expansion, 3-D positions.

Its positions lay an image out as Qwen2-VL's M-RoPE does (transformers'
``Ernie4_5_VLMoeModel.get_rope_index``); video is not taken here: HF's ERNIE video
processor needs torchvision and draws timestamps onto the frames with a font.
"""

from __future__ import annotations

from fastllm.multimodal.qwen2_vl import Qwen2VLProcessor


class Ernie4_5_VLProcessor(Qwen2VLProcessor):
    """Each ``<|image@placeholder|>`` token of the prompt stands for one image, in order."""

    modalities = ("image",)

    @staticmethod
    def image_processor_class() -> type:
        from transformers.models.ernie4_5_vl_moe.image_processing_pil_ernie4_5_vl_moe import (
            Ernie4_5_VLMoeImageProcessorPil,
        )

        return Ernie4_5_VLMoeImageProcessorPil
