"""Tool calls wrapped in start and end tags, with free text around them.

Hermes, Qwen and InternLM write ``<tag>call</tag>`` blocks between ordinary
answer text.  A call is only known to be well formed at its end tag, so each
call is emitted whole, in one delta carrying index, id, name and arguments;
text outside the blocks streams as content.  A block whose body does not
decode is handed back verbatim, tags included, as content.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence

from fastllm.chat import DeltaMessage, ToolCallDelta, ToolParser

from fastllm_parsers.calls import new_call_id
from fastllm_parsers.markers import MarkerStream

Decoder = Callable[[str], tuple[str, str] | None]


class TaggedCallStream(MarkerStream):
    """One request: content outside the blocks, a block's body collected until its end tag."""

    def __init__(self, start: str, end: str, decode: Decoder):
        super().__init__()
        self.start, self.end, self.decode = start, end, decode
        self.body: list[str] | None = None
        self.index = 0

    def active_markers(self) -> Sequence[str]:
        return (self.start,) if self.body is None else (self.end,)

    def on_text(self, text: str, out: DeltaMessage) -> None:
        if self.body is None:
            out.content += text
        else:
            self.body.append(text)

    def on_marker(self, marker: str, out: DeltaMessage) -> None:
        if marker == self.start:
            self.body = []
        else:
            self.skip_newlines = self._close(out, self.end)

    def on_finish(self, out: DeltaMessage) -> None:
        if self.body is not None:
            self._close(out, "")

    def _close(self, out: DeltaMessage, end: str) -> bool:
        """Emit the finished block as a call, or as content if it does not decode."""
        body = "".join(self.body or ())
        self.body = None
        call = self.decode(body)
        if call is None:
            out.content += self.start + body + end
            return False
        out.tool_calls.append(ToolCallDelta(self.index, new_call_id(), *call))
        self.index += 1
        return True


class TaggedToolParser(ToolParser):
    """A parser defined by its tags and how it decodes a block's body."""

    start_tag: str
    end_tag: str

    @abstractmethod
    def decode(self, body: str) -> tuple[str, str] | None:
        """``(name, arguments JSON)`` of one block's body, or ``None`` if it is not a call."""

    def stream(self) -> TaggedCallStream:
        return TaggedCallStream(self.start_tag, self.end_tag, self.decode)
