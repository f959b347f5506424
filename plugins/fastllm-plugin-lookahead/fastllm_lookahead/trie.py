"""A bounded n-gram trie: which tokens followed a run of tokens, and how often.

Every path from the root spells an n-gram (``n <= depth``) that occurred in a token
stream fed to the trie, and a node's ``count`` is how many times it occurred. A draft
is then: the node of the longest suffix of the context, followed by its most frequent
child, that child's most frequent child, and so on.

Streams are fed incrementally through a ``TrieCursor`` that remembers the nodes of the
stream's last ``depth - 1`` suffixes, so one new token costs ``depth`` dictionary steps
however long the stream is. Memory is bounded by ``max_nodes``: past it, the least
recently used nodes go (``evict``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# After an eviction this fraction of ``max_nodes`` is left, so evictions stay rare.
KEEP_FRACTION = 0.75


class TrieNode:
    """One n-gram: how often it occurred, when it was last used, its best continuation."""

    __slots__ = ("best", "best_count", "children", "count", "tick")

    def __init__(self, tick: int) -> None:
        self.children: dict[int, TrieNode] = {}
        self.count = 0
        self.tick = tick
        # The most frequent child's token (the latest among equals) and its count; -1: none.
        self.best = -1
        self.best_count = 0


@dataclass
class TrieCursor:
    """Where one token stream stands in a trie: ``frontier[i]`` is the node of its last i tokens
    (``frontier[0]`` is the root).

    ``generation`` tells whether an eviction may have detached those nodes since.
    """

    frontier: list[TrieNode] = field(default_factory=list)
    generation: int = -1


@dataclass
class Match:
    """A draft and the length of the context suffix it continues (0: nothing matched)."""

    length: int = 0
    tokens: list[int] = field(default_factory=list)


class TokenTrie:
    """N-grams up to ``depth`` tokens long from any number of streams, at most ``max_nodes`` of them."""

    def __init__(self, depth: int, max_nodes: int) -> None:
        if depth < 2 or max_nodes < 1:
            raise ValueError(f"need depth >= 2 and max_nodes >= 1, got {depth} and {max_nodes}")
        self.depth = depth
        self.max_nodes = max_nodes
        self.root = TrieNode(0)
        self.num_nodes = 0
        self.clock = 0
        self.generation = 0
        self.num_evictions = 0

    def extend(self, cursor: TrieCursor, tokens: Sequence[int], start: int) -> None:
        """Count every n-gram that ends at one of ``tokens[start:]``; ``tokens[:start]`` was fed before."""
        if cursor.generation != self.generation:
            cursor.frontier = self._suffix_nodes(tokens, start)
            cursor.generation = self.generation
        frontier, depth = cursor.frontier, self.depth
        for position in range(start, len(tokens)):
            self.clock += 1
            token, tick = tokens[position], self.clock
            nodes = [self.root]
            for parent in frontier:  # the parents of every n-gram that ends at this token
                child = parent.children.get(token)
                if child is None:
                    child = parent.children[token] = TrieNode(tick)
                    self.num_nodes += 1
                child.count += 1
                child.tick = tick
                if child.count >= parent.best_count:
                    parent.best, parent.best_count = token, child.count
                nodes.append(child)
            frontier = nodes[:depth]
            if self.num_nodes > self.max_nodes:
                self.evict()
                frontier = self._suffix_nodes(tokens, position + 1)
                cursor.generation = self.generation
        cursor.frontier = frontier

    def match(self, context: Sequence[int], max_length: int, max_tokens: int) -> Match:
        """Continue the longest suffix of ``context`` (at most ``max_length`` tokens) that has a
        continuation, by up to ``max_tokens`` most frequent next tokens."""
        for length in range(min(max_length, len(context)), 0, -1):
            path = self._path(context[len(context) - length:])
            if path and path[-1].best >= 0:
                return Match(length, self._follow(path, max_tokens))
        return Match()

    def continues(self, tokens: Sequence[int]) -> bool:
        """Whether the n-gram ``tokens`` occurred with a token after it; touches nothing (the
        recency that ``evict`` goes by included)."""
        path = self._path(tokens)
        return bool(path) and path[-1].best >= 0

    def evict(self) -> None:
        """Drop the least recently used nodes (with whatever hangs below them) until at most
        ``KEEP_FRACTION * max_nodes`` are left."""
        ticks: list[int] = []
        stack = [self.root]
        while stack:
            for child in stack.pop().children.values():
                ticks.append(child.tick)
                stack.append(child)
        excess = len(ticks) - int(self.max_nodes * KEEP_FRACTION)
        if excess <= 0:
            return
        ticks.sort()
        cutoff = ticks[excess - 1]
        kept = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            stale = [token for token, child in node.children.items() if child.tick <= cutoff]
            for token in stale:
                del node.children[token]
            if stale:
                node.best_count, node.best = max(((child.count, token) for token, child in node.children.items()),
                                                 default=(0, -1))
            kept += len(node.children)
            stack.extend(node.children.values())
        self.num_nodes = kept
        self.generation += 1
        self.num_evictions += 1

    # ---- internals ---------------------------------------------------------------------------
    def _path(self, tokens: Sequence[int]) -> list[TrieNode] | None:
        """The nodes spelling ``tokens`` from the root, or None where the n-gram is unknown."""
        path, node = [], self.root
        for token in tokens:
            node = node.children.get(token)
            if node is None:
                return None
            path.append(node)
        return path

    def _follow(self, path: list[TrieNode], max_tokens: int) -> list[int]:
        """Walk most frequent children from ``path[-1]``; mark the path and the walk as used."""
        tick, node, out = self.clock, path[-1], []
        for used in path:
            used.tick = tick
        while len(out) < max_tokens and node.best >= 0:
            out.append(node.best)
            node = node.children[node.best]
            node.tick = tick
        return out

    def _suffix_nodes(self, tokens: Sequence[int], end: int) -> list[TrieNode]:
        """The root and the nodes of ``tokens[end-1:end]``, ``tokens[end-2:end]``, ... (created if missing)."""
        nodes = [self.root]
        for length in range(1, min(self.depth - 1, end) + 1):
            node = self.root
            for token in tokens[end - length:end]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = TrieNode(self.clock)
                    self.num_nodes += 1
                node = child
            nodes.append(node)
        return nodes
