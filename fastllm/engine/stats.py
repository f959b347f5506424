"""What the engine reports about itself for metrics: a snapshot that is safe to read anywhere."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    """Published after every engine iteration; plain data, so it also crosses a process boundary."""

    num_requests_running: int = 0
    num_requests_waiting: int = 0
    kv_cache_usage: float = 0.0
    num_free_blocks: int = 0
    num_usable_blocks: int = 0
    num_preemptions: int = 0
    spec_num_draft_tokens: int = 0  # drafts verified so far, over every request
    spec_num_accepted_tokens: int = 0
    num_running_adapters: int = 0  # distinct adapters among the running requests
