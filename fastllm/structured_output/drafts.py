"""Speculative drafts on guided sequences: each draft checked against the sequence's grammar, and
each draft row masked by the grammar as it stands after the drafts before that row.

Verification then samples every row from the distribution the sequence would sample from
without drafts (the same logits, the same mask), so drafts change the speed, never the output.
Both steps advance the sequence's own matcher and roll it back: no copy of a matcher is made.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from fastllm.engine.sequence import Sequence


def clip_drafts(backend: Any, seqs: Iterable[Sequence], stop_token_ids: frozenset[int]) -> None:
    """Cut each guided sequence's drafts to the longest prefix its grammar allows. A stop token
    ends the drafts before it: the row at its place samples it, and a draft after a terminated
    grammar could only be junk."""
    for seq in seqs:
        matcher, drafts = seq.structured_state, seq.draft_token_ids
        if matcher is None or not drafts:
            continue
        stop = next((i for i, token in enumerate(drafts) if token in stop_token_ids), len(drafts))
        allowed = backend.accept_prefix(matcher, drafts[:stop])
        backend.rollback(matcher, allowed)
        seq.draft_token_ids = drafts[:allowed]


def draft_depths(seqs: list[Sequence]) -> list[int]:
    """How many drafts precede each row: a sequence's rows are adjacent, row j after j drafts."""
    depths = []
    for i, seq in enumerate(seqs):
        depths.append(depths[-1] + 1 if i and seqs[i - 1] is seq else 0)
    return depths


def apply_grammar_masks(backend: Any, logits: torch.Tensor, seqs: list[Sequence],
                        matchers: list[Optional[Any]]) -> None:
    """Mask ``logits [rows, vocab]``: row i of ``seqs[i]`` (None in ``matchers``: unguided or
    finished) by its grammar after the drafts before the row. One backend call per draft depth:
    between calls each matcher with a deeper row takes its next draft; all are rolled back at
    the end. A draft the grammar refuses (``clip_drafts`` lets none through) leaves the rows
    after it unmasked: verification rejects that draft (its own row's mask refuses it), so
    nothing is sampled from them."""
    depths = draft_depths(seqs)
    if not any(depths):
        backend.apply_bitmask(logits, matchers)
        return
    advanced: dict[int, int] = {}  # row of depth 0 -> drafts its matcher took
    live = list(matchers)
    for depth in range(max(depths) + 1):
        for i, matcher in enumerate(live):
            if matcher is not None and depths[i] == depth and depth:
                first = i - depth
                if advanced.get(first, 0) == depth - 1 and backend.accept_prefix(
                        matcher, [seqs[i].draft_token_ids[depth - 1]]) == 1:
                    advanced[first] = depth
                else:
                    live[i] = None
        level = [matcher if depths[i] == depth else None for i, matcher in enumerate(live)]
        if any(matcher is not None for matcher in level):
            backend.apply_bitmask(logits, level)
    for first, count in advanced.items():
        backend.rollback(matchers[first], count)
