"""fastllm: a plugin-architected LLM inference engine."""

from fastllm.adapters import LoRARequest
from fastllm.llm import LLM
from fastllm.outputs import CompletionOutput, RequestMetrics, RequestOutput
from fastllm.sampling_params import GuidedDecodingParams, SamplingParams

__all__ = ["LLM", "SamplingParams", "GuidedDecodingParams", "RequestOutput", "CompletionOutput",
           "RequestMetrics", "LoRARequest"]
__version__ = "0.1.0"
