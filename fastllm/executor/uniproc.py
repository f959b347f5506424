"""The whole model in this process: a thin shell over one ModelRunner."""

from __future__ import annotations

from typing import Any, Optional

import torch

from fastllm.config import EngineConfig
from fastllm.distributed.parallel_state import tp_size
from fastllm.sampling.sampler import GrammarMask
from fastllm.worker.model_runner import ModelRunner
from fastllm.worker.pending_step import PendingStep
from fastllm.worker.scheduler_output import SchedulerOutput


class UniprocExecutor:
    def __init__(self, config: EngineConfig, hf_config: Any, platform: Any, loader: Any, dtype: torch.dtype):
        if tp_size() != 1:
            raise RuntimeError(f"torch.distributed's default group has {tp_size()} ranks in this process, "
                               "so the layers would shard over it: shut the tensor-parallel LLM down "
                               "before building a single-process one")
        self.runner = ModelRunner(config, hf_config, platform, loader, dtype)
        self.adapters = self.runner.adapters
        self.overlaps_steps = platform.overlaps_steps

    def execute_model(self, scheduler_output: SchedulerOutput) -> None:
        self.runner.execute_model(scheduler_output)

    def idle_step(self) -> None:
        self.runner.idle_step()

    def sample_tokens(self, grammar: Optional[GrammarMask] = None) -> PendingStep:
        return self.runner.sample_tokens(grammar)

    def bytes_per_block(self) -> int:
        return self.runner.bytes_per_block()

    def allocate_kv_cache(self, num_blocks: int, step_tokens: int) -> None:
        self.runner.allocate_kv_cache(num_blocks, step_tokens)

    def profile_peak_bytes(self, num_tokens: int, max_model_len: int, max_num_seqs: int) -> int:
        return self.runner.profile_peak_bytes(num_tokens, max_model_len, max_num_seqs)

    def profile(self, start: bool) -> None:
        self.runner.profiler.switch(start)

    def shutdown(self) -> None:
        """Nothing to release: the runner's tensors go with the executor."""
