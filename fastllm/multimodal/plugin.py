"""Registers fastllm's built-in multimodal processors."""

from fastllm.multimodal.qwen2_vl import Qwen2VLProcessor
from fastllm.registry import hookimpl


@hookimpl
def register_multimodal_processors():
    return {
        "Qwen2VLForConditionalGeneration": Qwen2VLProcessor,
        "Qwen2_5_VLForConditionalGeneration": Qwen2VLProcessor,
    }
