"""Tensor parallelism over local processes: this process is rank 0 and drives ranks 1..N-1."""

from __future__ import annotations

import weakref
from typing import Any, Optional

import torch

from fastllm.config import EngineConfig
from fastllm.distributed.parallel_state import broadcast_input_ids
from fastllm.distributed.process_group import free_tcp_port
from fastllm.executor.mirrored_adapters import MirroredAdapters
from fastllm.executor.step_wire import encode_forward
from fastllm.executor.worker import WorkerSpec
from fastllm.executor.worker_group import WorkerGroup
from fastllm.multimodal.inputs import StepMultimodal
from fastllm.sampling.sampler import GrammarMask
from fastllm.worker.input_batch import ModelInputs
from fastllm.worker.model_runner import ModelRunner
from fastllm.worker.pending_step import PendingStep
from fastllm.worker.scheduler_output import SchedulerOutput


class DriverRunner(ModelRunner):
    """Rank 0's runner: announces each collective-bearing call to the workers, then makes it.

    During a step only ``forward_step`` and ``compute_logits`` (or ``compute_greedy``) reach the
    layers' collectives, so the workers replay exactly those, with the same arguments, and
    sampling stays here.
    (``profile_peak_bytes`` calls the model directly: workers run their own profile.)
    """

    def __init__(self, workers: WorkerGroup, *args: Any):
        self.workers = workers
        super().__init__(*args)
        if self.adapters is not None:
            self.adapters = MirroredAdapters(self.adapters, workers)

    def forward_step(self, inputs: ModelInputs, multimodal: Optional[StepMultimodal] = None) -> torch.Tensor:
        """The workers get the step from host memory (no wait for the device) and its tokens by broadcast."""
        self.workers.call("forward", encode_forward(inputs.host, multimodal))
        return self.forward(broadcast_input_ids(inputs.input_ids), inputs.positions, inputs.attn_metadata,
                            multimodal)

    def compute_logits(self, hidden: torch.Tensor, rows: list[int] | slice) -> torch.Tensor:
        self.workers.call("compute_logits", rows)
        return super().compute_logits(hidden, rows)

    def compute_greedy(self, hidden: torch.Tensor, rows: list[int] | slice) -> tuple[torch.Tensor, torch.Tensor]:
        self.workers.call("compute_greedy", rows)
        return super().compute_greedy(hidden, rows)


class MultiprocExecutor:
    """One spawned process per extra rank; rank ``r`` uses device ``r`` of the platform.

    Workers stop when the executor is shut down, garbage-collected, or the interpreter exits.
    """

    def __init__(self, config: EngineConfig, hf_config: Any, platform: Any, loader: Any, dtype: torch.dtype):
        _check_heads(hf_config, config.tensor_parallel_size)
        self.platform, self.config = platform, config
        self.overlaps_steps = platform.overlaps_steps  # sampled tokens reach workers device to device
        self.workers = self._start_workers(hf_config, loader, dtype)
        self._runners: list[ModelRunner] = []  # filled once built: the finalizer must not hold self
        self._finalizer = weakref.finalize(self, _shut_down, self.workers, self._runners)
        try:
            self.runner = DriverRunner(self.workers, config, hf_config, platform, loader, dtype)
            self._runners.append(self.runner)
            self.adapters = self.runner.adapters
            self.workers.gather()  # every rank has built its shard
        except BaseException:
            self.shutdown()
            raise

    def _start_workers(self, hf_config: Any, loader: Any, dtype: torch.dtype) -> WorkerGroup:
        """Ranks 1..N-1 as processes of this host; rank ``r`` uses device ``r``."""
        world = self.config.tensor_parallel_size * self.config.pipeline_parallel_size
        _check_device_count(self.platform.device, world)
        return WorkerGroup(self._worker_specs(f"tcp://127.0.0.1:{free_tcp_port()}", hf_config, loader, dtype),
                           self.platform.device)

    def _worker_specs(self, init_method: str, hf_config: Any, loader: Any, dtype: torch.dtype,
                      device_index: Optional[int] = None) -> list[WorkerSpec]:
        world = self.config.tensor_parallel_size * self.config.pipeline_parallel_size
        return [WorkerSpec(rank, world, init_method, self.platform.dist_backend, self.platform.name,
                           self.platform.device.type, self.config, hf_config, loader, dtype, device_index)
                for rank in range(1, world)]

    def execute_model(self, scheduler_output: SchedulerOutput) -> None:
        try:
            self.runner.execute_model(scheduler_output)
        except Exception:
            self.workers.check()  # a dead worker explains a failed collective better than gloo does
            raise

    def sample_tokens(self, grammar: Optional[GrammarMask] = None) -> PendingStep:
        return self.runner.sample_tokens(grammar)  # no collective: rank 0 samples for everyone

    def bytes_per_block(self) -> int:
        return self.runner.bytes_per_block()  # every rank holds the same number of KV heads

    def allocate_kv_cache(self, num_blocks: int, step_tokens: int) -> None:
        self.workers.request("allocate_kv_cache", num_blocks, step_tokens)
        self.runner.allocate_kv_cache(num_blocks, step_tokens)
        self.workers.gather()

    def profile_peak_bytes(self, num_tokens: int, max_model_len: int, max_num_seqs: int) -> int:
        """Rank 0's peak, raised by how far the tightest rank's KV budget falls short of rank 0's.

        The engine turns this peak into rank 0's budget, which then equals the smallest
        budget of all ranks: every rank can hold the block count rank 0 picks from it.
        """
        args = (num_tokens, max_model_len, max_num_seqs)
        self.workers.request("kv_cache_budget", *args)
        peak = 0

        def profile() -> int:
            nonlocal peak
            peak = self.runner.profile_peak_bytes(*args)
            return peak

        own = self.platform.kv_cache_budget(profile, self.config)
        budgets = self.workers.gather()
        return peak + own - min(own, *budgets)

    def profile(self, start: bool) -> None:
        """Rank 0 first (it fails where no directory is set), then every worker, into rank 0's directory."""
        profiler = self.runner.profiler
        profiler.switch(start)
        self.workers.request("profile", start, profiler.directory)
        self.workers.gather()

    def shutdown(self) -> None:
        self._finalizer()


def _shut_down(workers: WorkerGroup, runners: list[ModelRunner]) -> None:
    """Captured CUDA graphs go before the process group does (see ``destroy_tensor_parallel``)."""
    for runner in runners:
        runner.graphs = None
    workers.shutdown()


def _check_heads(hf_config: Any, world: int) -> None:
    """Fail before spawning anything; the layers check every split again as they are built."""
    for field in ("num_attention_heads", "num_key_value_heads"):
        count = getattr(hf_config, field, None)
        if count and count % world:
            raise ValueError(f"{count} {field.replace('num_', '').replace('_', ' ')} cannot be split "
                             f"over tensor_parallel_size={world}")


def _check_device_count(device: torch.device, world: int) -> None:
    if device.type == "cpu":
        return
    count = torch.get_device_module(device.type).device_count()
    if count < world:
        raise ValueError(f"tensor_parallel_size x pipeline_parallel_size={world} needs {world} {device.type} devices "
                         f"(one per rank); {count} are visible")
