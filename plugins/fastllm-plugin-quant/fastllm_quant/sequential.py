"""Quantize a model one decoder layer at a time, each calibrated on the outputs of the layers
before it as already quantized (GPTQ's sequential scheme), so errors do not compound unseen.

One calibration pass through the engine records the first decoder layer's inputs of every
step together with the step's attention context (metadata, KV caches, backend). Each layer is
then replayed on those inputs outside the engine: once in float, with hooks that sum
``X^T X`` at every linear layer's input; then its linear layers are swapped for quantized
ones, and it runs again to give the next layer its inputs. Steps replay in their original
order, so every chunk of a prompt reads, from the layer's cache, keys and values this replay
wrote for the chunks before it.

Decoder layers follow fastllm's model convention (nano-vllm's): ``layer(positions, hidden,
residual) -> (hidden, residual)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from fastllm.attention.metadata import ForwardContext, forward_context, get_forward_context
from fastllm.layers.linear import LinearBase
from fastllm.quantization import Calibration, replace_linear_layers

# (linear layer, Hessian 2 X^T X / n of its calibration inputs) -> its quantized replacement
QuantizeWithHessian = Callable[[LinearBase, torch.Tensor], nn.Module]


@dataclass
class LayerInput:
    """One engine step's arguments to a decoder layer, and the attention context they ran in."""

    args: tuple
    context: ForwardContext


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of decoder layers: the first ``ModuleList`` whose blocks hold linear layers."""
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) and all(
                any(isinstance(m, LinearBase) for m in block.modules()) for block in module):
            return module
    raise ValueError(f"{type(model).__name__} has no list of decoder layers with linear layers to quantize")


def capture_inputs(layer: nn.Module, calibrate: Calibration) -> list[LayerInput]:
    """Run the calibration prompts through the engine, keeping ``layer``'s inputs of every step."""
    steps: list[LayerInput] = []

    def hook(module: nn.Module, args: tuple) -> None:
        steps.append(LayerInput(tuple(a.clone() if torch.is_tensor(a) else a for a in args),
                                get_forward_context()))

    handle = layer.register_forward_pre_hook(hook)
    try:
        calibrate()
    finally:
        handle.remove()
    if not steps:
        raise ValueError("calibration ran no tokens through the model")
    return steps


def replay(layer: nn.Module, step: LayerInput) -> LayerInput:
    """``layer`` on one step's inputs (copied: layers may update them in place) -> the next layer's."""
    args = tuple(a.clone() if torch.is_tensor(a) else a for a in step.args)
    with forward_context(step.context):
        hidden, residual = layer(*args)
    return LayerInput((args[0], hidden, residual), step.context)


def input_hessians(layer: nn.Module, steps: list[LayerInput]) -> dict[str, torch.Tensor]:
    """``2 X^T X / n`` of the inputs of each linear layer in ``layer``, over every step."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def observer(name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            x = args[0].reshape(-1, args[0].shape[-1]).float()
            sums[name] = sums[name].addmm_(x.t(), x) if name in sums else x.t() @ x
            counts[name] = counts.get(name, 0) + x.shape[0]
        return hook

    handles = [module.register_forward_pre_hook(observer(name)) for name, module in layer.named_modules()
               if isinstance(module, LinearBase)]
    try:
        for step in steps:
            replay(layer, step)
    finally:
        for handle in handles:
            handle.remove()
    return {name: total * (2.0 / counts[name]) for name, total in sums.items()}


@torch.no_grad()
def quantize_sequentially(model: nn.Module, calibrate: Calibration, quantize: QuantizeWithHessian) -> None:
    """Swap every linear layer of ``model``'s decoder layers for ``quantize(layer, hessian)``."""
    layers = decoder_layers(model)
    steps = capture_inputs(layers[0], calibrate)
    for index, layer in enumerate(layers):
        hessians = input_hessians(layer, steps)
        missing = [name for name, m in layer.named_modules() if isinstance(m, LinearBase) and name not in hessians]
        if missing:
            raise ValueError(f"calibration never reached layer {index}'s {missing[0]}")
        replace_linear_layers(layer, lambda name, linear: quantize(linear, hessians.pop(name)))
        if index + 1 < len(layers):
            steps = [replay(layer, step) for step in steps]
