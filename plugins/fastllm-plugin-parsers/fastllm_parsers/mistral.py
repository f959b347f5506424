"""Mistral tool calls: answer text, then ``[TOOL_CALLS]`` and the calls to the end.

Two generations of the format: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``
(tokenizers v3 to v7) and ``[TOOL_CALLS]name[ARGS]{...}`` repeated per call
(v11 and later, possibly with ``[CALL_ID]id`` after the name).  Text before
the first ``[TOOL_CALLS]`` streams as content; the calls are held to the end
and, if they do not decode, returned verbatim as content.  Call ids are the
nine alphanumerics Mistral's templates require.
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence

from fastllm.chat import DeltaMessage, ToolCallDelta, ToolParser

from fastllm_parsers.calls import call_from_object, dumps, loads
from fastllm_parsers.markers import MarkerStream

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"


def new_mistral_id() -> str:
    """Mistral's call id: nine letters or digits."""
    return "".join(random.choices(string.ascii_letters + string.digits, k=9))


def decode_calls(tail: str) -> list[tuple[str, str]] | None:
    """The calls after the first ``[TOOL_CALLS]``; ``None`` unless all of it decodes."""
    value = loads(tail)
    calls = [call_from_object(item) for item in (value if isinstance(value, list) else [value])]
    if (not calls or None in calls) and ARGS in tail:
        calls = [_decode_named(segment) for segment in tail.split(TOOL_CALLS)]
    return calls if calls and None not in calls else None


def _decode_named(segment: str) -> tuple[str, str] | None:
    """``name[ARGS]{...}`` (or ``name[CALL_ID]id[ARGS]{...}``)."""
    head, found, arguments = segment.partition(ARGS)
    name = head.partition(CALL_ID)[0].strip()
    value = loads(arguments)
    if not found or not name or not isinstance(value, dict):
        return None
    text = dumps(value)
    return None if text is None else (name, text)


class MistralStream(MarkerStream):
    """One request: content until ``[TOOL_CALLS]``, then everything collected for the end."""

    def __init__(self) -> None:
        super().__init__()
        self.tail: list[str] | None = None

    def active_markers(self) -> Sequence[str]:
        return (TOOL_CALLS,) if self.tail is None else ()

    def on_text(self, text: str, out: DeltaMessage) -> None:
        if self.tail is None:
            out.content += text
        else:
            self.tail.append(text)

    def on_marker(self, marker: str, out: DeltaMessage) -> None:
        self.tail = []

    def on_finish(self, out: DeltaMessage) -> None:
        if self.tail is None:
            return
        tail = "".join(self.tail)
        calls = decode_calls(tail)
        if calls is None:
            out.content += TOOL_CALLS + tail
            return
        out.tool_calls = [ToolCallDelta(i, new_mistral_id(), *call) for i, call in enumerate(calls)]


class MistralToolParser(ToolParser):
    markers = (TOOL_CALLS, ARGS, CALL_ID)

    def stream(self) -> MistralStream:
        return MistralStream()
