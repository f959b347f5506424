"""Build the reasoning and tool parsers a request names, through the registries, and apply a tool
parser to finished offline outputs."""

from __future__ import annotations

from typing import Any

from fastllm import registry
from fastllm.chat.interface import ReasoningParser, ToolParser
from fastllm.outputs import RequestOutput


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


def split_tool_calls(outputs: list[RequestOutput], parser: ToolParser) -> None:
    """Move the calls ``parser`` finds in each finished completion into its ``tool_calls``.

    What ``LLM.chat(..., tools=...)`` returns: ``text`` keeps only what is not a call, as the
    server's ``message.content`` does; ``tool_calls`` is a list of ``fastllm.chat.ToolCall``.
    """
    for output in outputs:
        for completion in output.completions:
            result = parser.extract(completion.text)
            completion.text, completion.tool_calls = result.content, result.tool_calls
