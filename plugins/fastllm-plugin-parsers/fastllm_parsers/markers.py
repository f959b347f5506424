"""Incremental cutting of generated text at literal markers.

Streaming parsers see text in arbitrary pieces, so a marker such as
``</think>`` may arrive split over several deltas.  ``MarkerBuffer`` releases
text as soon as it cannot be part of a marker and holds back only the tail
that could still grow into one; ``MarkerStream`` runs a parser's state machine
over what it releases.  Because each state's markers are searched in the text
seen so far, any split of the input gives the same events as the whole.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from fastllm.chat import DeltaMessage


class MarkerBuffer:
    """Text received but not yet handed on."""

    def __init__(self) -> None:
        self.pending = ""

    def push(self, text: str) -> None:
        self.pending += text

    def next(self, markers: Sequence[str], final: bool) -> tuple[str, bool] | None:
        """The next piece: ``(text, False)``, ``(marker, True)``, or ``None`` until more text comes.

        Text ends at the earliest complete marker, so the caller can change
        state on it before the marker is looked for again.  Text that could
        still grow into a marker is held back unless ``final``; so is a
        complete marker that a longer one starting at or before it may extend.
        """
        pending = self.pending
        found = _earliest(pending, markers)
        hold = len(pending) if final else _possible_start(pending, markers)
        if found is not None and found[0] < hold:
            index, marker = found
            if index == 0:
                self.pending = pending[len(marker):]
                return marker, True
            hold = index
        if hold == 0:
            return None
        self.pending = pending[hold:]
        return pending[:hold], False


def _earliest(text: str, markers: Sequence[str]) -> tuple[int, str] | None:
    """The first complete marker in ``text``; at a tie, the longest."""
    best: tuple[int, str] | None = None
    for marker in markers:
        index = text.find(marker)
        if index >= 0 and (best is None or (index, -len(marker)) < (best[0], -len(best[1]))):
            best = (index, marker)
    return best


def _possible_start(text: str, markers: Sequence[str]) -> int:
    """Where the longest tail of ``text`` that a marker could still grow from begins."""
    longest = max((len(marker) for marker in markers), default=0)
    for start in range(max(0, len(text) - longest + 1), len(text)):
        tail = text[start:]
        if any(len(marker) > len(tail) and marker.startswith(tail) for marker in markers):
            return start
    return len(text)


class MarkerStream(ABC):
    """A parser's per-request state machine, driven by the markers of its current state.

    Subclasses say which markers matter now and what text and markers do; a
    marker handler may set ``skip_newlines`` to drop the newlines a format puts
    right after a tag, which are layout rather than content (the next marker
    clears it).
    """

    def __init__(self) -> None:
        self.buffer = MarkerBuffer()
        self.skip_newlines = False

    def feed(self, delta_text: str) -> DeltaMessage:
        out = DeltaMessage()
        self.buffer.push(delta_text)
        self._drain(out, final=False)
        return out

    def finish(self) -> DeltaMessage:
        out = DeltaMessage()
        self._drain(out, final=True)
        self.on_finish(out)
        return out

    def _drain(self, out: DeltaMessage, final: bool) -> None:
        while (piece := self.buffer.next(self.active_markers(), final)) is not None:
            text, is_marker = piece
            if is_marker:
                self.skip_newlines = False
                self.on_marker(text, out)
                continue
            if self.skip_newlines:
                text = text.lstrip("\n")
                self.skip_newlines = not text
            if text:
                self.on_text(text, out)

    @abstractmethod
    def active_markers(self) -> Sequence[str]:
        """The markers that change the state now."""

    @abstractmethod
    def on_text(self, text: str, out: DeltaMessage) -> None:
        """Route ``text``, which holds none of the active markers."""

    @abstractmethod
    def on_marker(self, marker: str, out: DeltaMessage) -> None:
        """Change state on ``marker``."""

    def on_finish(self, out: DeltaMessage) -> None:
        """Settle whatever is still open when the generation ends."""
