"""tool_choice for /v1/chat/completions: when it is allowed, and how forced calls are constrained and read.

``auto`` needs a tool parser to find calls in free text. ``required`` and a named
function need no parser: guided decoding makes the model write JSON of a known
shape (vLLM's approach), which is then read back into tool calls.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Optional

from fastllm.entrypoints.openai.errors import OpenAIError
from fastllm.entrypoints.openai.protocol_chat import ChatCompletionRequest, FunctionCall, NamedToolChoice, ToolCall
from fastllm.sampling_params import GuidedDecodingParams


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def check_tool_choice(request: ChatCompletionRequest, auto_enabled: bool) -> None:
    """``auto`` with tools is refused unless the server was started to parse calls."""
    if request.tools and request.effective_tool_choice == "auto" and not auto_enabled:
        raise OpenAIError(400, '"auto" tool choice needs the server to run with --enable-auto-tool-choice and '
                               "--tool-call-parser", "tool_choice")


def _parameters(schema: Optional[dict[str, Any]]) -> dict[str, Any]:
    return schema or {"type": "object", "properties": {}}


def forced_guided_decoding(request: ChatCompletionRequest) -> Optional[GuidedDecodingParams]:
    """The JSON schema a ``required`` or named tool choice imposes; None for ``auto`` / ``none``."""
    choice = request.effective_tool_choice
    if isinstance(choice, NamedToolChoice):
        tool = next(t for t in request.tools if t.function.name == choice.function.name)
        schema = _parameters(tool.function.parameters)
    elif choice == "required":
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": [
            {"type": "object", "properties": {"name": {"type": "string", "enum": [tool.function.name]},
                                              "parameters": _parameters(tool.function.parameters)},
             "required": ["name", "parameters"]} for tool in request.tools]}}
    else:
        return None
    if request.guided_decoding() is not None:
        raise OpenAIError(400, "a required or named tool_choice cannot be combined with response_format or "
                               "guided_* fields", "tool_choice")
    return GuidedDecodingParams(json=schema)


def required_tool_calls(text: str) -> Optional[list[ToolCall]]:
    """The calls in a ``required`` generation (``[{"name", "parameters"}, ...]``); None if it is not that."""
    try:
        items = json.loads(text)
        return [ToolCall(index=i, id=new_tool_call_id(),
                         function=FunctionCall(name=item["name"], arguments=json.dumps(item["parameters"])))
                for i, item in enumerate(items)]
    except (ValueError, TypeError, KeyError):
        return None
