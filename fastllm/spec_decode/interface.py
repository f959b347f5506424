"""What a speculative decoder plugin provides: draft tokens for running sequences."""

from __future__ import annotations

from typing import Any, Protocol

from fastllm.sampling_params import SamplingParams


class DraftingSequence(Protocol):
    """What a decoder reads and sets of a sequence (the engine's ``Sequence`` is one).

    ``output_token_ids`` may lack its ``num_pending_tokens`` latest tokens, still on the device."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: SamplingParams
    num_pending_tokens: int
    num_computed_tokens: int
    draft_token_ids: list[int]  # set by ``propose``
    spec_state: Any  # the decoder's own
    structured_state: Any  # not None: guided, so it never drafts

    @property
    def num_tokens(self) -> int:
        ...


class SpeculativeDecoder(Protocol):
    """Built once per engine as ``cls(speculative_config: dict, engine_config)``.

    Before each step the engine asks ``wants_drafts`` of the sequences whose next step is a
    decode; where any says yes it calls ``propose`` with all of them, and the decoder sets
    ``seq.draft_token_ids``. The step runs every draft of the batch through the model in the
    same forward pass and keeps the longest run the target model agrees with
    (``fastllm.spec_decode.verify``): greedy and seeded output is unchanged and sampled output
    keeps its distribution, whatever the drafts. Rejected drafts cost only their slots in that pass.
    ``seq.spec_state`` is free for the decoder's own state.

    ``speculative_config["num_speculative_tokens"]``, where given, is the most drafts a
    sequence proposes per step: on CUDA the runner captures graphs of verification steps up
    to that many (steps with more drafts, or without the key, verify eagerly, far slower).
    """

    def on_prompt(self, seq: DraftingSequence) -> None:
        """A new sequence (each of a request's ``n`` samples) arrived; its prompt can seed the proposer."""
        ...

    def wants_drafts(self, seq: DraftingSequence) -> bool:
        """Whether ``propose`` may set drafts on ``seq`` next step; reads only, since it is asked
        every step, before the step in flight is read (``seq.output_token_ids`` may still lack
        its ``seq.num_pending_tokens`` latest tokens). No from every sequence lets the step
        overlap the one in flight (async scheduling); a yes makes the engine read that step
        first and verify this one before launching again, so a yes where ``propose`` then sets
        nothing costs one step's overlap. Optional: the engine takes a decoder without it to
        say yes every step, which keeps async scheduling off while sequences can draft."""
        ...

    def propose(self, seqs: list[DraftingSequence], max_drafts: list[int]) -> None:
        """Set at most ``max_drafts[i]`` (>= 1: the room before max_tokens / max_model_len) drafts
        on ``seqs[i]``; leaving one unset proposes none. Sequences under a grammar never come here.
        The scheduler may cut drafts that do not fit the step's token budget or the KV cache."""
        ...

    def on_step(self, seq: DraftingSequence, num_proposed: int, num_accepted: int) -> None:
        """``seq`` appended this step's tokens (``seq.output_token_ids`` is up to date), of which
        ``num_accepted`` were drafts, out of ``num_proposed`` verified. Comes for every step that
        yields tokens, the one that ends the prompt too, and before ``on_finished``: the place to
        count a step, since ``propose`` comes only on steps where some sequence wants drafts."""
        ...

    def on_finished(self, seq: DraftingSequence) -> None:
        """``seq`` finished or was aborted; may come twice for an aborted request."""
        ...
