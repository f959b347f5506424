"""Drafts in the scheduler: they share the token budget, and never cost another sequence its cache."""

from __future__ import annotations

from fastllm.engine.kv_cache_manager import KVCacheManager
from fastllm.engine.scheduler import Scheduler
from fastllm.engine.sequence import Sequence
from fastllm.sampling_params import SamplingParams


def prefilled(scheduler: Scheduler, *lengths: int) -> list[Sequence]:
    """Sequences of these prompt lengths, prefilled, each with its first token sampled."""
    seqs = [Sequence(str(i), 0, list(range(3, 3 + n)), SamplingParams(), frozenset(), 4096)
            for i, n in enumerate(lengths)]
    for seq in seqs:
        scheduler.add(seq)
    out = scheduler.schedule()
    scheduler.update(out.scheduled)
    for seq in seqs:
        seq.append_token(7)
    return seqs


def test_drafts_are_cut_to_the_token_budget():
    scheduler = Scheduler(KVCacheManager(64, 4, False), max_num_seqs=4, max_num_batched_tokens=5)
    a, b = prefilled(scheduler, 3, 2)
    a.draft_token_ids, b.draft_token_ids = [1, 2, 3, 4, 5, 6], [1, 2]
    out = scheduler.schedule()
    assert [(s.num_new_tokens, s.num_draft_tokens) for s in out.scheduled] == [(5, 4)]
    assert a.draft_token_ids == [1, 2, 3, 4] and out.scheduled[0].samples


def test_drafts_that_need_a_block_are_dropped_before_anyone_is_preempted():
    kv = KVCacheManager(num_blocks=5, block_size=4, enable_prefix_caching=False)  # 4 usable blocks
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    old, _ = prefilled(scheduler, 7, 7)  # 2 blocks each, an 8th slot free in each, no block free
    old.draft_token_ids = [1, 2, 3]
    out = scheduler.schedule()
    assert not out.preempted and scheduler.num_preemptions == 0
    assert (out.scheduled[0].seq, out.scheduled[0].num_new_tokens, out.scheduled[0].num_draft_tokens) == (old, 1, 0)
    assert old.draft_token_ids == []


def test_accepted_drafts_advance_the_computed_tokens():
    scheduler = Scheduler(KVCacheManager(64, 4, False), max_num_seqs=4, max_num_batched_tokens=64)
    (seq,) = prefilled(scheduler, 5)
    seq.draft_token_ids = [8, 9, 10]
    out = scheduler.schedule()
    out.scheduled[0].num_accepted_drafts = 2
    scheduler.update(out.scheduled)
    assert seq.num_computed_tokens == 5 + 1 + 2  # the last token and two drafts; the rejected slot is garbage
