"""What a structured-output plugin provides: compiled grammars, per-sample matchers, and one
batched logits mask per step.

The engine builds the backend once, as ``factory(tokenizer, vocab_size)``; ``vocab_size`` is
the model's logits width, which may exceed the tokenizer's size (padded embeddings).
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

import torch

from fastllm.sampling_params import GuidedDecodingParams

CompiledGrammar = Any
"""Opaque to the core: whatever ``compile`` returns is handed back to ``new_matcher``."""


class GrammarMatcher(Protocol):
    """One sample's position in its grammar; it lives in ``Sequence.structured_state``."""

    def accept_token(self, token_id: int) -> bool:
        """Advance past the sampled token; False if the grammar rejects it (state unchanged)."""
        ...

    def is_terminated(self) -> bool:
        """True once the grammar is complete and its stop token was accepted: the engine then
        finishes the sequence with reason "stop"."""
        ...


class StructuredOutputBackend(Protocol):
    """Compiles guided-decoding specs and masks the logits of guided rows."""

    def compile(self, spec: GuidedDecodingParams) -> CompiledGrammar:
        """Called once per request, before anything is queued; raises ValueError (the
        request's 400) for a spec that cannot be compiled."""
        ...

    def new_matcher(self, compiled: CompiledGrammar) -> GrammarMatcher:
        """A fresh matcher at the grammar's start, one per sample of the request."""
        ...

    def apply_bitmask(self, logits: torch.Tensor, matchers: Sequence[Optional[GrammarMatcher]]) -> None:
        """Set to -inf, in place, every token row ``i`` of ``logits [rows, vocab]`` may not
        take next under ``matchers[i]``; rows whose matcher is None stay untouched.

        Called once per step for the whole batch, only when some row is guided; each
        matcher appears at most once (guided sequences get no speculative drafts).
        """
        ...
