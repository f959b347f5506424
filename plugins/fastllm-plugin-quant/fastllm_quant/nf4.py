"""``nf4`` (alias ``ifq_nf4``): W4A16 NormalFloat4, absmax per block of 32 inputs (QLoRA's
format at half its block size; ``block_size=64`` gives QLoRA's own).

The 16 codes are quantiles of a normal distribution, so normally distributed weights spend
the codes where the weights are: better accuracy than uniform int4 at the same bytes. Online,
each block's scale fit weighs its weights by their inputs' loudness (``loudness``), squared.
Quantizing online, MoE models' routed experts become nf4 too (``experts``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn as nn
from fastllm_kernels.quant import NF4_CODES, nf4_linear, pack_int4

from fastllm.layers.linear import LinearBase
from fastllm.quantization import Calibration, LinearSpec, QuantizedLinear

from fastllm_quant.common import group_size_for, option
from fastllm_quant.experts import expect_four_bit_experts, quantize_four_bit_experts
from fastllm_quant.loudness import InputAwareQuantizer, per_group
from fastllm_quant.scale_search import by_row_slices, fit_scale

# Blocks of 32, not QLoRA's 64: the perplexity target needs them, on held-out text too, for a
# quarter bit more a weight (figures: benchmarks/RESULTS.md).
DEFAULT_BLOCK_SIZE = 32
# The block fits weigh each weight's error by its input's relative mean square to this power.
# 1 would be the layer's output error (the Hessian's diagonal), but a block's only free
# parameter is its scale, and that optimum trades the loud inputs' weights for the many quiet
# ones, as clipping does (which raised perplexity too). Squared, the loud inputs' weights are
# kept closer. int4's affine fit has a zero point too and gets worse squared: nf4's alone.
LOUDNESS_POWER = 2.0


def quantize_nf4(weight: torch.Tensor, block_size: int, loudness: Optional[torch.Tensor] = None,
                 loudness_power: float = LOUDNESS_POWER) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` float -> (codes ``[N, K]``, scales ``[N, K/block]``): nearest NF4 codes.

    The scale (stored as ``absmax``, its name in QLoRA's format) starts at the block's absmax
    and is refitted for the lowest weight error, each weight's error weighted by its input's
    ``loudness`` ``[K]`` to ``loudness_power`` where given; shrinking it to clip the largest
    weights lowers that error but costs perplexity, so no smaller start is tried.
    """
    codebook = torch.tensor(NF4_CODES, device=weight.device)
    midpoints = (codebook[1:] + codebook[:-1]) / 2
    weights = per_group(None if loudness is None else loudness.float().pow(loudness_power), block_size,
                        weight.device)

    def fit(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = rows.float().unflatten(1, (-1, block_size))
        scales = fit_scale(w, lambda x: codebook[torch.bucketize(x, midpoints)], 1.0, (1.0,), weights)
        return torch.bucketize(w / scales, midpoints).flatten(1).to(torch.uint8), scales.squeeze(-1)

    return by_row_slices(weight, fit)


class Nf4Linear(QuantizedLinear):
    """``qweight`` ``[N, K/2]`` uint8 (two codes a byte), ``absmax`` ``[N, K/block]``."""

    def __init__(self, spec: LinearSpec, block_size: int):
        super().__init__(spec)
        self.block_size = group_size_for(spec.input_size, block_size)
        blocks = spec.input_size // self.block_size
        self.add_tensor("qweight", spec.empty(spec.input_size // 2, dtype=torch.uint8))
        self.add_tensor("absmax", spec.empty(blocks))

    @classmethod
    def from_float(cls, layer: LinearBase, block_size: int, loudness: Optional[torch.Tensor] = None) -> "Nf4Linear":
        module = cls(LinearSpec.of(layer), block_size)
        module.copy_bias(layer)
        codes, scales = quantize_nf4(layer.weight.data, module.block_size, loudness)
        module.qweight.data.copy_(pack_int4(codes))
        module.absmax.data.copy_(scales)
        return module

    def apply_weights(self, x: torch.Tensor) -> torch.Tensor:
        return nf4_linear(x, self.qweight, self.absmax, self.block_size)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, block_size={self.block_size}"


class Nf4Quantizer(InputAwareQuantizer):
    name = "nf4"

    def __init__(self, checkpoint_config: Optional[dict[str, Any]] = None, **options: Any):
        super().__init__(checkpoint_config, **options)
        self.block_size = option(self, "block_size", DEFAULT_BLOCK_SIZE)

    def prepare_model(self, model: nn.Module) -> None:
        super().prepare_model(model)
        if self.prequantized:
            expect_four_bit_experts(model, self.block_size, NF4_CODES)

    def quantize_model(self, model: nn.Module, calibrate: Optional[Calibration] = None) -> None:
        """Every linear layer, then (quantizing online) the routed experts of each MoE layer."""
        super().quantize_model(model, calibrate)
        if not self.prequantized:
            quantize_four_bit_experts(model, quantize_nf4, self.block_size, NF4_CODES)

    def quantize_layer(self, layer: LinearBase, loudness: Optional[torch.Tensor] = None) -> Nf4Linear:
        return Nf4Linear.from_float(layer, self.block_size, loudness)

    def checkpoint_layer(self, layer: LinearBase) -> Nf4Linear:
        return Nf4Linear(LinearSpec.of(layer), self.block_size)

    def checkpoint_config_to_save(self) -> dict[str, Any]:
        return {"quant_method": self.name, "bits": 4, "block_size": self.block_size}
