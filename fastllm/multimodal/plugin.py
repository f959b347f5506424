"""Registers fastllm's built-in multimodal processors."""

from fastllm.multimodal.ernie4_5_vl import Ernie4_5_VLProcessor
from fastllm.multimodal.qwen2_vl import Qwen2VLProcessor
from fastllm.registry import hookimpl


@hookimpl
def register_multimodal_processors():
    return {
        "Qwen2VLForConditionalGeneration": Qwen2VLProcessor,
        "Qwen2_5_VLForConditionalGeneration": Qwen2VLProcessor,
        "Ernie4_5_VLMoeForConditionalGeneration": Ernie4_5_VLProcessor,
    }
