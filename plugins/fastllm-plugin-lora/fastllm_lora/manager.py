"""Which adapters the engine knows, which sit on the host, and which fill the device slots.

Host copies form an LRU of ``max_cpu_loras``; the ``max_loras`` device slots an LRU of their own,
refilled from the host (or from the adapter's directory again) when a step needs an adapter
that is not resident. The scheduler never puts more distinct adapters in a step than slots.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional

import torch
import torch.nn as nn

from fastllm.adapters import LoRARequest
from fastllm.config import EngineConfig
from fastllm.engine.input_processor import RequestError
from fastllm_lora.checkpoint import LoRAAdapter, read_adapter
from fastllm_lora.layer import LoRABatch, LoRALinear
from fastllm_lora.merge import merge_into_model
from fastllm_lora.targets import projection_shapes, projections, shard_slices


class LoRAManager:
    """The ``adapter_managers: lora`` plugin (``fastllm.adapters.AdapterManager``)."""

    merge = staticmethod(merge_into_model)

    def __init__(self, model: nn.Module, config: EngineConfig):
        self.max_rank = config.max_lora_rank
        self.max_adapters_per_step = config.max_loras
        self.max_host = config.max_cpu_loras or config.max_loras
        reference = model.get_submodule("model.embed_tokens").weight
        self.device = reference.device
        self.known: dict[int, LoRARequest] = {}
        self.host: OrderedDict[int, LoRAAdapter] = OrderedDict()
        self.slots: OrderedDict[int, int] = OrderedDict()  # adapter id -> device slot, least recent first
        self.shapes = projection_shapes(model)  # PEFT module -> (input, output) features
        self.layers: dict[str, tuple[LoRALinear, dict[object, str]]] = {}  # layer -> (wrapper, shard -> PEFT)
        for peft_name, (layer_name, shard) in projections(model).items():
            if layer_name not in self.layers:
                base = model.get_submodule(layer_name)
                wrapper = LoRALinear(base, shard_slices(base), config.max_loras, self.max_rank,
                                     reference.dtype, self.device)
                parent, _, leaf = layer_name.rpartition(".")
                setattr(model.get_submodule(parent), leaf, wrapper)
                self.layers[layer_name] = (wrapper, {})
            wrapper, names = self.layers[layer_name]
            names[shard] = peft_name

    # ---- requests -----------------------------------------------------------------------------
    def add(self, request: LoRARequest) -> None:
        known = self.known.get(request.lora_int_id)
        if known is not None and known != request:
            raise RequestError(f"LoRA id {request.lora_int_id} already names adapter {known.lora_name!r}")
        if request.lora_int_id in self.host:
            self.host.move_to_end(request.lora_int_id)
        elif request.lora_int_id not in self.slots:
            self._keep_on_host(request.lora_int_id, read_adapter(request.lora_path, self.max_rank, self.shapes))
        self.known[request.lora_int_id] = request

    def remove(self, adapter_id: int) -> bool:
        """Forget an adapter; the engine calls it only once no request of the adapter is left."""
        self.host.pop(adapter_id, None)
        self.slots.pop(adapter_id, None)
        return self.known.pop(adapter_id, None) is not None

    def stats(self) -> dict[str, Any]:
        return {"resident": [self.known[i].lora_name for i in self.slots if i in self.known],
                "known": [request.lora_name for request in self.known.values()]}

    # ---- one step ------------------------------------------------------------------------------
    def prepare_step(self, adapter_ids: list[int], num_tokens: list[int]) -> Optional[LoRABatch]:
        if not any(adapter_ids):
            return None
        step = set(adapter_ids) - {0}
        slot_of = {0: -1, **{adapter_id: self._activate(adapter_id, step) for adapter_id in step}}
        per_token: list[int] = []
        for adapter_id, count in zip(adapter_ids, num_tokens):
            per_token += [slot_of[adapter_id]] * count
        return LoRABatch.of(per_token, self.device)

    def graph_batch(self, token_slots: torch.Tensor) -> LoRABatch:
        """What a captured decode graph reads: ``token_slots`` is the graph runner's static buffer."""
        return LoRABatch(token_slots)

    def _activate(self, adapter_id: int, step: set[int]) -> int:
        """The device slot of ``adapter_id``, loading it over the least recent adapter not in ``step``."""
        if adapter_id in self.slots:
            self.slots.move_to_end(adapter_id)
            return self.slots[adapter_id]
        if len(self.slots) < self.max_adapters_per_step:
            slot = min(set(range(self.max_adapters_per_step)) - set(self.slots.values()))
        else:
            slot = self.slots.pop(next(i for i in self.slots if i not in step))
        adapter = self.host.get(adapter_id)
        if adapter is None:
            request = self.known[adapter_id]
            adapter = read_adapter(request.lora_path, self.max_rank, self.shapes)
            self._keep_on_host(adapter_id, adapter)
        for wrapper, names in self.layers.values():
            wrapper.set_slot(slot, {shard: adapter.modules[name] for shard, name in names.items()
                                    if name in adapter.modules})
        self.slots[adapter_id] = slot
        return slot

    def _keep_on_host(self, adapter_id: int, adapter: LoRAAdapter) -> None:
        self.host[adapter_id] = adapter
        while len(self.host) > self.max_host:
            self.host.popitem(last=False)
