"""What a structured-output plugin provides: compiled grammars, per-sample matchers, one batched
token accept and one batched logits mask per step.

The engine builds the backend once, as ``factory(tokenizer, vocab_size)``; ``vocab_size`` is
the model's logits width, which may exceed the tokenizer's size (padded embeddings).
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

import torch

from fastllm.sampling_params import GuidedDecodingParams

CompiledGrammar = Any
"""Opaque to the core: whatever ``compile`` returns is handed back to ``new_matcher``."""

GrammarMatcher = Any
"""One sample's position in its grammar; it lives in ``Sequence.structured_state``. Opaque to
the core too: only the backend reads or advances it, so it can batch both."""


class StructuredOutputBackend(Protocol):
    """Compiles guided-decoding specs, advances matchers and masks the logits of guided rows.

    ``name`` appears in refusals. A backend's factory may carry a ``preference`` (lower first):
    the order in which the ``auto`` router asks the backends for a request.
    """

    name: str

    def compile(self, spec: GuidedDecodingParams) -> CompiledGrammar:
        """Called once per request, before anything is queued; raises ValueError (the
        request's 400) for a spec that cannot be compiled, with a message that says what and
        where. With ``spec.strict`` (None counts as True) it also raises, naming each keyword
        and its JSON pointer (``coverage.InexactSchema``), for a schema it would enforce only
        approximately; with False it may compile a looser grammar."""
        ...

    def new_matcher(self, compiled: CompiledGrammar) -> GrammarMatcher:
        """A fresh matcher at the grammar's start, one per sample of the request."""
        ...

    def accept_tokens(self, matchers: Sequence[GrammarMatcher], token_ids: Sequence[int]) -> list[bool]:
        """Advance each matcher past its sampled token (a token the grammar rejects leaves it
        as it was); return, per matcher, whether its grammar is now terminated (complete and
        its stop token accepted): the engine finishes those sequences with reason "stop".

        Called once per read step with every guided sequence's new token (a sequence that
        verified drafts is called once per token it kept), before the host detokenizes that step: a backend
        may start filling the next masks of the matchers that go on here, on another thread,
        as long as ``apply_bitmask`` then waits for them.
        """
        ...

    def apply_bitmask(self, logits: torch.Tensor, matchers: Sequence[Optional[GrammarMatcher]]) -> None:
        """Set to -inf, in place, every token row ``i`` of ``logits [rows, vocab]`` may not
        take next under ``matchers[i]``; rows whose matcher is None stay untouched.

        Called once per step for the whole batch, only when some row is guided; each
        matcher appears at most once (a sequence's draft rows are masked one call per draft
        depth, its matcher advanced through the drafts before them).
        """
        ...

    def accept_prefix(self, matcher: GrammarMatcher, token_ids: Sequence[int]) -> int:
        """Advance ``matcher`` through the longest prefix of ``token_ids`` its grammar allows and
        return that prefix's length (the matcher stays after it). A stop token the complete
        grammar accepts ends the prefix. Draft tokens (never a stop token) are checked, and draft
        rows masked, this way; ``rollback`` undoes it."""
        ...

    def rollback(self, matcher: GrammarMatcher, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` tokens ``matcher`` accepted."""
        ...
