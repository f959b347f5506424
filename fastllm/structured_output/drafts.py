"""Speculative drafts on guided sequences: each draft checked against the sequence's grammar, and
each draft row masked by the grammar as it stands after the drafts before that row.

Verification then samples every row from the distribution the sequence would sample from
without drafts (the same logits, the same mask), so drafts change the speed, never the output.
Both steps advance the sequence's own matcher and roll it back: no copy of a matcher is made.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch


def clip_drafts(backend: Any, seqs: Iterable[Any], stop_token_ids: frozenset[int]) -> None:
    """Cut each guided sequence's drafts (``structured_state``, ``draft_token_ids``) to the
    longest prefix its grammar allows. A stop token ends the drafts before it: the row at its
    place samples it, and a draft after a terminated grammar could only be junk."""
    for seq in seqs:
        matcher, drafts = seq.structured_state, seq.draft_token_ids
        if matcher is None or not drafts:
            continue
        stop = next((i for i, token in enumerate(drafts) if token in stop_token_ids), len(drafts))
        allowed = backend.accept_prefix(matcher, drafts[:stop])
        backend.rollback(matcher, allowed)
        seq.draft_token_ids = drafts[:allowed]


def draft_depths(seq_ids: list[int]) -> list[int]:
    """How many drafts precede each row: a sequence's rows are adjacent, row j after j drafts."""
    depths = []
    for i, seq_id in enumerate(seq_ids):
        depths.append(depths[-1] + 1 if i and seq_ids[i - 1] == seq_id else 0)
    return depths


def apply_grammar_masks(backend: Any, logits: torch.Tensor, seq_ids: list[int], matchers: dict[int, Any],
                        drafts: dict[int, list[int]]) -> None:
    """Mask ``logits [rows, vocab]``: row i of sequence ``seq_ids[i]`` (not in ``matchers``:
    unguided or finished) by its grammar after the ``drafts`` before the row. One backend call
    per draft depth: between calls each matcher with a deeper row takes its next draft; all are
    rolled back at the end. A draft the grammar refuses (``clip_drafts`` lets none through)
    leaves the rows after it unmasked: verification rejects that draft (its own row's mask
    refuses it), so nothing is sampled from them."""
    live = [matchers.get(seq_id) for seq_id in seq_ids]
    depths = draft_depths(seq_ids)
    if not any(depths):
        backend.apply_bitmask(logits, live)
        return
    advanced: dict[int, int] = {}  # seq_id -> drafts its matcher took
    for depth in range(max(depths) + 1):
        for i, matcher in enumerate(live):
            if matcher is not None and depths[i] == depth and depth:
                seq_id = seq_ids[i]
                if advanced.get(seq_id, 0) == depth - 1 and backend.accept_prefix(
                        matcher, [drafts[seq_id][depth - 1]]) == 1:
                    advanced[seq_id] = depth
                else:
                    live[i] = None
        level = [matcher if depths[i] == depth else None for i, matcher in enumerate(live)]
        if any(matcher is not None for matcher in level):
            backend.apply_bitmask(logits, level)
    for seq_id, count in advanced.items():
        backend.rollback(matchers[seq_id], count)
