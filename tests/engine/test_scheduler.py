"""Scheduler: shared token budget, chunked prefill, max_num_seqs, preemption by recompute."""

from __future__ import annotations

from fastllm.engine.kv_cache_manager import KVCacheManager
from fastllm.engine.scheduler import Scheduler
from fastllm.engine.sequence import Sequence, SequenceStatus
from fastllm.sampling_params import SamplingParams


def _seq(n: int, request_id: str = "r") -> Sequence:
    return Sequence(request_id, 0, list(range(3, 3 + n)), SamplingParams(), frozenset({2}), 4096)


def _run_step(scheduler: Scheduler, token: int = 7) -> None:
    out = scheduler.schedule()
    scheduler.update(out.scheduled)
    for item in out.scheduled:
        if item.samples:
            item.seq.append_token(token)


def test_chunked_prefill_respects_budget():
    scheduler = Scheduler(KVCacheManager(64, 4, False), max_num_seqs=8, max_num_batched_tokens=10)
    a, b = _seq(25, "a"), _seq(3, "b")
    scheduler.add(a)
    scheduler.add(b)
    out = scheduler.schedule()
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 10)]
    assert not out.scheduled[0].samples
    scheduler.update(out.scheduled)
    out = scheduler.schedule()
    assert out.num_tokens == 10
    scheduler.update(out.scheduled)
    out = scheduler.schedule()
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 5), ("b", 3)]
    assert all(s.samples for s in out.scheduled)


def test_max_num_seqs_caps_running():
    scheduler = Scheduler(KVCacheManager(64, 4, False), max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(4):
        scheduler.add(_seq(4, str(i)))
    out = scheduler.schedule()
    assert len(out.scheduled) == 2 and len(scheduler.waiting) == 2


def test_preemption_frees_blocks_and_requeues_newest():
    kv = KVCacheManager(num_blocks=5, block_size=4, enable_prefix_caching=False)  # 4 usable blocks
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    old, new = _seq(8, "old"), _seq(8, "new")
    scheduler.add(old)
    scheduler.add(new)
    _run_step(scheduler)  # both prefilled, 2 blocks each, 0 free
    out = scheduler.schedule()  # old needs a 3rd block: new is preempted
    assert [s.request_id for s in out.preempted] == ["new"]
    assert new.status is SequenceStatus.WAITING and new.num_computed_tokens == 0
    assert scheduler.waiting[0] is new and scheduler.num_preemptions == 1
    assert [s.seq.request_id for s in out.scheduled] == ["old"]


def test_kv_cache_ratio_keeps_room_for_running_sequences():
    kv = KVCacheManager(num_blocks=9, block_size=4, enable_prefix_caching=False)  # 8 usable blocks
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, kv_cache_ratio=0.5)
    first, second, third = _seq(12, "first"), _seq(4, "second"), _seq(4, "third")
    for seq in (first, second, third):
        scheduler.add(seq)
    out = scheduler.schedule()  # first: 3 blocks; second: 3 + 1 <= 4; third: 4 + 1 > 4 waits
    assert [s.seq.request_id for s in out.scheduled] == ["first", "second"]
    assert list(scheduler.waiting) == [third]


def _short(n: int, request_id: str, max_tokens: int) -> Sequence:
    return Sequence(request_id, 0, list(range(3, 3 + n)), SamplingParams(max_tokens=max_tokens), frozenset({2}), 4096)


def test_prompts_beyond_the_ratio_are_admitted_when_everyone_fits_to_the_end():
    kv = KVCacheManager(num_blocks=17, block_size=4, enable_prefix_caching=False)  # 16 usable blocks
    scheduler = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64, kv_cache_ratio=0.5)
    # 8 prompt tokens + 4 to generate: 2 blocks now, 3 at the end; the ratio alone admits four
    seqs = [_short(8, str(i), max_tokens=4) for i in range(6)]
    for seq in seqs:
        scheduler.add(seq)
    out = scheduler.schedule()
    assert len(out.scheduled) == 5  # 5 x 3 blocks fit in 16; a sixth would need 18
    assert list(scheduler.waiting) == seqs[5:]
    scheduler.update(out.scheduled)
    for _ in range(12):
        out = scheduler.schedule()
        assert not out.preempted
        scheduler.update(out.scheduled)
        for item in out.scheduled:
            if item.samples:
                item.seq.append_token(7)
                if len(item.seq.output_token_ids) == 4:
                    scheduler.finish(item.seq)
    assert scheduler.num_preemptions == 0 and not scheduler.waiting and not scheduler.running


def test_unbounded_requests_are_held_to_the_ratio():
    kv = KVCacheManager(num_blocks=17, block_size=4, enable_prefix_caching=False)
    scheduler = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64, kv_cache_ratio=0.5)
    seqs = [Sequence(str(i), 0, list(range(3, 11)), SamplingParams(max_tokens=None), frozenset({2}), 4096)
            for i in range(6)]
    for seq in seqs:
        scheduler.add(seq)
    out = scheduler.schedule()
    assert [s.seq for s in out.scheduled] == seqs[:4]  # 8 blocks of prompts: half the pool


def test_a_step_runs_at_most_max_adapters_per_step_distinct_adapters():
    scheduler = Scheduler(KVCacheManager(64, 4, False), max_num_seqs=8, max_num_batched_tokens=100,
                          max_adapters_per_step=2)
    seqs = [_seq(3, name) for name in "abcde"]
    for seq, adapter in zip(seqs, [1, 0, 2, 3, 1]):
        seq.adapter_id = adapter
        scheduler.add(seq)
    steps = []
    for _ in range(3):
        out = scheduler.schedule()
        steps.append(sorted(s.seq.request_id for s in out.scheduled))
        scheduler.update(out.scheduled)
        for item in out.scheduled:
            item.seq.append_token(7)
    # admission stops at the third adapter (FCFS); running sequences beyond the cap wait a step
    assert steps[0] == ["a", "b", "c"]
    assert steps[1] == ["a", "b", "c"] and len(scheduler.running) == 3
    for seq in seqs[:3]:
        scheduler.finish(seq)
    out = scheduler.schedule()
    assert sorted(s.seq.request_id for s in out.scheduled) == ["d", "e"]
