"""The decoder without a model: where drafts come from, which source wins, what a request leaves
behind, and how the plugin is found."""

from __future__ import annotations

import pytest
from fastllm_lookahead import LookaheadDecoder
from fastllm_lookahead.policy import AcceptanceTracker

from fastllm import registry
from fastllm.engine.sequence import Sequence
from fastllm.sampling_params import SamplingParams


def new_seq(decoder: LookaheadDecoder, request_id: str, prompt: list[int], index: int = 0) -> Sequence:
    seq = Sequence(request_id, index, prompt, SamplingParams(), frozenset(), 4096)
    decoder.on_prompt(seq)
    return seq


def emit(decoder: LookaheadDecoder, seq: Sequence, tokens: list[int]) -> None:
    """The engine's side of one step that yielded ``tokens`` without drafts."""
    seq.output_token_ids.extend(tokens)
    decoder.on_step(seq, 0, 0)


def propose(decoder: LookaheadDecoder, *seqs: Sequence, room: int = 100) -> list[list[int]]:
    decoder.propose(list(seqs), [room] * len(seqs))
    return [seq.draft_token_ids for seq in seqs]


def test_the_plugin_registers_lookahead():
    assert registry.get("speculative_decoders", "lookahead") is LookaheadDecoder
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LookaheadDecoder({"method": "lookahead", "num_speculative_token": 4})


def test_a_request_copies_from_its_own_prompt():
    decoder = LookaheadDecoder({"method": "lookahead", "num_speculative_tokens": 3})
    seq = new_seq(decoder, "a", [50, 51, 52, 53, 54, 55, 56, 57])
    emit(decoder, seq, [52, 53])
    assert propose(decoder, seq) == [[54, 55, 56]]
    assert propose(decoder, seq, room=2) == [[54, 55]]


def test_other_requests_answers_draft_a_new_request():
    decoder = LookaheadDecoder({"method": "lookahead", "num_speculative_tokens": 4})
    first = new_seq(decoder, "a", [1, 2, 3])
    emit(decoder, first, [70, 71, 72, 73, 74, 75])
    decoder.on_finished(first)
    second = new_seq(decoder, "b", [1, 2, 3])
    emit(decoder, second, [70])  # the first answer's start, found through the prompt's end
    assert propose(decoder, second) == [[71, 72, 73]]  # 3 drafts: a new sequence's first guess


def test_the_longer_match_wins_and_the_own_trie_wins_ties():
    decoder = LookaheadDecoder({"method": "lookahead", "num_speculative_tokens": 2})
    other = new_seq(decoder, "a", [9])
    emit(decoder, other, [5, 6, 7, 80, 81])
    decoder.on_finished(other)
    longer_in_pool = new_seq(decoder, "b", [6, 7, 90, 91, 30, 7])
    emit(decoder, longer_in_pool, [5, 6, 7])  # pool: [5, 6, 7] -> 80; own: [6, 7] -> 90
    assert propose(decoder, longer_in_pool) == [[80, 81]]
    tie = new_seq(decoder, "c", [5, 6, 7, 60, 61, 40])
    emit(decoder, tie, [5, 6, 7])  # both know [5, 6, 7]: its own prompt goes on with 60
    assert propose(decoder, tie) == [[60, 61]]


def test_samples_share_their_request_trie_until_the_last_finishes():
    decoder = LookaheadDecoder({"method": "lookahead"})
    samples = [new_seq(decoder, "a", [1, 2, 3, 4], index=i) for i in range(2)]
    emit(decoder, samples[0], [20, 21, 22, 23])
    emit(decoder, samples[1], [20])
    assert propose(decoder, samples[1]) == [[21, 22, 23]]
    decoder.on_finished(samples[0])
    decoder.on_finished(samples[0])  # an abort after a finish releases nothing twice
    assert decoder.stats()["active_requests"] == 1
    decoder.on_finished(samples[1])
    assert decoder.stats()["active_requests"] == 0


def test_a_large_batch_shares_the_step_budget():
    decoder = LookaheadDecoder({"method": "lookahead", "max_batch_draft_tokens": 16})
    seqs = [new_seq(decoder, str(i), [1, 2, 3, 4, 5, 6, 7, 8]) for i in range(10)]
    for seq in seqs:
        emit(decoder, seq, [1, 2])
    drafts = propose(decoder, *seqs)
    assert sum(len(d) for d in drafts) <= 16 and all(d == [3] for d in drafts)


def test_asking_whether_drafts_are_wanted_changes_nothing_and_tells_the_truth():
    """A new sequence wants drafts; a backed-off one wants none until a probe is due, and then
    only when its context ends in a match of ``PROBE_MIN_MATCH`` tokens."""
    decoder = LookaheadDecoder({"method": "lookahead", "num_speculative_tokens": 3})
    seq = new_seq(decoder, "a", [50, 51, 52, 53, 54, 55, 56, 57])
    emit(decoder, seq, [52, 53])
    assert decoder.wants_drafts(seq) and decoder.wants_drafts(seq)
    assert propose(decoder, seq) == [[54, 55, 56]]
    seq.output_token_ids.append(90)  # every draft rejected: backed off
    decoder.on_step(seq, 3, 0)
    wanted = []
    for token in (91, 92, 93, 50, 51, 52):
        wanted.append(decoder.wants_drafts(seq))
        assert propose(decoder, seq) == [[]]
        emit(decoder, seq, [token])
    assert wanted == [False] * 6  # a probe is due from the 4th step on, but no context matched
    assert decoder.wants_drafts(seq) and propose(decoder, seq) == [[53]]  # [50, 51, 52]: the probe


def test_with_a_token_pending_a_due_probe_is_wanted_where_the_known_tokens_already_match():
    """A yes costs the step's overlap, so a probe waits for the tokens on the host to end in a
    long enough match (the pending token then likely continues it), not merely a possible one."""
    decoder = LookaheadDecoder({"method": "lookahead", "num_speculative_tokens": 3})
    seq = new_seq(decoder, "a", [50, 51, 52, 53, 54, 55, 56, 57])
    seq.spec_state.tracker = AcceptanceTracker(3, 0.3, successes=0.0, idle_steps=10)  # backed off, probe due
    seq.num_pending_tokens = 1
    seq.output_token_ids = [50, 51, 52]  # copying: [51, 52, pending] likely is [51, 52, 53]
    assert decoder.wants_drafts(seq)
    seq.output_token_ids = [60, 50, 51]  # [50, 51, pending] only may match: wait for the token
    assert not decoder.wants_drafts(seq)
