"""What a speculative decoder plugin provides: draft tokens for running sequences."""

from __future__ import annotations

from typing import Any, Protocol

from fastllm.engine.sequence import Sequence


class SpeculativeDecoder(Protocol):
    """Built as ``cls(speculative_config: dict, engine_config)``.

    Before each step the engine calls ``propose`` with the sequences that are decoding;
    the decoder sets ``seq.draft_token_ids`` (at most ``max_drafts[i]`` tokens each). The
    engine verifies drafts exactly and reports back through ``on_step``.
    """

    def propose(self, seqs: list[Sequence], max_drafts: list[int]) -> None: ...

    def on_prompt(self, seq: Sequence) -> None:
        """A new sequence arrived (its prompt can seed the proposer)."""
        ...

    def on_step(self, seq: Sequence, num_proposed: int, num_accepted: int) -> None:
        """``seq`` just appended tokens; ``num_accepted`` of ``num_proposed`` drafts held."""
        ...

    def on_finished(self, seq: Sequence) -> None: ...

    def stats(self) -> dict[str, Any]: ...
