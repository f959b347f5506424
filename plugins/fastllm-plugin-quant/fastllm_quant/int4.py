"""``weight_only_int4``: W4A16, asymmetric int4 with a scale and zero point per group of 64 inputs.

The group size is the ``group_size`` option (``quantization_config`` for saved checkpoints).
Online, each group's fit weighs its weights by their inputs' loudness (``loudness``). Groups of
64 rather than 128: the perplexity target needs them, for a quarter bit more a weight and a
little decode speed (figures: benchmarks/RESULTS.md).

The same module runs AWQ and GPTQ checkpoints once they are repacked (``checkpoint_int4``).
Quantizing online, MoE models' routed experts become int4 too (``experts``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn as nn
from fastllm_kernels.quant import int4_linear, pack_int4

from fastllm.layers.linear import LinearBase
from fastllm.quantization import Calibration, LinearSpec, QuantizedLinear

from fastllm_quant.common import group_size_for, option
from fastllm_quant.experts import expect_four_bit_experts, quantize_four_bit_experts
from fastllm_quant.loudness import InputAwareQuantizer, per_group
from fastllm_quant.scale_search import by_row_slices, fit_affine

DEFAULT_GROUP_SIZE = 64


def quantize_int4(weight: torch.Tensor, group_size: int, loudness: Optional[torch.Tensor] = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[N, K]`` float -> (codes 0..15 ``[N, K]``, scales, zeros ``[N, K/group]``), w ~ (q - z) * s.

    Scale and (real-valued) zero point are searched per group for the lowest weight error,
    each weight's error weighted by its input's ``loudness`` ``[K]`` where given.
    """
    weights = per_group(loudness, group_size, weight.device)

    def fit(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        codes, scales, zeros = fit_affine(rows.float().unflatten(1, (-1, group_size)), 15, weights)
        return codes.flatten(1).to(torch.uint8), scales, zeros

    return by_row_slices(weight, fit)


class Int4Linear(QuantizedLinear):
    """``qweight`` ``[N, K/2]`` uint8 (two codes a byte), ``scales``/``zeros`` ``[N, K/group]``.

    ``input_perm`` (GPTQ act-order checkpoints only) reorders the input channels so that each
    group is contiguous.
    """

    def __init__(self, spec: LinearSpec, group_size: int):
        super().__init__(spec)
        self.group_size = group_size_for(spec.input_size, group_size)
        groups = spec.input_size // self.group_size
        self.add_tensor("qweight", spec.empty(spec.input_size // 2, dtype=torch.uint8))
        self.add_tensor("scales", spec.empty(groups))
        self.add_tensor("zeros", spec.empty(groups))
        self.register_buffer("input_perm", None)

    def set_weights(self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> "Int4Linear":
        self.qweight.data.copy_(pack_int4(codes))
        self.scales.data.copy_(scales)
        self.zeros.data.copy_(zeros)
        return self

    @classmethod
    def from_float(cls, layer: LinearBase, group_size: int, loudness: Optional[torch.Tensor] = None) -> "Int4Linear":
        module = cls(LinearSpec.of(layer), group_size)
        module.copy_bias(layer)
        return module.set_weights(*quantize_int4(layer.weight.data, module.group_size, loudness))

    def apply_weights(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_perm is not None:
            x = x[:, self.input_perm]
        return int4_linear(x, self.qweight, self.scales, self.zeros, self.group_size)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group_size={self.group_size}"


class WeightOnlyInt4Quantizer(InputAwareQuantizer):
    name = "weight_only_int4"

    def __init__(self, checkpoint_config: Optional[dict[str, Any]] = None, **options: Any):
        super().__init__(checkpoint_config, **options)
        self.group_size = option(self, "group_size", DEFAULT_GROUP_SIZE)

    def prepare_model(self, model: nn.Module) -> None:
        super().prepare_model(model)
        if self.prequantized:
            expect_four_bit_experts(model, self.group_size)

    def quantize_model(self, model: nn.Module, calibrate: Optional[Calibration] = None) -> None:
        """Every linear layer, then (quantizing online) the routed experts of each MoE layer."""
        super().quantize_model(model, calibrate)
        if not self.prequantized:
            quantize_four_bit_experts(model, quantize_int4, self.group_size)

    def quantize_layer(self, layer: LinearBase, loudness: Optional[torch.Tensor] = None) -> Int4Linear:
        return Int4Linear.from_float(layer, self.group_size, loudness)

    def checkpoint_layer(self, layer: LinearBase) -> Int4Linear:
        return Int4Linear(LinearSpec.of(layer), self.group_size)

    def checkpoint_config_to_save(self) -> dict[str, Any]:
        return {"quant_method": self.name, "bits": 4, "group_size": self.group_size}
