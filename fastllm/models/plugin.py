"""Registers fastllm's built-in model architectures."""

from fastllm.models.llama import LlamaForCausalLM
from fastllm.models.qwen2 import Qwen2ForCausalLM
from fastllm.models.qwen3 import Qwen3ForCausalLM
from fastllm.registry import hookimpl


@hookimpl
def register_models():
    return {
        "LlamaForCausalLM": LlamaForCausalLM,
        "MistralForCausalLM": LlamaForCausalLM,
        "Qwen2ForCausalLM": Qwen2ForCausalLM,
        "Qwen3ForCausalLM": Qwen3ForCausalLM,
    }
