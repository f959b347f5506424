"""advance_grammars: one backend accept per read step, with every live guided sequence's token."""

from __future__ import annotations

from fastllm.engine.grammars import advance_grammars
from fastllm.worker.pending_step import SequenceResult
from fastllm.engine.scheduler import ScheduledSequence
from fastllm.engine.sequence import Sequence
from fastllm.sampling_params import SamplingParams


class _Recorder:
    """A backend whose matchers are names; the one called "done" terminates."""

    def __init__(self):
        self.calls = []

    def accept_tokens(self, matchers, token_ids):
        self.calls.append((list(matchers), list(token_ids)))
        return [matcher == "done" for matcher in matchers]


def _item(matcher, finished: bool = False) -> ScheduledSequence:
    seq = Sequence("r", 0, [1, 2, 3], SamplingParams(), frozenset({0}), 64)
    seq.structured_state = matcher
    if finished:
        seq.finish("abort")
    return ScheduledSequence(seq, 1)


def test_one_call_for_the_live_guided_sequences_and_their_results_marked():
    going, done, unguided, aborted, chunk = (_item("going"), _item("done"), _item(None),
                                             _item("aborted", finished=True), _item("chunk"))
    scheduled = [going, unguided, done, aborted, chunk]
    results = {item.seq.seq_id: SequenceResult(new_token_ids=[10 + i]) for i, item in enumerate(scheduled)}
    results[chunk.seq.seq_id].new_token_ids = []  # a prompt chunk that samples nothing
    backend = _Recorder()
    advance_grammars(backend, scheduled, results)
    assert backend.calls == [(["going", "done"], [10, 12])]
    assert [results[item.seq.seq_id].grammar_terminated for item in scheduled] == [False, False, True, False, False]


def test_no_call_without_guided_tokens():
    backend = _Recorder()
    item = _item(None)
    advance_grammars(backend, [item], {item.seq.seq_id: SequenceResult(new_token_ids=[5])})
    advance_grammars(None, [item], {item.seq.seq_id: SequenceResult(new_token_ids=[5])})
    assert backend.calls == []
