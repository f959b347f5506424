"""Parser conformance: a parser's stream, over any cut of the text, adds up to its one-shot parse."""

from __future__ import annotations

from collections.abc import Iterator

from fastllm.chat import DeltaMessage, ReasoningParser, ToolParser, merge_deltas


def stream_reasoning(parser: ReasoningParser, chunks: list[str]) -> tuple[str, str]:
    """The summed ``(reasoning, content)`` of streaming ``chunks``."""
    deltas = _run(parser, chunks)
    return "".join(d.reasoning_content for d in deltas), "".join(d.content for d in deltas)


def stream_tools(parser: ToolParser, chunks: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """The summed content and ``(name, arguments)`` calls of streaming ``chunks``.

    Also checks the OpenAI delta contract: a call's first delta carries its
    index, id and name, and later deltas only add arguments.
    """
    deltas = _run(parser, chunks)
    seen: set[int] = set()
    for delta in deltas:
        assert not delta.reasoning_content
        for part in delta.tool_calls:
            first = part.index not in seen
            assert (part.id is not None and part.name is not None) == first
            if first:
                assert part.index == len(seen), "calls are numbered 0, 1, ... in order"
            seen.add(part.index)
    result = merge_deltas(deltas)
    assert len({call.id for call in result.tool_calls}) == len(result.tool_calls)
    return result.content, [(call.name, call.arguments) for call in result.tool_calls]


def extract_tools(parser: ToolParser, text: str) -> tuple[str, list[tuple[str, str]]]:
    result = parser.extract(text)
    assert all(call.id for call in result.tool_calls)
    return result.content, [(call.name, call.arguments) for call in result.tool_calls]


def splits(text: str) -> Iterator[list[str]]:
    """Every cut of ``text`` into two chunks, then one chunk per character."""
    for cut in range(len(text) + 1):
        yield [text[:cut], text[cut:]]
    yield list(text)


def chunks_at(text: str, cuts: list[int]) -> list[str]:
    """``text`` cut at the given positions (any order, repeats allowed)."""
    points = [0, *sorted(min(max(c, 0), len(text)) for c in cuts), len(text)]
    return [text[a:b] for a, b in zip(points, points[1:])]


def _run(parser: ReasoningParser | ToolParser, chunks: list[str]) -> list[DeltaMessage]:
    stream = parser.stream()
    return [stream.feed(chunk) for chunk in chunks] + [stream.finish()]


def assert_streaming_matches_extract(parser: ReasoningParser | ToolParser, text: str) -> None:
    """For every two-chunk cut of ``text``, and one character a chunk, the parser's summed deltas
    equal its one-shot ``extract(text)``; a tool parser also keeps the OpenAI delta contract."""
    if isinstance(parser, ReasoningParser):
        whole: object = parser.extract(text)
        for chunks in splits(text):
            assert stream_reasoning(parser, chunks) == whole, chunks
    else:
        whole = extract_tools(parser, text)
        for chunks in splits(text):
            assert stream_tools(parser, chunks) == whole, chunks
