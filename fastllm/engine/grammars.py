"""Advances a read step's grammars in one backend call, before its tokens are detokenized."""

from __future__ import annotations

from typing import Any

from fastllm.engine.pending_step import SequenceResult
from fastllm.engine.scheduler import ScheduledSequence


def advance_grammars(backend: Any, scheduled: list[ScheduledSequence], results: dict[int, SequenceResult]) -> None:
    """Feed each live guided sequence its new token and mark ``grammar_terminated`` on the
    results of those whose grammar is complete. One call for the whole step, made first, lets
    the backend start filling the next step's masks while the host detokenizes. Guided
    sequences get no drafts, so each has at most one new token."""
    guided = [(item.seq, results[item.seq.seq_id]) for item in scheduled
              if item.seq.structured_state is not None and not item.seq.is_finished]
    guided = [(seq, result) for seq, result in guided if result.new_token_ids]
    if not guided:
        return
    terminated = backend.accept_tokens([seq.structured_state for seq, _ in guided],
                                       [result.new_token_ids[0] for _, result in guided])
    for (_, result), done in zip(guided, terminated):
        result.grammar_terminated = done
