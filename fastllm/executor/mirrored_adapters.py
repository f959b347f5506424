"""Adapters under tensor parallelism: rank 0's adapter manager, each of its changes repeated on
every worker, so that all ranks' managers fill the same slots in the same order, each with its
own shards of the adapters' weights."""

from __future__ import annotations

from typing import Any

from fastllm.adapters import AdapterManager, LoRARequest
from fastllm.executor.worker_group import WorkerGroup


class MirroredAdapters:
    """``AdapterManager``'s interface over rank 0's manager and the workers' (``Worker.adapter_call``)."""

    def __init__(self, adapters: AdapterManager, workers: WorkerGroup):
        self.adapters, self.workers = adapters, workers
        self.max_adapters_per_step = adapters.max_adapters_per_step

    def add(self, request: LoRARequest) -> None:
        self.adapters.add(request)  # checks it first: a bad adapter never reaches the workers
        self.workers.call("adapter_call", "add", request)

    def remove(self, adapter_id: int) -> bool:
        self.workers.call("adapter_call", "remove", adapter_id)
        return self.adapters.remove(adapter_id)

    def prepare_step(self, adapter_ids: list[int], num_tokens: list[int]) -> Any:
        self.workers.call("adapter_call", "prepare_step", adapter_ids, num_tokens)
        return self.adapters.prepare_step(adapter_ids, num_tokens)

    def graph_batch(self, token_slots: Any) -> Any:
        return self.adapters.graph_batch(token_slots)

    def stats(self) -> dict[str, Any]:
        return self.adapters.stats()
