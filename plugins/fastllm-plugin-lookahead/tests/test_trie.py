"""The n-gram trie: counting, longest-suffix matching, frequency order, and its memory bound."""

from __future__ import annotations

import random

from fastllm_lookahead.trie import TokenTrie, TrieCursor, TrieNode


def feed(trie: TokenTrie, tokens: list[int], chunk: int = 0) -> TrieCursor:
    """Feed ``tokens`` as one stream, all at once or ``chunk`` tokens at a time."""
    cursor = TrieCursor()
    step = chunk or len(tokens)
    for start in range(0, len(tokens), step):
        trie.extend(cursor, tokens[:start + step], start)
    return cursor


def ngram_counts(trie: TokenTrie) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    stack: list[tuple[tuple[int, ...], TrieNode]] = [((), trie.root)]
    while stack:
        prefix, node = stack.pop()
        for token, child in node.children.items():
            counts[prefix + (token,)] = child.count
            stack.append((prefix + (token,), child))
    return counts


def reference_counts(streams: list[list[int]], depth: int) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for tokens in streams:
        for end in range(1, len(tokens) + 1):
            for n in range(1, min(depth, end) + 1):
                gram = tuple(tokens[end - n:end])
                counts[gram] = counts.get(gram, 0) + 1
    return counts


def test_counts_every_ngram_up_to_depth_however_the_stream_is_fed():
    rng = random.Random(0)
    streams = [[rng.randrange(6) for _ in range(60)] for _ in range(3)]
    for chunk in (0, 1, 7):
        trie = TokenTrie(depth=5, max_nodes=10**6)
        for tokens in streams:
            feed(trie, tokens, chunk)
        assert ngram_counts(trie) == reference_counts(streams, 5)
        assert trie.num_nodes == len(ngram_counts(trie))


def test_match_continues_the_longest_suffix():
    trie = TokenTrie(depth=8, max_nodes=1000)
    feed(trie, [1, 2, 3, 4, 5, 6])
    feed(trie, [9, 3, 7, 7, 7])
    # [2, 3] is followed by 4; the shorter suffix [3] is more often followed by 7.
    match = trie.match([8, 2, 3], max_length=3, max_tokens=3)
    assert (match.length, match.tokens) == (2, [4, 5, 6])
    assert trie.match([0, 0, 3], max_length=3, max_tokens=2).tokens == [7, 7]
    assert trie.match([42], max_length=3, max_tokens=2).length == 0


def test_continues_says_what_match_would_find_and_touches_nothing():
    trie = TokenTrie(depth=4, max_nodes=1000)
    feed(trie, [1, 2, 3, 4, 5])
    ticks = [node.tick for node in trie.root.children.values()]
    assert trie.continues([2, 3]) and trie.continues([3, 4, 5]) is False
    assert not trie.continues([2, 4]) and not trie.continues([])
    assert [node.tick for node in trie.root.children.values()] == ticks
    for context in ([1, 2, 3], [2, 3], [3, 4, 5], [7, 3], [2, 4]):
        assert trie.continues(context) == (trie.match(context, len(context), 1).length == len(context))


def test_match_prefers_the_frequent_continuation_then_the_latest():
    trie = TokenTrie(depth=4, max_nodes=1000)
    for tokens in ([1, 2, 3], [1, 2, 3], [1, 2, 4]):
        feed(trie, tokens)
    assert trie.match([1, 2], 2, 1).tokens == [3]
    feed(trie, [1, 2, 4])
    assert trie.match([1, 2], 2, 1).tokens == [4]  # a tie: the latest wins


def test_drafts_stop_at_max_tokens_and_at_the_depth():
    trie = TokenTrie(depth=4, max_nodes=1000)
    feed(trie, list(range(20)))
    assert trie.match([5], 1, 2).tokens == [6, 7]
    assert trie.match([5], 1, 10).tokens == [6, 7, 8]  # a path holds at most `depth` tokens
    assert trie.match([4, 5], 2, 10).tokens == [6, 7]


def test_eviction_bounds_memory_and_keeps_recent_ngrams():
    rng = random.Random(1)
    trie = TokenTrie(depth=6, max_nodes=500)
    cursor, tokens = TrieCursor(), []
    for _ in range(400):
        new = [rng.randrange(1000) for _ in range(rng.randint(1, 8))]
        tokens += new
        trie.extend(cursor, tokens, len(tokens) - len(new))
        assert trie.num_nodes <= trie.max_nodes
        assert trie.num_nodes == len(ngram_counts(trie))
    assert trie.num_evictions > 0
    assert trie.match(tokens[-6:-3], 3, 3).tokens == tokens[-3:]
    assert trie.match(tokens[:3], 3, 3).length < 3  # the stream's start is long gone
    stack = [trie.root]
    while stack:
        node = stack.pop()
        assert node.best == -1 or node.best in node.children
        stack.extend(node.children.values())


def test_eviction_spares_branches_that_drafts_used():
    trie = TokenTrie(depth=4, max_nodes=40)
    feed(trie, [1, 2, 3, 4])
    filler = TrieCursor()
    for i in range(6):
        trie.extend(filler, list(range(100, 106 + i)), 5 + i if i else 0)
        assert trie.match([1, 2], 2, 2).tokens == [3, 4]
    assert trie.num_evictions > 0 and trie.num_nodes <= 40
