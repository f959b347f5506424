"""The runner's view of its sequences, updated from each SchedulerOutput, and the packing of
one step's rows into model inputs and attention metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from fastllm.attention.metadata import AttentionMetadata
from fastllm.platforms.transfer import host_tensor
from fastllm.sampling_params import SamplingParams
from fastllm.worker.scheduler_output import NewSequence, SchedulerOutput


@dataclass(eq=False, slots=True)
class SequenceState:
    """What the runner keeps of one sequence between steps (vLLM's CachedRequestState).

    ``output_token_ids`` grows when a step's tokens are read (``PendingStep.results``);
    ``num_pending_tokens`` counts the sampled ones not read yet, which follow them.
    ``num_computed_tokens`` is the scheduler's count before the current step.
    """

    seq_id: int
    request_id: str
    index: int
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    seed: int
    eos_token_ids: frozenset[int] = frozenset()
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    adapter_id: int = 0
    multimodal: Any = None
    output_token_ids: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_pending_tokens: int = 0
    num_prompt_logprobs: int = 0  # prompt logprob entries already produced (kept over a preemption)

    @classmethod
    def new(cls, seq: NewSequence) -> "SequenceState":
        return cls(seq.seq_id, seq.request_id, seq.index, list(seq.prompt_token_ids), seq.sampling_params,
                   seq.seed, seq.eos_token_ids, seq.bad_words_token_ids, seq.adapter_id, seq.multimodal)

    @property
    def position_delta(self) -> int:
        """What a multimodal prompt's rotary positions add to the index of each later token."""
        return self.multimodal.position_delta if self.multimodal is not None else 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_slice(self, start: int, end: int) -> list[int]:
        """``(prompt + output)[start:end]`` without building the whole list."""
        n = len(self.prompt_token_ids)
        if start >= n:
            return self.output_token_ids[start - n:end - n]
        if end <= n:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - n]


@dataclass(slots=True)
class ScheduledRow:
    """``num_new_tokens`` tokens of ``seq`` go through the model this step, its drafts last."""

    seq: SequenceState
    num_new_tokens: int
    draft_token_ids: list[int] = field(default_factory=list)
    samples: bool = True  # the step reaches the end of the known tokens, so a token is sampled

    @property
    def num_draft_tokens(self) -> int:
        return len(self.draft_token_ids)


class InputBatch:
    """Every sequence the runner holds, by ``seq_id``."""

    def __init__(self):
        self.seqs: dict[int, SequenceState] = {}

    def update(self, out: SchedulerOutput) -> list[ScheduledRow]:
        """Apply the step's changes; return its rows in the scheduler's order."""
        seqs = self.seqs
        for seq_id in out.resumed_seq_ids:
            seqs[seq_id].block_ids = []  # the table it had before its preemption
        for seq_id in out.finished_seq_ids:
            seqs.pop(seq_id, None)  # one aborted before it ever ran was never sent
        for new in out.new_seqs:
            seqs[new.seq_id] = SequenceState.new(new)
        for seq_id, block_ids in out.new_block_ids.items():
            seqs[seq_id].block_ids += block_ids
        rows = []
        append, drafts = rows.append, out.draft_token_ids
        for seq_id, num_new, num_computed in zip(out.seq_ids, out.num_scheduled_tokens, out.num_computed_tokens):
            seq = seqs[seq_id]
            seq.num_computed_tokens = num_computed
            draft = drafts.get(seq_id, []) if drafts else []
            known = len(seq.prompt_token_ids) + len(seq.output_token_ids) + seq.num_pending_tokens
            append(ScheduledRow(seq, num_new, draft, num_computed + num_new - len(draft) >= known))
        return rows


@dataclass
class SampledTokens:
    """The last queued step's sampled tokens, still on the device, and each sequence's row in them."""

    tokens: torch.Tensor
    rows: dict[int, int] = field(default_factory=dict)


@dataclass
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    order: list[ScheduledRow]  # decodes first; the packing order of the tensors
    token_offsets: list[int]  # where each sequence's tokens start in the packed batch
    host: "PackedStep"  # the same inputs in host memory: what workers are sent


