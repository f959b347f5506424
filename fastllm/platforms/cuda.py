"""NVIDIA GPUs: checkpoint dtype (bf16/fp16), Triton attention, KV budget from memory profiling."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Callable, Iterator, Optional

import torch

from fastllm.platforms.cuda_graphs import DecodeGraphs
from fastllm.platforms.interface import DTYPES, fastllm_kernels

logger = logging.getLogger(__name__)


class CudaPlatform:
    name = "cuda"
    dist_backend = "nccl"
    default_attention_backend = "triton"
    priority = 10
    overlaps_steps = True
    warms_up_kernels = True
    measures_rooflines = True
    triton_rounds_fp8_exactly = True

    def __init__(self) -> None:
        self.device = torch.device("cuda", torch.cuda.current_device())

    @classmethod
    def is_available(cls) -> bool:
        return torch.cuda.is_available()

    def resolve_dtype(self, requested: str, checkpoint_dtype: torch.dtype | None) -> torch.dtype:
        if requested != "auto":
            return DTYPES[requested]
        if checkpoint_dtype in (torch.float16, torch.bfloat16):
            return checkpoint_dtype
        return torch.bfloat16

    def kv_cache_budget(self, profile_peak: Callable[[], int], engine_config) -> int:
        """What ``gpu_memory_utilization`` of the card leaves after weights and the peak batch."""
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        peak = profile_peak()
        free, total = torch.cuda.mem_get_info()
        used_by_others = total - free - torch.cuda.memory_reserved()
        budget = int(total * engine_config.gpu_memory_utilization) - peak - max(used_by_others, 0)
        logger.info("GPU memory: total %.1f GiB, peak in use %.1f GiB, KV budget %.1f GiB",
                    total / 2**30, peak / 2**30, budget / 2**30)
        return budget

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def seconds_per_call(self, fn: Callable[[], object], reps: int) -> float:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(self.device)
        begin.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1000 / reps

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def visible_devices(self, count: int) -> list[str]:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        if len(devices) < count:
            raise ValueError(f"data_parallel_size x tensor_parallel_size x pipeline_parallel_size needs {count} "
                             f"GPUs; {len(devices)} are visible")
        return devices

    @contextmanager
    def only_devices(self, devices: list[str]) -> Iterator[None]:
        previous = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        try:
            yield
        finally:
            if previous is None:
                del os.environ["CUDA_VISIBLE_DEVICES"]
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = previous

    def kernels(self) -> Optional[ModuleType]:
        return fastllm_kernels(default_on=True)

    def peak_memory_bytes(self) -> int:
        return torch.cuda.max_memory_allocated()

    def decode_graphs(self, forward: Callable[..., torch.Tensor], max_batch: int, max_blocks_per_seq: int,
                      max_model_len: int, max_query_len: int, adapters: Any = None) -> DecodeGraphs:
        graphs = DecodeGraphs(forward, max_batch, max_blocks_per_seq, max_model_len, self.device, max_query_len,
                              adapters)
        graphs.capture()
        return graphs
