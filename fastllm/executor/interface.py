"""What the engine drives to run the model: the runner's surface, wherever the model lives."""

from __future__ import annotations

from typing import Callable, Optional, Protocol

from fastllm.engine.pending_step import PendingStep
from fastllm.engine.scheduler import ScheduledSequence


class Executor(Protocol):
    """One model, in this process or spread over tensor-parallel processes.

    Rank 0 schedules and samples; every rank holds the same number of KV blocks, so the
    engine's block pool describes all of them.
    """

    overlaps_steps: bool
    """Whether ``launch`` returns before the device has run the step, so that the engine gains
    by preparing the next step before it reads this one's tokens."""

    def launch(self, scheduled: list[ScheduledSequence],
               before_sampling: Optional[Callable[[], None]] = None) -> PendingStep:
        """Queue one step; its ``results()`` are the new tokens (and logprobs) keyed by ``seq_id``.

        ``before_sampling`` is called once, after the step's forward pass is queued and before
        its sampling rows are built from the sequences' host state."""
        ...

    def bytes_per_block(self) -> int:
        """KV-cache bytes one block takes on one rank."""
        ...

    def allocate_kv_cache(self, num_blocks: int) -> None:
        ...

    def profile_peak_bytes(self, num_tokens: int, max_model_len: int, max_num_seqs: int) -> int:
        """Peak activation bytes of the largest batch, for ``Platform.kv_cache_budget``."""
        ...

    def shutdown(self) -> None:
        """Release worker processes, if any; the executor is unusable afterwards."""
        ...
