"""The LoRA layer's three paths (Triton kernels over token groups, per-token Triton kernels as a
captured graph runs them, per-adapter torch) against the plain math."""

from __future__ import annotations

import pytest
import torch

import fastllm_kernels
from fastllm.attention.metadata import ForwardContext, forward_context
from fastllm.layers.fused import use_kernels
from fastllm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear
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


def _dequantized(layer) -> torch.Tensor:
    """The float weight a quantized layer stands for: codes times their per-row scale."""
    codes, scale = (layer.qweight, layer.scales) if hasattr(layer, "qweight") else (layer.weight, layer.weight_scale)
    return codes.float() * scale.float()[:, None]


@pytest.mark.parametrize("method", ["int8", "fp8"])
@pytest.mark.parametrize("path", ["torch", "groups"])
def test_adapters_on_a_quantized_layer_add_to_its_dequantized_weights(method, path):
    """int8 keeps activations in float: the output is the dequantized weight's plus the deltas.
    fp8 also rounds the activations, so there its own output plus the deltas, and close to the
    dequantized weight's."""
    quant = pytest.importorskip(f"fastllm_quant.{method}")
    kernels = None if path == "torch" else fastllm_kernels
    torch.manual_seed(0)
    base = MergedColumnParallelLinear(64, [48, 48])  # gate and up
    base.weight.data.normal_()
    quantized = quant.WeightOnlyInt8Linear.from_float(base) if method == "int8" else quant.Fp8Linear.from_float(base)
    with use_kernels(kernels):
        layer = LoRALinear(quantized, quantized.shard_slices, num_slots=2, max_rank=8, dtype=torch.float32,
                           device=torch.device("cpu"))
    deltas = {0: ModuleDelta(torch.randn(8, 64), torch.randn(48, 8), 0.5),
              1: ModuleDelta(torch.randn(5, 64), torch.randn(48, 5), 0.5)}
    layer.set_slot(1, deltas)
    x = torch.randn(4, 64)
    slots = [1, -1, 1, 1]
    with forward_context(ForwardContext(None, [], None, LoRABatch.of(slots, torch.device("cpu")))):
        y = layer(x)

    delta = torch.zeros(4, 96)
    for token, slot in enumerate(slots):
        if slot == 1:
            delta[token] = torch.cat([d.scaling * (x[token] @ d.a.T) @ d.b.T for d in deltas.values()])
    dequantized = x @ _dequantized(quantized).T
    if method == "int8":
        assert torch.allclose(y, dequantized + delta, rtol=1e-4, atol=1e-3)
    else:
        assert torch.allclose(y, quantized(x) + delta, rtol=1e-4, atol=1e-3)
        assert (y - dequantized - delta).norm() < 0.05 * dequantized.norm()
    assert delta.norm() > 0.1 * dequantized.norm()
