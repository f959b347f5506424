"""Executors: run the model in this process, or over one process per tensor-parallel rank."""

from __future__ import annotations

from typing import Any

import torch

from fastllm.config import EngineConfig
from fastllm.executor.interface import Executor
from fastllm.executor.multiproc import MultiprocExecutor
from fastllm.executor.uniproc import UniprocExecutor
from fastllm.executor.worker_group import WorkerError

__all__ = ["Executor", "MultiprocExecutor", "UniprocExecutor", "WorkerError", "create_executor"]


def create_executor(config: EngineConfig, hf_config: Any, platform: Any, loader: Any, dtype: torch.dtype) -> Executor:
    """One process for one rank; else this process is rank 0 of tensor x pipeline parallel ones,
    local processes or Ray actors (``distributed_executor_backend``)."""
    if config.tensor_parallel_size * config.pipeline_parallel_size == 1:
        cls: type = UniprocExecutor
    elif config.distributed_executor_backend == "ray":
        from fastllm.executor.ray_executor import RayExecutor  # Ray is an optional extra
        cls = RayExecutor
    else:
        cls = MultiprocExecutor
    return cls(config, hf_config, platform, loader, dtype)
