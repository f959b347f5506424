"""The n-gram trie: counting, longest-suffix matching, frequency order, and its memory bound."""

from __future__ import annotations

import gc
import random

from fastllm_lookahead.trie import EDGE_STRIDE, ROOT, TokenTrie, TrieCursor


def feed(trie: TokenTrie, tokens: list[int], chunk: int = 0) -> TrieCursor:
    """Feed ``tokens`` as one stream, all at once or ``chunk`` tokens at a time."""
    cursor = TrieCursor()
    step = chunk or len(tokens)
    for start in range(0, len(tokens), step):
        trie.extend(cursor, tokens[:start + step], start)
    return cursor


def ngram_counts(trie: TokenTrie) -> dict[tuple[int, ...], int]:
    """Every n-gram in the trie with its count, spelled by following each node's edge up."""
    grams: dict[int, tuple[int, ...]] = {ROOT: ()}
    for node in range(1, len(trie.count)):
        token, parent = divmod(trie.key[node], EDGE_STRIDE)
        grams[node] = grams[parent] + (token,)  # a parent's id is below its children's
    return {grams[node]: trie.count[node] for node in range(1, len(trie.count))}


def check_structure(trie: TokenTrie) -> None:
    """The edges are the nodes' keys, and each node's best is a child of the highest count."""
    assert trie.edges == {key: node for node, key in enumerate(trie.key) if node != ROOT}
    highest = [0] * len(trie.count)
    for node in range(1, len(trie.count)):
        parent = trie.key[node] % EDGE_STRIDE
        highest[parent] = max(highest[parent], trie.count[node])
    for node, best in enumerate(trie.best):
        assert best == ROOT or trie.key[best] % EDGE_STRIDE == node
        assert trie.count[best] == highest[node]


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
    ticks = list(trie.tick)
    assert trie.continues([2, 3]) and trie.continues([3, 4, 5]) is False
    assert not trie.continues([2, 4]) and not trie.continues([])
    assert trie.tick == ticks
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
    check_structure(trie)


def test_eviction_keeps_the_trie_true_to_interleaved_streams():
    """Three streams fed in turns through their own cursors: an eviction while feeding one
    renumbers the nodes the others' cursors stand on."""
    rng = random.Random(2)
    depth = 5
    trie = TokenTrie(depth, max_nodes=300)
    streams: list[list[int]] = [[], [], []]
    cursors = [TrieCursor() for _ in streams]
    for _ in range(300):
        which = rng.randrange(len(streams))
        tokens = streams[which]
        new = [rng.randrange(12) for _ in range(rng.randint(1, 6))]
        tokens += new
        trie.extend(cursors[which], tokens, len(tokens) - len(new))
        check_structure(trie)
        counts, truth = ngram_counts(trie), reference_counts(streams, depth)
        assert len(counts) == trie.num_nodes <= trie.max_nodes
        assert all(count <= truth[gram] for gram, count in counts.items())
        for n in range(1, min(depth - 1, len(tokens)) + 1):  # the cursor's own suffixes
            assert tuple(tokens[-n:]) in counts
    assert trie.num_evictions > 5


def test_eviction_spares_branches_that_drafts_used():
    trie = TokenTrie(depth=4, max_nodes=40)
    feed(trie, [1, 2, 3, 4])
    filler = TrieCursor()
    for i in range(6):
        trie.extend(filler, list(range(100, 106 + i)), 5 + i if i else 0)
        assert trie.match([1, 2], 2, 2).tokens == [3, 4]
    assert trie.num_evictions > 0 and trie.num_nodes <= 40


def test_feeding_allocates_no_tracked_objects():
    """Nodes and edges are ints in a few lists and one dict: nothing for the garbage collector."""
    rng = random.Random(3)
    trie, cursor, tokens = TokenTrie(depth=6, max_nodes=10**6), TrieCursor(), []
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for _ in range(2000):
            tokens.append(rng.randrange(1000))
            trie.extend(cursor, tokens, len(tokens) - 1)
        assert len(gc.get_objects()) - before < 10 and trie.num_nodes > 5000
    finally:
        gc.enable()
