"""The LoRA layer's three paths (Triton kernels over token groups, per-token Triton kernels as a
captured graph runs them, per-adapter torch) against the plain math."""

from __future__ import annotations

import pytest
import torch

import fastllm_kernels
from fastllm.attention.metadata import ForwardContext, forward_context
from fastllm.layers.fused import use_kernels
from fastllm.layers.linear import QKVParallelLinear
from fastllm_lora.checkpoint import ModuleDelta
from fastllm_lora.layer import LoRABatch, LoRALinear


@pytest.mark.parametrize("path", ["torch", "groups", "graph"])
def test_fused_qkv_layer_adds_each_tokens_own_adapter(path):
    kernels = None if path == "torch" else fastllm_kernels
    torch.manual_seed(0)
    base = QKVParallelLinear(32, 8, 4, 2)  # q 32, k 16, v 16 outputs
    base.weight.data.normal_()
    with use_kernels(kernels):
        layer = LoRALinear(base, base.shard_slices(), num_slots=2, max_rank=4, dtype=torch.float32,
                           device=torch.device("cpu"))
    # slot 0: q (rank 4, scaling 2) and v (rank 2, scaling 0.5); slot 1: k only (rank 3, scaling 1)
    deltas = [{"q": ModuleDelta(torch.randn(4, 32), torch.randn(32, 4), 2.0),
               "v": ModuleDelta(torch.randn(2, 32), torch.randn(16, 2), 0.5)},
              {"k": ModuleDelta(torch.randn(3, 32), torch.randn(16, 3), 1.0)}]
    for slot, delta in enumerate(deltas):
        layer.set_slot(slot, delta)
    x = torch.randn(5, 32)
    slots = [1, -1, 0, 0, 1]
    batch = LoRABatch.of(slots, torch.device("cpu"))
    if path == "graph":
        batch = LoRABatch(batch.slots)  # no host copy: slots only on the device

    with forward_context(ForwardContext(None, [], None, batch)):
        y = layer(x)

    expected = x @ base.weight.T
    offsets = base.shard_slices()
    for token, slot in enumerate(slots):
        for shard, delta in (deltas[slot] if slot >= 0 else {}).items():
            offset, size = offsets[shard]
            expected[token, offset:offset + size] += delta.scaling * (x[token] @ delta.a.T) @ delta.b.T
    assert torch.allclose(y, expected, rtol=1e-4, atol=1e-4)
