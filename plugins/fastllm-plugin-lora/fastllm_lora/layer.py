"""A linear layer plus the LoRA deltas of the adapters in its device slots.

Fused layers (qkv, gate_up) hold one rank block per projection: A stacks the projections'
A matrices, and B is block-diagonal, each projection's B in its rows of the fused output and
its own rank columns. So a mixed batch costs two launches a layer whatever the adapters.

Under tensor parallelism A and B are sharded like the layer: a column-parallel layer keeps its
rows of B (its outputs), a row-parallel one its columns of A (its inputs); there each rank's
``x A^T`` is a partial sum, all-reduced (a few numbers a token) before the expand.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Optional

import torch
import torch.nn as nn

from fastllm.attention.metadata import get_forward_context
from fastllm.distributed.parallel_state import all_reduce, tp_rank
from fastllm.layers.fused import current_kernels
from fastllm.platforms.transfer import to_device
from fastllm_lora.checkpoint import ModuleDelta


@dataclass
class LoRABatch:
    """One step's adapters: each token's slot on the device (-1: base model) and, for a step run
    eagerly, the same on the host, from which the kernels' token groups are built on first use
    (``fastllm_kernels.lora.lora_tiles``). A captured decode graph's batch has no host copy: its
    slots are a static buffer the graph runner fills before each replay."""

    slots: torch.Tensor  # [num_tokens] int32
    host_slots: Optional[list[int]] = None
    _groups: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    @classmethod
    def of(cls, slots: list[int], device: torch.device) -> "LoRABatch":
        return cls(to_device(slots, torch.int32, device), slots)

    def groups(self, kernels: ModuleType) -> tuple[torch.Tensor, torch.Tensor]:
        """``(order, tiles)`` on the device, built once a step (every layer reads the same)."""
        if self._groups is None:
            order, tiles = kernels.lora_tiles(self.host_slots)
            device = self.slots.device
            self._groups = (to_device(order, torch.int32, device), to_device(tiles, torch.int32, device))
        return self._groups


class LoRALinear(nn.Module):
    """Wraps ``base`` (any fastllm linear, quantized ones included); one tensor-parallel rank."""

    def __init__(self, base: nn.Module, slices: dict[object, tuple[int, int]], num_slots: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.base = base
        self.slices = slices
        self.max_rank = max_rank
        ranks = len(slices) * max_rank
        self.register_buffer("lora_a", torch.zeros(num_slots, ranks, base.input_size, dtype=dtype, device=device))
        self.register_buffer("lora_b", torch.zeros(num_slots, base.output_size, ranks, dtype=dtype, device=device))
        self.register_buffer("scale", torch.zeros(num_slots, dtype=torch.float32, device=device))
        self.kernels = current_kernels()
        self.tp_dim = base.tp_dim
        self.reduce_results = base.reduce_results

    def set_slot(self, slot: int, deltas: dict[object, ModuleDelta]) -> None:
        """Write one adapter's deltas (by shard id, whole projections) into ``slot``, this rank's
        shard of them, in place (captured graphs read these tensors); projections it lacks stay zero."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        scaling = next(iter(deltas.values())).scaling if deltas else 0.0
        for block, (shard, (offset, size)) in enumerate(self.slices.items()):
            delta = deltas.get(shard)
            if delta is None:
                continue
            ranks = slice(block * self.max_rank, block * self.max_rank + delta.rank)
            a, b = delta.a, delta.b if delta.scaling == scaling else delta.b.float() * (delta.scaling / scaling)
            if self.tp_dim == 0:
                b = b.narrow(0, tp_rank() * size, size)
            elif self.tp_dim == 1:
                a = a.narrow(1, tp_rank() * self.base.input_size, self.base.input_size)
            self.lora_a[slot, ranks].copy_(a)
            self.lora_b[slot, offset:offset + size, ranks].copy_(b)
        self.scale[slot] = scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        batch: Optional[LoRABatch] = get_forward_context().adapter_batch
        if batch is None:
            return y
        rows, out = x.reshape(-1, x.shape[-1]), y.view(-1, y.shape[-1])
        kernels = self.kernels
        if kernels is None:
            xa = self._shrink_torch(rows, batch.slots)
            self._expand_torch(out, self._reduce(xa), batch.slots)
        elif batch.host_slots is None:  # inside a captured graph
            xa = kernels.lora_shrink_tokens(rows, self.lora_a, batch.slots)
            kernels.lora_expand_tokens(out, self._reduce(xa), self.lora_b, self.scale, batch.slots)
        else:
            order, tiles = batch.groups(kernels)
            xa = kernels.lora_shrink(rows, self.lora_a, order, tiles)
            kernels.lora_expand(out, self._reduce(xa), self.lora_b, self.scale, order, tiles)
        return y

    def _reduce(self, xa: torch.Tensor) -> torch.Tensor:
        """A row-parallel rank's ``x A^T`` covers its inputs only: the sum over ranks is the whole.
        Where the base layer leaves its sum to a later layer, that sum covers ``(x A^T) B^T`` too."""
        return all_reduce(xa) if self.tp_dim == 1 and self.reduce_results else xa

    def _shrink_torch(self, rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """The per-adapter reference: each adapter's tokens through its own A (zero for the base model's)."""
        xa = rows.new_zeros(rows.shape[0], self.lora_a.shape[1])
        for slot in slots.unique().tolist():
            if slot >= 0:
                picked = (slots == slot).nonzero().squeeze(1)
                xa[picked] = rows[picked] @ self.lora_a[slot].T
        return xa

    def _expand_torch(self, out: torch.Tensor, xa: torch.Tensor, slots: torch.Tensor) -> None:
        for slot in slots.unique().tolist():
            if slot >= 0:
                picked = (slots == slot).nonzero().squeeze(1)
                out[picked] += (xa[picked] @ self.lora_b[slot].T) * self.scale[slot].to(out.dtype)
