"""Build the reasoning and tool parsers a request names, through the registries."""

from __future__ import annotations

from typing import Any

from fastllm import registry
from fastllm.chat.interface import ReasoningParser, ToolParser


def reasoning_parser(name: str, tokenizer: Any, enable_thinking: bool = True) -> ReasoningParser:
    """The ``reasoning_parsers`` entry ``name``; an unknown name lists the registered ones."""
    parser = registry.get("reasoning_parsers", name)(tokenizer, enable_thinking=enable_thinking)
    if not isinstance(parser, ReasoningParser):
        raise TypeError(f"reasoning parser {name!r} does not implement fastllm.chat.ReasoningParser")
    return parser


def tool_parser(name: str, tokenizer: Any) -> ToolParser:
    """The ``tool_parsers`` entry ``name``; an unknown name lists the registered ones."""
    parser = registry.get("tool_parsers", name)(tokenizer)
    if not isinstance(parser, ToolParser):
        raise TypeError(f"tool parser {name!r} does not implement fastllm.chat.ToolParser")
    return parser

