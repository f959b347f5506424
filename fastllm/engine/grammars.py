"""Advances a read step's grammars in one backend call, before its tokens are detokenized."""

from __future__ import annotations

from typing import Any

from fastllm.engine.pending_step import SequenceResult
from fastllm.engine.scheduler import ScheduledSequence


def advance_grammars(backend: Any, scheduled: list[ScheduledSequence], results: dict[int, SequenceResult]) -> None:
    """Feed each live guided sequence its new tokens (its accepted drafts, then the token after
    them) and mark ``grammar_terminated`` on the results of those whose grammar is complete.
    One backend call per token position for the whole step, made first, lets the backend start
    filling the next step's masks while the host detokenizes. A grammar terminates only on a
    stop token, which is never a draft, so only a sequence's last new token can end it."""
    guided = [(item.seq, results[item.seq.seq_id]) for item in scheduled
              if item.seq.structured_state is not None and not item.seq.is_finished]
    guided = [(seq, result) for seq, result in guided if result.new_token_ids]
    position = 0
    while guided:
        terminated = backend.accept_tokens([seq.structured_state for seq, _ in guided],
                                           [result.new_token_ids[position] for _, result in guided])
        for (_, result), done in zip(guided, terminated):
            result.grammar_terminated = done
        position += 1
        guided = [(seq, result) for (seq, result), done in zip(guided, terminated)
                  if not done and len(result.new_token_ids) > position]
