"""Where PEFT's per-projection names land in fastllm's (possibly fused) linear layers."""

from __future__ import annotations

import torch.nn as nn

from fastllm.distributed.parallel_state import tp_size
from fastllm.layers.linear import LinearBase
from fastllm.quantization.linear import QuantizedLinear


def projections(model: nn.Module) -> dict[str, tuple[str, object]]:
    """PEFT module name -> (the model's linear layer that computes it, its shard id there).

    The model fuses HF's projections (``stacked_params``: q/k/v -> qkv_proj, gate/up ->
    gate_up_proj); the LM head is never a target.
    """
    unfused = {fused: [] for fused, _ in getattr(model, "stacked_params", {}).values()}
    for fragment, (fused, shard) in getattr(model, "stacked_params", {}).items():
        unfused[fused].append((fragment, shard))
    found = {}
    for name, module in model.named_modules():
        if not isinstance(module, (LinearBase, QuantizedLinear)) or name.endswith("lm_head"):
            continue
        parent, _, leaf = name.rpartition(".")
        for fragment, shard in unfused.get(leaf, [(leaf, None)]):
            found[f"{parent}.{fragment}"] = (name, shard)
    return found


def shard_slices(layer: nn.Module) -> dict[object, tuple[int, int]]:
    """A float layer computes them; a quantized stand-in keeps the float layer's as a dict."""
    slices = layer.shard_slices
    return slices() if callable(slices) else slices


def projection_shapes(model: nn.Module) -> dict[str, tuple[int, int]]:
    """PEFT module name -> (input, output) features of the whole projection, as the adapter holds
    it: a tensor-parallel rank's layer has 1/tp of its inputs (row-parallel) or outputs (column-parallel)."""
    shapes = {}
    for name, (layer_name, shard) in projections(model).items():
        layer = model.get_submodule(layer_name)
        inputs, outputs = layer.input_size, shard_slices(layer)[shard][1]
        shapes[name] = (inputs * tp_size() if layer.tp_dim == 1 else inputs,
                        outputs * tp_size() if layer.tp_dim == 0 else outputs)
    return shapes