def pack_inputs(scheduled: list[ScheduledRow], block_size: int, device: torch.device,
                previous: Optional[SampledTokens] = None) -> ModelInputs:
    """Two host-to-device copies (the int64 and the int32 fields); a token the previous step
    sampled but the host has not read is copied from ``previous`` on the device.

    Decodes (one token, no drafts: most rows of most steps) take a loop of their own that builds
    no per-row lists: the host packs a step while the device runs the one before, and at a few
    hundred rows this loop is a large share of that time."""
    decodes: list[ScheduledRow] = []
    others: list[ScheduledRow] = []
    for item in scheduled:
        (decodes if item.num_new_tokens == 1 and not item.draft_token_ids else others).append(item)
    order = decodes + others
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    fill_at: list[int] = []
    fill_from: list[int] = []
    seq_lens: list[int] = []
    for item in decodes:
        seq = item.seq
        start = seq.num_computed_tokens
        output_at = start - len(seq.prompt_token_ids)
        if output_at < 0:
            input_ids.append(seq.prompt_token_ids[start])
        elif output_at < len(seq.output_token_ids):
            input_ids.append(seq.output_token_ids[output_at])
        else:  # sampled by the step in flight: still on the device
            fill_at.append(len(input_ids))
            fill_from.append(previous.rows[seq.seq_id])
            input_ids.append(0)
        positions.append(start + seq.position_delta)
        slots.append(seq.block_ids[start // block_size] * block_size + start % block_size)
        seq_lens.append(start + 1)
    offsets = list(range(len(decodes)))
    query_lens = [1] * len(decodes)
    for item in others:
        seq, start = item.seq, item.seq.num_computed_tokens
        known = item.num_new_tokens - item.num_draft_tokens
        offsets.append(len(input_ids))
        tokens = seq.token_slice(start, start + known)
        if len(tokens) < known:  # the last one is still on the device
            fill_at.append(len(input_ids) + len(tokens))
            fill_from.append(previous.rows[seq.seq_id])
            tokens.append(0)
        input_ids += tokens
        input_ids += item.draft_token_ids
        end = start + item.num_new_tokens
        positions += range(start + seq.position_delta, end + seq.position_delta)
        table = seq.block_ids
        slots += [table[p // block_size] * block_size + p % block_size for p in range(start, end)]
        query_lens.append(item.num_new_tokens)
        seq_lens.append(end)
    max_blocks = max(len(item.seq.block_ids) for item in order)
    tables: list[int] = []
    padding = [0] * max_blocks
    for item in order:
        table = item.seq.block_ids
        tables += table
        tables += padding[len(table):]
    query_start = [0]
    total = 0
    for q in query_lens:
        total += q
        query_start.append(total)

    host = _packed([input_ids, positions, slots, fill_at, fill_from], [query_start, seq_lens, tables], device)
    longs, ints = host.to_device(device)
    ids = longs[0]
    if fill_at:
        ids[longs[3]] = previous.tokens[longs[4]]
    return ModelInputs(ids, longs[1], step_metadata(longs, ints, query_lens, seq_lens), order, offsets, host)


@dataclass
class PackedStep:
    """A step's inputs in two host buffers: int64 token ids, positions, slots, fill rows and fill
    sources; int32 query starts, sequence lengths and block tables, each field starting 16-byte
    aligned (Triton specialises kernels on pointer alignment, so a misaligned view would compile
    a variant). Pinned, so that copies leave the host free; what rank 0 sends its workers."""

    longs: torch.Tensor
    ints: torch.Tensor
    long_bounds: tuple[tuple[int, int], ...]
    int_bounds: tuple[tuple[int, int], ...]

    def to_device(self, device: torch.device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The fields, as views of the two buffers' copies on ``device`` (the buffers on the CPU)."""
        longs, ints = self.longs, self.ints
        if device.type != "cpu":
            longs, ints = longs.to(device, non_blocking=True), ints.to(device, non_blocking=True)
        return [longs[a:b] for a, b in self.long_bounds], [ints[a:b] for a, b in self.int_bounds]

    def lengths(self) -> tuple[list[int], list[int]]:
        """Each sequence's query and KV lengths, read from the host buffer."""
        starts = self.ints[slice(*self.int_bounds[0])].tolist()
        return [b - a for a, b in zip(starts, starts[1:])], self.ints[slice(*self.int_bounds[1])].tolist()


def step_metadata(longs: list[torch.Tensor], ints: list[torch.Tensor], query_lens: list[int],
                  seq_lens: list[int]) -> AttentionMetadata:
    """The attention metadata over a packed step's fields (``PackedStep.to_device``)."""
    return AttentionMetadata(
        slot_mapping=longs[2],
        query_start_loc=ints[0],
        seq_lens=ints[1],
        block_tables=ints[2].view(len(seq_lens), -1),
        num_decodes=sum(1 for q in query_lens if q == 1),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
    )


def _packed(long_fields: list[list[int]], int_fields: list[list[int]], device: torch.device) -> PackedStep:
    longs, long_bounds = _aligned(long_fields, torch.int64)
    ints, int_bounds = _aligned(int_fields, torch.int32)
    return PackedStep(host_tensor(longs, torch.int64, device), host_tensor(ints, torch.int32, device),
                      long_bounds, int_bounds)


def _aligned(fields: list[list[int]], dtype: torch.dtype) -> tuple[list[int], tuple[tuple[int, int], ...]]:
    """The fields one after another, each padded to start on 16 bytes, and where each sits."""
    per_16_bytes = 16 // dtype.itemsize
    values: list[int] = []
    bounds = []
    for values_of_field in fields:
        values += [0] * (-len(values) % per_16_bytes)
        bounds.append((len(values), len(values) + len(values_of_field)))
        values += values_of_field
    return values, tuple(bounds)
