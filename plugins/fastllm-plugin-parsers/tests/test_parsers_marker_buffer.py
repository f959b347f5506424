"""The hold-back rule every streaming parser relies on."""

from __future__ import annotations

from fastllm_parsers.markers import MarkerBuffer

MARKERS = ("<response>", "<response>\n", "</think>")


def drain(buffer: MarkerBuffer, final: bool = False) -> list[tuple[str, bool]]:
    pieces = []
    while (piece := buffer.next(MARKERS, final)) is not None:
        pieces.append(piece)
    return pieces


def test_text_is_released_up_to_a_possible_marker_start():
    buffer = MarkerBuffer()
    buffer.push("abc</th")
    assert drain(buffer) == [("abc", False)]
    buffer.push("ink>def<")
    assert drain(buffer) == [("</think>", True), ("def", False)]
    assert drain(buffer, final=True) == [("<", False)]


def test_a_longer_marker_that_may_still_complete_defers_a_shorter_one():
    buffer = MarkerBuffer()
    buffer.push("x<response>")
    assert drain(buffer) == [("x", False)]
    buffer.push("\ny")
    assert drain(buffer) == [("<response>\n", True), ("y", False)]
    buffer.push("<response>z")
    assert drain(buffer) == [("<response>", True), ("z", False)]


def test_without_markers_everything_flows():
    buffer = MarkerBuffer()
    assert buffer.next((), final=False) is None
    buffer.push("<resp")
    assert buffer.next((), final=False) == ("<resp", False)
