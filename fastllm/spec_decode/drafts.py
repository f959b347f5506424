"""When the engine asks a speculative decoder for drafts, and how many each sequence may take."""

from __future__ import annotations

from typing import Iterable, Iterator

from fastllm.spec_decode.interface import DraftingSequence, SpeculativeDecoder


class DraftRoom:
    """The running sequences' room for drafts, and the questions put to a ``SpeculativeDecoder``."""

    def __init__(self, max_model_len: int):
        self.max_model_len = max_model_len

    def room(self, running: Iterable[DraftingSequence]) -> Iterator[tuple[DraftingSequence, int]]:
        """Each running sequence whose next step decodes, with the most drafts that step may
        verify (>= 1, before max_tokens / max_model_len); a token pending on the device counts
        as known. A guided sequence's drafts are cut to what its grammar allows afterwards."""
        for seq in running:
            num_tokens = seq.num_tokens + seq.num_pending_tokens
            if seq.num_computed_tokens != num_tokens - 1:
                continue
            left = self.max_model_len - num_tokens - 1
            max_tokens = seq.sampling_params.max_tokens
            if max_tokens is not None:
                left = min(left, max_tokens - len(seq.output_token_ids) - seq.num_pending_tokens - 1)
            if left > 0:
                yield seq, left

    def wanted(self, speculator: SpeculativeDecoder, running: Iterable[DraftingSequence]) -> bool:
        """Whether some sequence would verify drafts next step; asked before the step in flight is
        read. A sequence still holding drafts (its last step had no room for it) counts; a
        decoder without ``wants_drafts`` is taken to want them every step."""
        wants = getattr(speculator, "wants_drafts", None)
        return any(seq.draft_token_ids or wants is None or wants(seq) for seq, _ in self.room(running))

    def propose(self, speculator: SpeculativeDecoder, running: Iterable[DraftingSequence]) -> None:
        """Drafts continue a sequence's latest token, so one still pending on the device gets none."""
        candidates = [(seq, room) for seq, room in self.room(running) if not seq.num_pending_tokens]
        if candidates:
            seqs, room = zip(*candidates)
            speculator.propose(list(seqs), list(room))
