"""The contracts of reasoning and tool-call parsers.

The output processor and the server talk to parsers only through these types;
the concrete parsers live in plugins and are found by name in the registries
``reasoning_parsers`` and ``tool_parsers``.  A parser is stateless and shared by
the requests of one server; each streamed request asks it for a fresh
``stream()`` that holds the per-request state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol


@dataclass
class ToolCall:
    """One finished call, as the OpenAI ``message.tool_calls[i]`` carries it."""

    id: str
    name: str
    arguments: str
    """The arguments as JSON text, never a parsed object: clients ``json.loads`` it."""


@dataclass
class ToolCallResult:
    """What a tool parser makes of a whole generation."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class ToolCallDelta:
    """One OpenAI ``delta.tool_calls[i]``: ``id`` and ``name`` come only on the first delta of a call."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class DeltaMessage:
    """The text a streamed step adds to each output field; empty strings mean nothing new."""

    reasoning_content: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning_content or self.content or self.tool_calls)


class ParserStream(Protocol):
    """The per-request state of a streamed parse.

    ``feed`` takes the newly detokenized text and returns only what is certain:
    characters that might begin a marker are held back until the next ``feed``
    or ``finish`` decides them.  Feeding a text in any split must give, summed
    over the deltas, the same result as parsing it whole.
    """

    def feed(self, delta_text: str) -> DeltaMessage: ...

    def finish(self) -> DeltaMessage: ...


class BaseParser(ABC):
    """What both parser kinds share: the tokenizer, and the markers they look for."""

    markers: ClassVar[tuple[str, ...]] = ()
    """Every literal the parser looks for in the text (tags, special tokens)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    @property
    def requires_special_tokens(self) -> bool:
        """Whether the detokenizer must run with ``skip_special_tokens=False``.

        A marker that is a special token of this tokenizer would otherwise be
        dropped before the parser sees it, so the request has to keep them.
        """
        special = set(getattr(self.tokenizer, "all_special_tokens", None) or ())
        return any(marker in special for marker in self.markers)

    @abstractmethod
    def stream(self) -> ParserStream:
        """A fresh state for one streamed request."""


class ReasoningParser(BaseParser):
    """Splits a generation into chain-of-thought and answer.

    ``enable_thinking`` is the request's ``chat_template_kwargs["enable_thinking"]``:
    when the template was told not to think it already closed the thought in
    the prompt, so a parser that honours it treats the whole output as answer.
    """

    def __init__(self, tokenizer: Any, enable_thinking: bool = True):
        super().__init__(tokenizer)
        self.enable_thinking = enable_thinking

    def extract(self, text: str) -> tuple[str, str]:
        """``(reasoning_content, content)`` of a whole generation."""
        stream = self.stream()
        first, last = stream.feed(text), stream.finish()
        return first.reasoning_content + last.reasoning_content, first.content + last.content


class ToolParser(BaseParser):
    """Finds tool calls in generated content; what is not a call stays content.

    Text that looks like a call but does not parse (malformed JSON, a missing
    name) is returned as content, never raised.
    """

    def extract(self, text: str) -> ToolCallResult:
        """The content and the calls of a whole generation."""
        stream = self.stream()
        return merge_deltas([stream.feed(text), stream.finish()])


def merge_deltas(deltas: list[DeltaMessage]) -> ToolCallResult:
    """Sum streamed deltas the way an OpenAI client does: by ``index``."""
    calls: list[ToolCall] = []
    for delta in deltas:
        calls = add_tool_calls(calls, delta.tool_calls)
    return ToolCallResult("".join(delta.content for delta in deltas), calls)


def add_tool_calls(calls: list[ToolCall], parts: list[ToolCallDelta]) -> list[ToolCall]:
    """``calls`` with streamed ``parts`` summed in by ``index`` (counting up from 0: a new index
    starts the next call). A new list, and new objects for the calls a part extends, so that an
    output already handed out keeps the calls it had."""
    summed = list(calls)
    for part in parts:
        if part.index < len(summed):
            call = summed[part.index]
            summed[part.index] = ToolCall(part.id or call.id, part.name or call.name, call.arguments + part.arguments)
        else:
            summed.append(ToolCall(part.id or "", part.name or "", part.arguments))
    return summed
