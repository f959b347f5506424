"""One step as the scheduler decided it, in plain data: ids, token counts and block ids.

This is all that crosses from the scheduler to the runner (picklable, no live objects), so
the runner could live in another process or on another host. The runner keeps each
sequence's own state (``fastllm.worker.input_batch.InputBatch``) and updates it from these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastllm.sampling_params import SamplingParams


@dataclass
class NewSequence:
    """A sequence the runner has not seen: what it needs to feed and sample it from now on.

    Its block ids and computed count come with every scheduled sequence's (``SchedulerOutput``).
    """

    seq_id: int
    request_id: str
    index: int  # which of the request's ``n`` samples
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    seed: int  # the sampler's Philox key
    eos_token_ids: frozenset[int] = frozenset()
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    adapter_id: int = 0
    multimodal: Any = None  # fastllm.multimodal.inputs.MultimodalInputs of an image/video prompt


@dataclass
class SchedulerOutput:
    """The step's sequences in the scheduler's order, with parallel lists of their counts.

    A preempted sequence keeps its runner state (tokens); the step that resumes it
    lists it in ``resumed_seq_ids``, and its ``new_block_ids`` are then its whole new table (so
    a step lost to an error leaves no stale table behind). Finished sequences are forgotten.
    Sampled tokens are not sent: the runner learns them when their step is read.
    """

    seq_ids: list[int] = field(default_factory=list)
    num_scheduled_tokens: list[int] = field(default_factory=list)  # drafts included
    num_computed_tokens: list[int] = field(default_factory=list)  # before this step
    new_seqs: list[NewSequence] = field(default_factory=list)
    new_block_ids: dict[int, list[int]] = field(default_factory=dict)  # appended since the runner's last view
    draft_token_ids: dict[int, list[int]] = field(default_factory=dict)  # the sequences verifying drafts
    resumed_seq_ids: list[int] = field(default_factory=list)  # back from a preemption
    finished_seq_ids: list[int] = field(default_factory=list)  # finished or aborted since the last step
