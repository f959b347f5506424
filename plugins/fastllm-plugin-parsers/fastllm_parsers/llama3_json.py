"""Llama 3.1 / 3.2 JSON tool calls: the whole answer is the call.

The model answers either in prose or with ``{"name": ..., "parameters": {...}}``
(optionally after ``<|python_tag|>``), several calls joined by ``;`` or given
as a JSON array.  The first non-blank character decides: ``{``, ``[`` or the
python tag means calls, held until the end because only the whole text can
be checked; anything else streams as content.  Calls that do not decode are
returned as content, verbatim.
"""

from __future__ import annotations

import json
from enum import Enum

from fastllm.chat import DeltaMessage, ToolCallDelta, ToolParser

from fastllm_parsers.calls import call_from_object, new_call_id

PYTHON_TAG = "<|python_tag|>"


class Mode(Enum):
    UNDECIDED = "undecided"
    CONTENT = "content"
    CALLS = "calls"


def decode_calls(text: str) -> list[tuple[str, str]] | None:
    """Every call of a ``;``-separated sequence of call objects or arrays; ``None`` if any part is not one."""
    body = text.strip().removeprefix(PYTHON_TAG)
    decoder, calls, position = json.JSONDecoder(), [], 0
    while True:
        position = len(body) - len(body[position:].lstrip())
        if position == len(body):
            return calls or None
        try:
            value, position = decoder.raw_decode(body, position)
        except (ValueError, RecursionError):
            return None
        for item in value if isinstance(value, list) else [value]:
            call = call_from_object(item, ("parameters", "arguments"))
            if call is None:
                return None
            calls.append(call)
        rest = body[position:].lstrip()
        if rest and not rest.startswith(";"):
            return None
        position = len(body) - len(rest) + (1 if rest else 0)


class Llama3JsonStream:
    """One request: leading blanks are held until the first real character decides the mode."""

    def __init__(self) -> None:
        self.mode = Mode.UNDECIDED
        self.text = ""

    def feed(self, delta_text: str) -> DeltaMessage:
        if self.mode is Mode.CONTENT:
            return DeltaMessage(content=delta_text)
        self.text += delta_text
        if self.mode is Mode.UNDECIDED:
            head = self.text.lstrip()
            if head.startswith(("{", "[", PYTHON_TAG)):
                self.mode = Mode.CALLS
            elif head and not PYTHON_TAG.startswith(head):
                self.mode, text, self.text = Mode.CONTENT, self.text, ""
                return DeltaMessage(content=text)
        return DeltaMessage()

    def finish(self) -> DeltaMessage:
        calls = decode_calls(self.text) if self.mode is Mode.CALLS else None
        if calls is None:
            return DeltaMessage(content=self.text)
        return DeltaMessage(tool_calls=[ToolCallDelta(i, new_call_id(), *call) for i, call in enumerate(calls)])


class Llama3JsonToolParser(ToolParser):
    markers = (PYTHON_TAG,)

    def stream(self) -> Llama3JsonStream:
        return Llama3JsonStream()
