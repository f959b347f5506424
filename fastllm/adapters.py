"""Per-request adapters: what a request names (``LoRARequest``) and what serves it (a plugin).

The core only carries an adapter's integer id from the request to the packed batch; an
``adapter_managers`` plugin owns the weights, wraps the model's layers and maps ids to the
device slots that one step reads (``ForwardContext.adapter_batch``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by name, a positive integer id unique per adapter, and its PEFT directory."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be a positive integer, got {self.lora_int_id!r}")

    @property
    def cache_salt(self) -> bytes:
        """What keys its prompt's KV blocks apart from the base model's and other adapters'."""
        return f"adapter:{self.lora_int_id}:{self.lora_name}".encode()


class AdapterManager(Protocol):
    """Built as ``cls(model, engine_config)`` once the weights are loaded; id 0 is the base model."""

    max_adapters_per_step: int

    @staticmethod
    def merge(model: torch.nn.Module, path: str) -> None:
        """Add an adapter's deltas into the loaded weights for good (``merge_lora=``)."""

    def add(self, request: LoRARequest) -> None:
        """Check and load an adapter (host copy); raise RequestError when it cannot be served."""

    def remove(self, adapter_id: int) -> bool:
        """Forget an adapter; False when it was unknown."""

    def prepare_step(self, adapter_ids: list[int], num_tokens: list[int]) -> Any:
        """Make the step's adapters resident (sequence i has ``num_tokens[i]`` tokens of adapter
        ``adapter_ids[i]``); the result is ``ForwardContext.adapter_batch``: None when no
        sequence of the step uses an adapter, else it has ``slots``, each packed token's device
        slot (-1: the base model), which a captured decode graph copies in."""

    def graph_batch(self, token_slots: torch.Tensor) -> Any:
        """The ``adapter_batch`` a decode graph is captured with: ``token_slots`` is its static
        buffer of per-token slots, which the graph runner fills before each replay."""

    def stats(self) -> dict[str, Any]:
        """Resident and known adapters, for the metrics."""
