"""The engine's side of guided decoding: a read step's grammars advanced in one backend call,
before its tokens are detokenized, and the next step's rows masked from them."""

from __future__ import annotations

from typing import Any, Optional

import torch

from fastllm.engine.scheduler import ScheduledSequence
from fastllm.structured_output.drafts import apply_grammar_masks
from fastllm.worker.pending_step import SequenceResult


class GrammarMasks:
    """One step's masks (``fastllm.sampling.sampler.GrammarMask``): ``matchers`` by ``seq_id``,
    which stay with the engine's requests, and the drafts each guided sequence verifies; the
    runner hands over the logits."""

    def __init__(self, backend: Any, matchers: dict[int, Any], drafts: Optional[dict[int, list[int]]] = None):
        self.backend, self.matchers, self.drafts = backend, matchers, drafts or {}

    def apply(self, logits: torch.Tensor, seq_ids: list[int]) -> None:
        apply_grammar_masks(self.backend, logits, seq_ids, self.matchers, self.drafts)


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
