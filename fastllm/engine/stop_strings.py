"""Stop-string search over growing text, and how much text to hold back while streaming."""

from __future__ import annotations

from typing import Optional


def find_stop(text: str, new_chars: int, stops: list[str]) -> Optional[tuple[int, str]]:
    """(index, stop) of the earliest stop string that ends inside the newest ``new_chars``."""
    best: Optional[tuple[int, str]] = None
    for stop in stops:
        start = max(0, len(text) - new_chars - len(stop) + 1)
        index = text.find(stop, start)
        if index != -1 and (best is None or index < best[0]):
            best = (index, stop)
    return best


def partial_stop_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of ``text`` that could begin a stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[-n:]):
                longest = n
                break
    return longest
