"""What the engine drives to run the model: the runner's surface, wherever the model lives."""

from __future__ import annotations

from typing import Optional, Protocol

from fastllm.sampling.sampler import GrammarMask
from fastllm.worker.pending_step import PendingStep
from fastllm.worker.scheduler_output import SchedulerOutput


class Executor(Protocol):
    """One model, in this process or spread over tensor-parallel processes.

    Rank 0 schedules and samples; every rank holds the same number of KV blocks, so the
    engine's block pool describes all of them.
    """

    overlaps_steps: bool
    """Whether a step returns before the device has run it, so that the engine gains by
    preparing the next step before it reads this one's tokens."""

    def execute_model(self, scheduler_output: SchedulerOutput) -> None:
        """Queue one step's forward pass and the logits it samples from."""
        ...

    def sample_tokens(self, grammar: Optional[GrammarMask] = None) -> PendingStep:
        """Queue the sampling of the step ``execute_model`` queued; its ``results()`` are the new
        tokens (and logprobs) keyed by ``seq_id``. The engine may read the previous step
        between the two calls: the sampling rows see the tokens read."""
        ...

    def bytes_per_block(self) -> int:
        """KV-cache bytes one block takes on one rank."""
        ...

    def allocate_kv_cache(self, num_blocks: int, step_tokens: int) -> None:
        """The serving cache of ``num_blocks``, with the kernels warmed up for steps of up to
        ``step_tokens`` tokens (``max_num_batched_tokens``)."""
        ...

    def profile_peak_bytes(self, num_tokens: int, max_model_len: int, max_num_seqs: int) -> int:
        """Peak activation bytes of the largest batch, for ``Platform.kv_cache_budget``."""
        ...

    def profile(self, start: bool) -> None:
        """Start or stop recording every rank's work (``fastllm.platforms.step_profiler``)."""
        ...

    def shutdown(self) -> None:
        """Release worker processes, if any; the executor is unusable afterwards."""
        ...
