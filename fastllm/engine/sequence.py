"""One generated sequence: its tokens, how many of them sit in the KV cache, and its blocks."""

from __future__ import annotations

import enum
import itertools
import random
from dataclasses import dataclass, field
from typing import Any, Optional

from fastllm.outputs import Logprobs
from fastllm.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_seq_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    """A request's prompt plus one of its ``n`` samples.

    ``num_computed_tokens`` counts tokens whose keys and values are in the cache (or are
    being written by a step in flight); the scheduler advances it, a preemption resets it to
    zero (recompute). ``num_pending_tokens`` counts tokens a step in flight has sampled on the
    device that the host has not read yet: they follow ``output_token_ids``.
    """

    request_id: str
    index: int
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int]
    max_model_len: int
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_pending_tokens: int = 0
    num_cached_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    draft_token_ids: list[int] = field(default_factory=list)
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    seed: int = field(default_factory=lambda: random.getrandbits(62))  # the sampler's, see NewSequence
    in_runner: bool = False  # the runner holds its state (from its first step until it finishes)
    num_runner_blocks: int = 0  # how many of ``block_table`` the runner has been sent
    output_logprobs: list[Logprobs] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    prompt_logprobs: list[Optional[Logprobs]] = field(default_factory=list)
    finish_reason: Optional[str] = None
    stop_reason: Optional[int | str] = None
    structured_state: Any = None
    spec_state: Any = None
    adapter_id: int = 0  # 0: the base model; else the id an adapter manager serves
    cache_salt: bytes = b""  # keys its prefix-cache blocks apart from other adapters'
    multimodal: Any = None  # fastllm.multimodal.inputs.MultimodalInputs of an image/video prompt

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def max_num_tokens(self) -> int:
        """Its length if it runs to ``max_tokens`` (or ``max_model_len``, whichever comes first)."""
        max_tokens = self.sampling_params.max_tokens
        if max_tokens is None:
            return self.max_model_len
        return min(self.num_prompt_tokens + max_tokens, self.max_model_len)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def needs_host_tokens(self) -> bool:
        """Its next logits depend on the values of its latest tokens (grammar, penalties, bad
        words, min_tokens still counting), so it cannot decode a token the host has not read."""
        params = self.sampling_params
        return (self.structured_state is not None or params.needs_penalties or bool(self.bad_words_token_ids)
                or len(self.output_token_ids) < params.min_tokens)

    @property
    def finishes_with_pending(self) -> bool:
        """Its pending tokens reach max_tokens or max_model_len: scheduling more would be wasted."""
        pending = self.num_pending_tokens
        if not pending:
            return False
        max_tokens = self.sampling_params.max_tokens
        num_output = len(self.output_token_ids) + pending
        return ((max_tokens is not None and num_output >= max_tokens)
                or len(self.prompt_token_ids) + num_output >= self.max_model_len)

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)

    def finish(self, reason: str, stop_reason: Optional[int | str] = None) -> None:
        """Mark it finished; why is decided by ``fastllm.engine.output_processor`` alone."""
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
