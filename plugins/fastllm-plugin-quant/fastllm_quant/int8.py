"""``weight_only_int8`` (alias ``ifq``): W8A16, symmetric int8 with one scale per output channel.

Weights take half the bytes of 16-bit ones; activations stay in the model dtype, so decode
reads half the bytes and the arithmetic is the float GEMM's.
"""

from __future__ import annotations

import torch
from fastllm_kernels.quant import int8_linear

from fastllm.layers.linear import LinearBase
from fastllm.quantization import LinearSpec, QuantizedLinear, Quantizer


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` float -> (int8 codes, float32 scale per row) with ``w ~ q * scale``."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


class WeightOnlyInt8Linear(QuantizedLinear):
    """``qweight`` int8 ``[N, K]``, ``scales`` ``[N]`` in the model dtype."""

    def __init__(self, spec: LinearSpec):
        super().__init__(spec)
        self.add_tensor("qweight", spec.empty(spec.input_size, dtype=torch.int8))
        self.add_tensor("scales", spec.empty())

    @classmethod
    def from_float(cls, layer: LinearBase) -> "WeightOnlyInt8Linear":
        module = cls(LinearSpec.of(layer))
        module.copy_bias(layer)
        qweight, scales = quantize_int8(layer.weight.data)
        module.qweight.data.copy_(qweight)
        module.scales.data.copy_(scales)
        return module

    def apply_weights(self, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, self.qweight, self.scales)


class WeightOnlyInt8Quantizer(Quantizer):
    name = "weight_only_int8"

    def quantize_layer(self, layer: LinearBase) -> WeightOnlyInt8Linear:
        return WeightOnlyInt8Linear.from_float(layer)

    def checkpoint_layer(self, layer: LinearBase) -> WeightOnlyInt8Linear:
        return WeightOnlyInt8Linear(LinearSpec.of(layer))
