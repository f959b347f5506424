"""The whole model in this process: a thin shell over one ModelRunner."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from fastllm.config import EngineConfig
from fastllm.distributed.parallel_state import tp_size
from fastllm.engine.model_runner import ModelRunner
from fastllm.engine.pending_step import PendingStep
from fastllm.engine.scheduler import ScheduledSequence


class UniprocExecutor:
    def __init__(self, config: EngineConfig, hf_config: Any, platform: Any, loader: Any,
                 dtype: torch.dtype, structured_output: Any = None):
        if tp_size() != 1:
            raise RuntimeError(f"torch.distributed's default group has {tp_size()} ranks in this process, "
                               "so the layers would shard over it: shut the tensor-parallel LLM down "
                               "before building a single-process one")
        self.runner = ModelRunner(config, hf_config, platform, loader, dtype, structured_output)
        self.adapters = self.runner.adapters
        self.overlaps_steps = platform.overlaps_steps

    def launch(self, scheduled: list[ScheduledSequence],
               before_sampling: Optional[Callable[[], None]] = None) -> PendingStep:
        return self.runner.launch(scheduled, before_sampling)

    def bytes_per_block(self) -> int:
        return self.runner.bytes_per_block()

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.runner.allocate_kv_cache(num_blocks)

    def profile_peak_bytes(self, num_tokens: int, max_model_len: int, max_num_seqs: int) -> int:
        return self.runner.profile_peak_bytes(num_tokens, max_model_len, max_num_seqs)

    def shutdown(self) -> None:
        """Nothing to release: the runner's tensors go with the executor."""
