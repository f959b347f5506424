"""``smooth_quant``: SmoothQuant W8A8 int8 (Xiao et al.), made offline by ``fastllm quantize``.

Activation outliers sit in a few input channels. Per input channel ``j`` a factor
``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` moves part of that range into the weights
(``x W^T = (x / s)(W s)^T``); the weights are then int8 per output channel and the smoothed
activations int8 per token at run time, and the product is an int8 GEMM with int32 sums.
The statistics ``max|X_j|`` need calibration prompts, so online use without a checkpoint fails.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from fastllm.layers.linear import LinearBase
from fastllm.quantization import Calibration, LinearSpec, QuantizedLinear, Quantizer, replace_linear_layers

from fastllm_quant.int8 import quantize_int8
from fastllm_quant.loudness import observe_linear_inputs

DEFAULT_ALPHA = 0.8  # the seed's default for Llama


def quantize_int8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[M, K]`` float -> (int8 ``[M, K]``, float32 scale ``[M, 1]``)."""
    scale = (x.abs().amax(dim=-1, keepdim=True) / 127.0).clamp(min=1e-12)
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


def int8_matmul(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """int8 ``a [M, K]`` times int8 ``b_t [N, K]`` transposed, exact int32 sums.

    cuBLAS's int8 GEMM takes only more than 16 rows: smaller batches are padded.
    """
    rows = a.shape[0]
    if a.is_cuda and rows <= 16:
        a = torch.cat([a, a.new_zeros(17 - rows, a.shape[1])])
    return torch._int_mm(a, b_t.t())[:rows]


class SmoothQuantLinear(QuantizedLinear):
    """``qweight`` int8 ``[N, K]`` of ``W * smooth``, ``scales`` float32 ``[N]``, ``smooth`` ``[K]``."""

    def __init__(self, spec: LinearSpec):
        super().__init__(spec)
        self.add_tensor("qweight", spec.empty(spec.input_size, dtype=torch.int8))
        self.add_tensor("scales", spec.empty(dtype=torch.float32))
        self.add_tensor("smooth", torch.empty(spec.input_size, dtype=torch.float32, device=spec.device),
                        layout="input")

    @classmethod
    def from_float(cls, layer: LinearBase, input_absmax: torch.Tensor, alpha: float) -> "SmoothQuantLinear":
        module = cls(LinearSpec.of(layer))
        module.copy_bias(layer)
        weight = layer.weight.data.float()
        weight_absmax = weight.abs().amax(dim=0).clamp(min=1e-5)
        smooth = (input_absmax.clamp(min=1e-5) ** alpha / weight_absmax ** (1 - alpha)).clamp(min=1e-5)
        qweight, scales = quantize_int8(weight * smooth)
        module.qweight.data.copy_(qweight)
        module.scales.data.copy_(scales)
        module.smooth.data.copy_(smooth)
        return module

    def apply_weights(self, x: torch.Tensor) -> torch.Tensor:
        x_q, x_scale = quantize_int8_rows(x.float() / self.smooth)
        return (int8_matmul(x_q, self.qweight).float() * x_scale * self.scales).to(x.dtype)


def observe_input_absmax(model: nn.Module, calibrate: Calibration) -> dict[str, torch.Tensor]:
    """Run ``calibrate`` and keep each linear layer's per-input-channel max |x|."""
    absmax: dict[str, torch.Tensor] = {}

    def observe(name: str, x: torch.Tensor) -> None:
        peak = x.abs().amax(dim=0).float()
        absmax[name] = torch.maximum(absmax[name], peak) if name in absmax else peak

    observe_linear_inputs(model, calibrate, observe)
    return absmax


class SmoothQuantQuantizer(Quantizer):
    name = "smooth_quant"

    def quantize_model(self, model: nn.Module, calibrate: Optional[Calibration] = None) -> None:
        if self.prequantized:
            return super().quantize_model(model)
        if calibrate is None:
            raise ValueError("smooth_quant needs activation statistics from calibration prompts: make a "
                             "checkpoint with `fastllm quantize --quant-type smooth_quant` and load that")
        absmax = observe_input_absmax(model, calibrate)
        alpha = float(self.options.get("alpha", DEFAULT_ALPHA))
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"smooth_quant alpha (-sq) must be in [0, 1], got {alpha}")
        missing = [name for name, module in model.named_modules()
                   if isinstance(module, LinearBase) and name not in absmax]
        if missing:
            raise ValueError(f"calibration never ran {missing[0]}: no tokens reached it")
        replace_linear_layers(model, lambda name, layer: SmoothQuantLinear.from_float(layer, absmax[name], alpha))

    def checkpoint_layer(self, layer: LinearBase) -> SmoothQuantLinear:
        return SmoothQuantLinear(LinearSpec.of(layer))

    def checkpoint_config_to_save(self) -> dict:
        return {"quant_method": self.name, "bits": 8, "activation_scheme": "dynamic_per_token",
                "alpha": float(self.options.get("alpha", DEFAULT_ALPHA))}
