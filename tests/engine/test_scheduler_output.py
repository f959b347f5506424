"""The scheduler's plain SchedulerOutput rebuilds, in the runner's InputBatch, exactly what the
engine's live sequences say: rows, counts, block tables, drafts, through preemption and finish."""

from __future__ import annotations

import pickle
import random

from fastllm.engine.kv_cache_manager import KVCacheManager
from fastllm.engine.scheduler import Scheduler
from fastllm.engine.sequence import Sequence
from fastllm.sampling_params import SamplingParams
from fastllm.worker.input_batch import InputBatch


def _check_runner_view(scheduler: Scheduler, batch: InputBatch, steps: int, rng: random.Random) -> int:
    """Run ``steps`` steps, each sampling token appended on both sides; return the preemptions seen."""
    preemptions = 0
    for _ in range(steps):
        schedule = scheduler.schedule()
        preemptions += len(schedule.preempted)
        if not schedule.scheduled:
            continue
        wire = pickle.dumps(schedule.output)
        assert b"fastllm.engine" not in wire  # plain data: no live engine object crosses
        rows = batch.update(pickle.loads(wire))
        assert [row.seq.seq_id for row in rows] == [item.seq.seq_id for item in schedule.scheduled]
        for row, item in zip(rows, schedule.scheduled):
            seq = item.seq
            assert row.seq.block_ids == seq.block_table
            assert row.seq.num_computed_tokens == seq.num_computed_tokens
            assert (row.num_new_tokens, row.draft_token_ids) == (item.num_new_tokens,
                                                                 seq.draft_token_ids[: item.num_draft_tokens])
            assert row.samples is item.samples
        scheduler.update(schedule.scheduled)
        for row, item in zip(rows, schedule.scheduled):
            if item.samples:
                token = rng.randrange(3, 100)
                item.seq.append_token(token)
                row.seq.output_token_ids.append(token)
                if len(item.seq.output_token_ids) >= 6:
                    item.seq.finish("length")
                    scheduler.finish(item.seq)
        for seq in scheduler.running:  # decodes propose drafts now and then
            if seq.num_computed_tokens == seq.num_tokens - 1 and rng.random() < 0.3:
                seq.draft_token_ids = [rng.randrange(3, 100) for _ in range(rng.randrange(1, 3))]
    return preemptions


def test_the_runner_view_follows_the_scheduler_through_preemptions_and_finishes():
    rng = random.Random(0)
    kv = KVCacheManager(num_blocks=13, block_size=4, enable_prefix_caching=True)
    scheduler = Scheduler(kv, max_num_seqs=6, max_num_batched_tokens=24)
    seqs = [Sequence(f"r{i}", 0, [rng.randrange(3, 100) for _ in range(rng.randrange(3, 20))], SamplingParams(),
                     frozenset(), 4096) for i in range(10)]
    for seq in seqs:
        scheduler.add(seq)
    batch = InputBatch()
    assert _check_runner_view(scheduler, batch, 80, rng) > 0
    assert all(seq.is_finished for seq in seqs)
    scheduler.add(Sequence("last", 0, [5, 6, 7], SamplingParams(), frozenset(), 4096))
    out = scheduler.schedule().output
    assert {seq.seq_id for seq in seqs} & set(out.finished_seq_ids)
    batch.update(out)
    assert list(batch.seqs) == out.seq_ids  # every finished sequence is forgotten
