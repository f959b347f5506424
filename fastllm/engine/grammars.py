"""The engine's side of guided decoding: a read step's grammars advanced in one backend call,
before its tokens are detokenized, and the next step's rows masked from them."""

from __future__ import annotations

from typing import Any

import torch

from fastllm.engine.scheduler import ScheduledSequence
from fastllm.worker.pending_step import SequenceResult


class GrammarMasks:
    """One step's masks (``fastllm.sampling.sampler.GrammarMask``): ``matchers`` by ``seq_id``,
    which stay with the engine's requests; the runner hands over the logits."""

    def __init__(self, backend: Any, matchers: dict[int, Any]):
        self.backend, self.matchers = backend, matchers

    def apply(self, logits: torch.Tensor, seq_ids: list[int]) -> None:
        self.backend.apply_bitmask(logits, [self.matchers.get(seq_id) for seq_id in seq_ids])


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
