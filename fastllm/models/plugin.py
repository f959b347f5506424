"""Registers fastllm's built-in model architectures."""

from fastllm.models.ernie4_5 import Ernie4_5ForCausalLM
from fastllm.models.ernie4_5_moe import Ernie4_5_MoeForCausalLM
from fastllm.models.ernie4_5_vl import Ernie4_5_VLMoeForConditionalGeneration
from fastllm.models.llama import LlamaForCausalLM
from fastllm.models.mixtral import MixtralForCausalLM
from fastllm.models.qwen2 import Qwen2ForCausalLM
from fastllm.models.qwen2_vl import Qwen2VLForConditionalGeneration
from fastllm.models.qwen3 import Qwen3ForCausalLM
from fastllm.models.qwen3_moe import Qwen3MoeForCausalLM
from fastllm.registry import hookimpl


@hookimpl
def register_models():
    return {
        "LlamaForCausalLM": LlamaForCausalLM,
        "MistralForCausalLM": LlamaForCausalLM,
        "Qwen2ForCausalLM": Qwen2ForCausalLM,
        "Qwen3ForCausalLM": Qwen3ForCausalLM,
        "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
        "MixtralForCausalLM": MixtralForCausalLM,
        "Ernie4_5ForCausalLM": Ernie4_5ForCausalLM,
        "Ernie4_5_ForCausalLM": Ernie4_5ForCausalLM,  # the name in Baidu's remote-code config.json
        "Ernie4_5_MoeForCausalLM": Ernie4_5_MoeForCausalLM,
        "Qwen2VLForConditionalGeneration": Qwen2VLForConditionalGeneration,
        "Qwen2_5_VLForConditionalGeneration": Qwen2VLForConditionalGeneration,
        "Ernie4_5_VLMoeForConditionalGeneration": Ernie4_5_VLMoeForConditionalGeneration,
    }
