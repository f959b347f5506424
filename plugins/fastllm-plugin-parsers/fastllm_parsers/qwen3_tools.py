"""Qwen3 tool calls: Hermes JSON blocks, or the XML bodies of Qwen3-Coder.

Qwen3 writes ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` like
Qwen2.5; Qwen3-Coder and later write the same tags around
``<function=NAME><parameter=KEY>\\nVALUE\\n</parameter></function>``.  XML
values carry no types, so a value that parses as JSON (``3``, ``true``,
``[1]``) becomes that value and anything else stays a string.
"""

from __future__ import annotations

import re

from fastllm_parsers.calls import INVALID, decode_json_call, dumps, loads
from fastllm_parsers.tagged import TaggedToolParser

FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.S)
PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def decode_xml_call(body: str) -> tuple[str, str] | None:
    """``<function=name>`` with only ``<parameter=...>`` blocks (and whitespace) inside."""
    function = FUNCTION.fullmatch(body)
    if function is None or not function[1].strip():
        return None
    inner, arguments, position = function[2], {}, 0
    for parameter in PARAMETER.finditer(inner):
        if inner[position:parameter.start()].strip():
            return None
        arguments[parameter[1].strip()] = _typed(parameter[2].removeprefix("\n").removesuffix("\n"))
        position = parameter.end()
    if inner[position:].strip():
        return None
    text = dumps(arguments)
    return None if text is None else (function[1].strip(), text)


def _typed(value: str) -> object:
    parsed = loads(value)
    return value if parsed is INVALID else parsed


class Qwen3ToolParser(TaggedToolParser):
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"
    markers = (start_tag, end_tag)

    def decode(self, body: str) -> tuple[str, str] | None:
        return decode_json_call(body) or decode_xml_call(body)
