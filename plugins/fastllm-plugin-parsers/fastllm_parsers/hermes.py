"""Hermes / Qwen2.5 tool calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``."""

from __future__ import annotations

from fastllm_parsers.calls import decode_json_call
from fastllm_parsers.tagged import TaggedToolParser


class HermesToolParser(TaggedToolParser):
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"
    markers = (start_tag, end_tag)

    def decode(self, body: str) -> tuple[str, str] | None:
        return decode_json_call(body)
