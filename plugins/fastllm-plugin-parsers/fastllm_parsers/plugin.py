"""Registers the reasoning and tool parsers with fastllm."""

from __future__ import annotations

from fastllm.chat import ReasoningParser, ToolParser
from fastllm.registry import hookimpl

from fastllm_parsers.hermes import HermesToolParser
from fastllm_parsers.internlm import InternLMToolParser
from fastllm_parsers.llama3_json import Llama3JsonToolParser
from fastllm_parsers.mistral import MistralToolParser
from fastllm_parsers.qwen3_tools import Qwen3ToolParser
from fastllm_parsers.thinking import (
    DeepSeekR1ReasoningParser,
    Ernie45VLReasoningParser,
    ErnieX1ReasoningParser,
    Qwen3ReasoningParser,
)


@hookimpl
def register_reasoning_parsers() -> dict[str, type[ReasoningParser]]:
    return {
        "deepseek-r1": DeepSeekR1ReasoningParser,
        "ernie-45-vl": Ernie45VLReasoningParser,
        "ernie-x1": ErnieX1ReasoningParser,
        "qwen3": Qwen3ReasoningParser,
    }


@hookimpl
def register_tool_parsers() -> dict[str, type[ToolParser]]:
    return {
        "hermes": HermesToolParser,
        "internlm": InternLMToolParser,
        "llama3_json": Llama3JsonToolParser,
        "mistral": MistralToolParser,
        "qwen3": Qwen3ToolParser,
    }
