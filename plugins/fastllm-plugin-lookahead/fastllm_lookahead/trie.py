"""A bounded n-gram trie: which tokens followed a run of tokens, and how often.

Every path from the root spells an n-gram (``n <= depth``) that occurred in a token
stream fed to the trie, and a node's ``count`` is how many times it occurred. A draft
is then: the node of the longest suffix of the context, followed by its most frequent
child, that child's most frequent child, and so on.

Streams are fed incrementally through a ``TrieCursor`` that remembers the nodes of the
stream's last ``depth - 1`` suffixes, so one new token costs ``depth`` dictionary steps
however long the stream is. Memory is bounded by ``max_nodes``: past it, the least
recently used nodes go (``evict``).

The trie makes no Python object per node: a node is an index into a few lists of ints, and
an edge is an entry of one dict of ints (which the garbage collector does not track). So
feeding a token allocates no container, and a big trie adds four lists to a collection's
work, not two objects a node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# After an eviction this fraction of ``max_nodes`` is left, so evictions stay rare.
KEEP_FRACTION = 0.75
# An edge's key is ``token * EDGE_STRIDE + parent`` (node ids stay far below it). The stride is
# odd and irregular so that the dict's slot, the key's low bits, depends on the token too:
# the root's children would all collide otherwise.
EDGE_STRIDE = 0x9E3779B1
ROOT = 0


@dataclass
class TrieCursor:
    """Where one token stream stands in a trie: ``frontier[i]`` is the node of its last i tokens
    (``frontier[0]`` is the root). ``extend`` updates it in place.

    ``generation`` tells whether an eviction may have renumbered those nodes since.
    """

    frontier: list[int] = field(default_factory=list)
    generation: int = -1


@dataclass
class Match:
    """A draft and the length of the context suffix it continues (0: nothing matched)."""

    length: int = 0
    tokens: list[int] = field(default_factory=list)


class TokenTrie:
    """N-grams up to ``depth`` tokens long from any number of streams, at most ``max_nodes`` of them.

    Node ``i`` is ``count[i]``, ``tick[i]`` (the clock when it was last used), ``best[i]`` (its
    most frequent child, the latest among equals; ``ROOT``: none, as the root's count stays 0)
    and ``key[i]`` (its own edge). A child's id is above its parent's: nodes are appended, and
    ``evict`` renumbers the survivors in order.
    """

    def __init__(self, depth: int, max_nodes: int) -> None:
        if depth < 2 or max_nodes < 1:
            raise ValueError(f"need depth >= 2 and max_nodes >= 1, got {depth} and {max_nodes}")
        self.depth = depth
        self.max_nodes = max_nodes
        self.edges: dict[int, int] = {}  # token * EDGE_STRIDE + parent -> child
        self.count, self.tick, self.best, self.key = [0], [0], [ROOT], [0]
        self.clock = 0
        self.generation = 0
        self.num_evictions = 0

    @property
    def num_nodes(self) -> int:
        """Nodes besides the root."""
        return len(self.count) - 1

    def extend(self, cursor: TrieCursor, tokens: Sequence[int], start: int) -> None:
        """Count every n-gram that ends at one of ``tokens[start:]``; ``tokens[:start]`` was fed before."""
        frontier = cursor.frontier
        if cursor.generation != self.generation:
            self._seek(frontier, tokens, start)
            cursor.generation = self.generation
        edges, count, tick, best = self.edges, self.count, self.tick, self.best
        for position in range(start, len(tokens)):
            self.clock += 1
            base, now = tokens[position] * EDGE_STRIDE, self.clock
            frontier.append(ROOT)  # room for the longest n-gram's node, dropped below past depth
            # The parents of every n-gram that ends at this token, longest first: frontier[level]
            # is read before the shorter n-gram's node takes its place.
            for level in range(len(frontier) - 2, -1, -1):
                parent = frontier[level]
                child = edges.get(base + parent)
                if child is None:
                    child = self._add(base + parent, now)
                seen = count[child] + 1
                count[child] = seen
                tick[child] = now
                if seen >= count[best[parent]]:
                    best[parent] = child
                frontier[level + 1] = child
            if len(frontier) > self.depth:
                frontier.pop()
            if len(count) > self.max_nodes + 1:
                self.evict()
                self._seek(frontier, tokens, position + 1)
                cursor.generation = self.generation

    def match(self, context: Sequence[int], max_length: int, max_tokens: int) -> Match:
        """Continue the longest suffix of ``context`` (at most ``max_length`` tokens) that has a
        continuation, by up to ``max_tokens`` most frequent next tokens."""
        for length in range(min(max_length, len(context)), 0, -1):
            start = len(context) - length
            node = self._find(context, start)
            if node >= 0 and self.best[node] != ROOT:
                return Match(length, self._follow(context, start, max_tokens))
        return Match()

    def continues(self, tokens: Sequence[int]) -> bool:
        """Whether the n-gram ``tokens`` occurred with a token after it; touches nothing (the
        recency that ``evict`` goes by included)."""
        node = self._find(tokens, 0)
        return node > ROOT and self.best[node] != ROOT

    def evict(self) -> None:
        """Drop the least recently used nodes (with whatever hangs below them) until at most
        ``KEEP_FRACTION * max_nodes`` are left, and renumber the rest (cursors must seek again)."""
        excess = self.num_nodes - int(self.max_nodes * KEEP_FRACTION)
        if excess <= 0:
            return
        tick, count, key = (np.array(values, np.int64) for values in (self.tick, self.count, self.key))
        token, parent = np.divmod(key, EDGE_STRIDE)
        dropped = tick <= np.partition(tick[1:], excess - 1)[excess - 1]
        dropped[ROOT] = False
        for _ in range(self.depth - 1):  # a node's subtree goes with it, one level per pass
            dropped |= dropped[parent]
        kept = np.flatnonzero(~dropped)  # ascending, so parents stay before their children
        new_id = np.zeros(len(tick), np.int64)
        new_id[kept] = np.arange(len(kept))
        tick, count, parent = tick[kept], count[kept], new_id[parent[kept]]
        key = token[kept] * EDGE_STRIDE + parent
        # Each parent's best, as counting leaves it: of its counted children (``_seek`` makes
        # uncounted ones), the last in (count, tick) order.
        counted = np.flatnonzero(count)
        children = counted[np.lexsort((tick[counted], count[counted], parent[counted]))]
        siblings = parent[children]
        last = children[siblings != np.append(siblings[1:], -1)]
        best = np.full(len(kept), ROOT)
        best[parent[last]] = last
        for column, values in ((self.tick, tick), (self.count, count), (self.best, best), (self.key, key)):
            column[:] = values.tolist()
        self.edges.clear()
        self.edges.update(zip(self.key[1:], range(1, len(kept))))
        self.generation += 1
        self.num_evictions += 1

    # ---- internals ---------------------------------------------------------------------------
    def _add(self, key: int, now: int) -> int:
        """A new node on edge ``key``, not yet counted."""
        node = self.edges[key] = len(self.count)
        self.count.append(0)
        self.tick.append(now)
        self.best.append(ROOT)
        self.key.append(key)
        return node

    def _find(self, tokens: Sequence[int], start: int) -> int:
        """The node spelling ``tokens[start:]`` from the root, or -1 where the n-gram is unknown."""
        edges, node = self.edges, ROOT
        for position in range(start, len(tokens)):
            node = edges.get(tokens[position] * EDGE_STRIDE + node, -1)
            if node < 0:
                return -1
        return node

    def _follow(self, tokens: Sequence[int], start: int, max_tokens: int) -> list[int]:
        """Walk ``tokens[start:]`` from the root, then most frequent children; mark every node on
        the way as used."""
        edges, best, tick, now = self.edges, self.best, self.tick, self.clock
        node, out = ROOT, []
        for position in range(start, len(tokens)):
            node = edges[tokens[position] * EDGE_STRIDE + node]
            tick[node] = now
        while len(out) < max_tokens and best[node] != ROOT:
            node = best[node]
            tick[node] = now
            out.append(self.key[node] // EDGE_STRIDE)
        return out

    def _seek(self, frontier: list[int], tokens: Sequence[int], end: int) -> None:
        """Make ``frontier`` the root and the nodes of ``tokens[end-1:end]``, ``tokens[end-2:end]``,
        ... (created if missing)."""
        frontier[:] = (ROOT,)
        for length in range(1, min(self.depth - 1, end) + 1):
            node = ROOT
            for position in range(end - length, end):
                key = tokens[position] * EDGE_STRIDE + node
                child = self.edges.get(key)
                node = self._add(key, self.clock) if child is None else child
            frontier.append(node)
