"""InternLM2 / 2.5 tool calls: ``<|action_start|><|plugin|>\\n{"name": ..., "parameters": {...}}<|action_end|>``.

Only the ``<|plugin|>`` action is a tool call; ``<|interpreter|>`` code blocks
stay content.
"""

from __future__ import annotations

from fastllm_parsers.calls import decode_json_call
from fastllm_parsers.tagged import TaggedToolParser


class InternLMToolParser(TaggedToolParser):
    start_tag = "<|action_start|><|plugin|>"
    end_tag = "<|action_end|>"
    markers = ("<|action_start|>", "<|plugin|>", end_tag)

    def decode(self, body: str) -> tuple[str, str] | None:
        return decode_json_call(body)
