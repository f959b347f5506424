"""Continuous batching: one token budget shared by decodes and (chunked) prefills, FCFS; each
step also as plain data for the runner (``SchedulerOutput``)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from fastllm.engine.block_pool import Block
from fastllm.engine.kv_cache_manager import KVCacheManager
from fastllm.engine.sequence import Sequence, SequenceStatus
from fastllm.worker.scheduler_output import NewSequence, SchedulerOutput


@dataclass(slots=True)
class ScheduledSequence:
    """``num_new_tokens`` tokens of ``seq`` go through the model this step (drafts included)."""

    seq: Sequence
    num_new_tokens: int
    num_draft_tokens: int = 0
    num_accepted_drafts: int = 0

    @property
    def samples(self) -> bool:
        """True when this step reaches the end of the known tokens, so a new token is sampled."""
        return (self.seq.num_computed_tokens + self.num_new_tokens - self.num_draft_tokens
                >= self.seq.num_tokens + self.seq.num_pending_tokens)


@dataclass
class Schedule:
    """One step on the engine's side (live sequences) and, in ``output``, for the runner."""

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    output: SchedulerOutput = field(default_factory=SchedulerOutput)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    """Two queues, ``waiting`` and ``running``; ``schedule()`` says what runs next step.

    Running sequences are served first (oldest first); when the KV pool runs dry the
    newest running sequence is preempted and recomputed later. A token still pending on the
    device counts as known: its sequence is scheduled to decode it, and the runner reads it
    there, unless the pending tokens already end the sequence.
    """

    def __init__(self, kv_cache: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool = True, kv_cache_ratio: float = 1.0,
                 max_adapters_per_step: Optional[int] = None):
        self.kv_cache = kv_cache
        self.max_adapters_per_step = max_adapters_per_step
        self.kv_cache_ratio = kv_cache_ratio
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._finished_ids: list[int] = []  # for the runner to forget, held until a step carries them

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> Schedule:
        out = Schedule()
        budget = self.max_num_batched_tokens
        scheduled_running: list[Sequence] = []
        adapters: set[int] = set()
        allocate = self.kv_cache.allocate
        queue = deque(seq for seq in self.running if not seq.finishes_with_pending)
        while queue and budget > 0:
            seq = queue.popleft()
            if not self._adapter_fits(seq, adapters):
                continue  # it keeps its blocks and runs once its adapter's turn comes
            drafts = len(seq.draft_token_ids)
            wanted = seq.num_tokens + seq.num_pending_tokens + drafts - seq.num_computed_tokens
            if wanted > budget and drafts:
                seq.draft_token_ids = seq.draft_token_ids[: max(0, budget - (wanted - drafts))]
                drafts = len(seq.draft_token_ids)
                wanted = seq.num_tokens + drafts - seq.num_computed_tokens
            num_new = min(wanted, budget)
            while not allocate(seq, num_new):
                if drafts:  # drafts never cost another sequence its cache: drop them first
                    seq.draft_token_ids, num_new, wanted, drafts = [], num_new - drafts, wanted - drafts, 0
                    continue
                victim = queue.pop() if queue else seq
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                scheduled_running.append(seq)
                adapters.add(seq.adapter_id)
                out.scheduled.append(ScheduledSequence(seq, num_new, drafts if num_new == wanted else 0))
                budget -= num_new
        if len(scheduled_running) != len(self.running):
            scheduled_ids = {seq.seq_id for seq in scheduled_running}
            scheduled_running += [s for s in self.running if s.seq_id not in scheduled_ids
                                  and s.status is SequenceStatus.RUNNING]
        self.running = scheduled_running
        if not out.preempted:
            self._admit_waiting(out, budget, adapters)
        if out.scheduled:
            out.output = self._runner_view(out.scheduled)
        return out

    def _runner_view(self, scheduled: list[ScheduledSequence]) -> SchedulerOutput:
        """The step as plain data: sequences new to the runner in full, the others as changes."""
        seqs = [item.seq for item in scheduled]
        out = SchedulerOutput([seq.seq_id for seq in seqs], [item.num_new_tokens for item in scheduled],
                              [seq.num_computed_tokens for seq in seqs], finished_seq_ids=self._finished_ids)
        self._finished_ids = []
        for item, seq in zip(scheduled, seqs):
            if not seq.in_runner:
                seq.in_runner = True
                out.new_seqs.append(NewSequence(seq.seq_id, seq.request_id, seq.index, seq.prompt_token_ids,
                                                seq.sampling_params, seq.seed, seq.eos_token_ids,
                                                seq.bad_words_token_ids, seq.adapter_id, seq.multimodal))
            elif not seq.num_runner_blocks:  # preempted since the runner last saw it
                out.resumed_seq_ids.append(seq.seq_id)
            if len(seq.block_table) != seq.num_runner_blocks:
                out.new_block_ids[seq.seq_id] = seq.block_table[seq.num_runner_blocks:]
                seq.num_runner_blocks = len(seq.block_table)
            if item.num_draft_tokens:
                out.draft_token_ids[seq.seq_id] = seq.draft_token_ids[: item.num_draft_tokens]
        return out

    def _adapter_fits(self, seq: Sequence, adapters: set[int]) -> bool:
        """At most ``max_adapters_per_step`` distinct adapters (the device slots) run in one step."""
        if not seq.adapter_id or self.max_adapters_per_step is None or seq.adapter_id in adapters:
            return True
        return len(adapters - {0}) < self.max_adapters_per_step

    def _admit_waiting(self, out: SchedulerOutput, budget: int, adapters: set[int]) -> None:
        room: Optional[int] = None  # free blocks once every running sequence has grown to its end
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if seq.num_pending_tokens:  # preempted while its token was in flight: recompute once it is read
                break
            if not self._adapter_fits(seq, adapters):
                break
            cached = self.kv_cache.match_prefix(seq) if seq.num_computed_tokens == 0 else []
            cached_tokens = len(cached) * self.kv_cache.block_size
            remaining = seq.num_tokens - seq.num_computed_tokens - cached_tokens
            if remaining > budget and not self.enable_chunked_prefill:
                break
            needs = self._blocks_to_the_end(seq, cached)
            if self.running and not self._prompt_fits_ratio(seq, len(cached)):
                room = self._room_to_the_end() if room is None else room
                if needs > room:
                    break
            num_new = min(remaining, budget)
            if not self.kv_cache.allocate(seq, num_new, cached):
                break
            if room is not None:
                room -= needs
            self.waiting.popleft()
            seq.num_computed_tokens += cached_tokens
            if not seq.output_token_ids:
                seq.num_cached_tokens = cached_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            adapters.add(seq.adapter_id)
            budget -= num_new

    def _prompt_fits_ratio(self, seq: Sequence, num_cached_blocks: int) -> bool:
        """FastDeploy's ``kv_cache_ratio``: prompts may fill only that share of the pool, the rest
        is kept for running sequences to grow into, so admitting a prompt rarely forces a preemption.

        Beyond that share a prompt is still admitted when the pool can hold it and every running
        sequence up to their ``max_tokens`` (``_room_to_the_end``): no preemption can follow, and
        requests of known length fill the cache instead of leaving a quarter of it to growth
        they will never need."""
        pool = self.kv_cache.pool
        used = pool.num_usable_blocks - pool.num_free_blocks
        wanted = self.kv_cache.blocks_needed(seq.num_tokens) - num_cached_blocks
        return used + wanted <= self.kv_cache_ratio * pool.num_usable_blocks

    def _room_to_the_end(self) -> int:
        """Free blocks that stay free while every running sequence grows to its ``max_num_tokens``."""
        blocks_needed = self.kv_cache.blocks_needed
        growth = sum(max(0, blocks_needed(seq.max_num_tokens) - len(seq.block_table)) for seq in self.running)
        return self.kv_cache.num_free_blocks - growth

    def _blocks_to_the_end(self, seq: Sequence, cached: list[Block]) -> int:
        """Free blocks ``seq`` takes from admission to its ``max_num_tokens``: its cached prefix
        costs only the blocks that sit idle in the free list."""
        idle = sum(1 for block in cached if block.ref_count == 0)
        return self.kv_cache.blocks_needed(seq.max_num_tokens) - len(cached) + idle

    def _preempt(self, seq: Sequence) -> None:
        """Free a running sequence's blocks; it goes back to the head of the queue to recompute."""
        self.kv_cache.free(seq)
        seq.num_runner_blocks = 0
        seq.num_computed_tokens = 0
        seq.draft_token_ids = []
        seq.status = SequenceStatus.WAITING
        if seq in self.running:
            self.running.remove(seq)
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def update(self, scheduled: list[ScheduledSequence]) -> None:
        """Advance computed-token counts after the model ran the scheduled tokens.

        Keys and values of rejected draft tokens stay in their slots as garbage and
        are overwritten later, since they lie past ``num_computed_tokens``.
        """
        caching = self.kv_cache.enable_prefix_caching
        for item in scheduled:
            seq = item.seq
            seq.num_computed_tokens += (item.num_new_tokens - item.num_draft_tokens
                                        + item.num_accepted_drafts)
            if caching:
                self.kv_cache.cache_computed_blocks(seq)

    def finish(self, seq: Sequence) -> None:
        """Release a finished (or aborted) sequence wherever it is; the runner forgets it next step."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv_cache.free(seq)
        if seq.in_runner:
            self._finished_ids.append(seq.seq_id)
            seq.in_runner = False
