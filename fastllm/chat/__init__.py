"""Chat front end: template resolution and rendering, and the parser contracts."""

from fastllm.chat.interface import (
    BaseParser,
    DeltaMessage,
    ParserStream,
    ReasoningParser,
    ToolCall,
    ToolCallDelta,
    ToolCallResult,
    ToolParser,
    merge_deltas,
)
from fastllm.chat.parsers import reasoning_parser, tool_parser
from fastllm.chat.template import (ResolvedTemplate, TemplateFactory, render_chat, resolve_chat_template,
                                   template_source, template_variables)

__all__ = [
    "BaseParser",
    "DeltaMessage",
    "ParserStream",
    "ReasoningParser",
    "ResolvedTemplate",
    "TemplateFactory",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallResult",
    "ToolParser",
    "merge_deltas",
    "reasoning_parser",
    "render_chat",
    "resolve_chat_template",
    "template_source",
    "template_variables",
    "tool_parser",
]
