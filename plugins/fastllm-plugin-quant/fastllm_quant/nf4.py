"""``nf4`` (alias ``ifq_nf4``): W4A16 NormalFloat4, absmax per block of 64 inputs (QLoRA's format).

The 16 codes are quantiles of a normal distribution, so normally distributed weights spend
the codes where the weights are: better accuracy than uniform int4 at the same bytes.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from fastllm_kernels.quant import NF4_CODES, nf4_linear, pack_int4

from fastllm.layers.linear import LinearBase
from fastllm.quantization import LinearSpec, QuantizedLinear, Quantizer

from fastllm_quant.common import group_size_for

DEFAULT_BLOCK_SIZE = 64


def quantize_nf4(weight: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` float -> (codes ``[N, K]``, absmax ``[N, K/block]``): the nearest NF4 code."""
    w = weight.float().unflatten(1, (-1, block_size))
    absmax = w.abs().amax(dim=-1).clamp(min=1e-12)
    codes = torch.tensor(NF4_CODES, device=w.device)
    midpoints = (codes[1:] + codes[:-1]) / 2
    index = torch.bucketize(w / absmax[..., None], midpoints)
    return index.flatten(1).to(torch.uint8), absmax


class Nf4Linear(QuantizedLinear):
    """``qweight`` ``[N, K/2]`` uint8 (two codes a byte), ``absmax`` ``[N, K/block]``."""

    def __init__(self, spec: LinearSpec, block_size: int):
        super().__init__(spec)
        self.block_size = group_size_for(spec.input_size, block_size)
        blocks = spec.input_size // self.block_size
        self.add_tensor("qweight", spec.empty(spec.input_size // 2, dtype=torch.uint8))
        self.add_tensor("absmax", spec.empty(blocks))

    @classmethod
    def from_float(cls, layer: LinearBase, block_size: int) -> "Nf4Linear":
        module = cls(LinearSpec.of(layer), block_size)
        module.copy_bias(layer)
        codes, absmax = quantize_nf4(layer.weight.data, module.block_size)
        module.qweight.data.copy_(pack_int4(codes))
        module.absmax.data.copy_(absmax)
        return module

    def apply_weights(self, x: torch.Tensor) -> torch.Tensor:
        return nf4_linear(x, self.qweight, self.absmax, self.block_size)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, block_size={self.block_size}"


class Nf4Quantizer(Quantizer):
    name = "nf4"

    def __init__(self, checkpoint_config: Optional[dict[str, Any]] = None, **options: Any):
        super().__init__(checkpoint_config, **options)
        self.block_size = int((checkpoint_config or {}).get("block_size", DEFAULT_BLOCK_SIZE))

    def quantize_layer(self, layer: LinearBase) -> Nf4Linear:
        return Nf4Linear.from_float(layer, self.block_size)

    def checkpoint_layer(self, layer: LinearBase) -> Nf4Linear:
        return Nf4Linear(LinearSpec.of(layer), self.block_size)

    def checkpoint_config_to_save(self) -> dict[str, Any]:
        return {"quant_method": self.name, "bits": 4, "block_size": self.block_size}
